"""The arithmetic-intensity sweep: one Triton kernel family whose FLOPs per byte is a parameter.

Each element is read once, put through F floating-point operations in fp32 on the CUDA cores (one add for
F = 1, else F/2 chained FMAs) and written once, so intensity = F / (2 x element size): 0.25 to 256
FLOP/byte for fp32 (F = 2 ... 2048) and bf16 storage (F = 1 ... 1024). The curve traces the achievable
roofline of CUDA-core code, from the bandwidth roof to the FP32 FMA ceiling; its ridge comes from
gpuspeed.roofline.model.ridge_from_curve.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from gpuspeed.errors import one_line
from gpuspeed.roofline.model import ridge_from_curve
from gpuspeed.timing import bench
from gpuspeed.verify import check, poison

SWEEP_A, SWEEP_B = 0.9999, 1e-4  # x -> a x + b stays bounded near 1
BLOCK, WARPS = 4096, 8  # 16 elements (independent chains) per thread
AI_LO, AI_HI = 0.25, 256.0


def flops_list(elem_bytes: int) -> list[int]:
    """FLOPs per element giving intensities 0.25, 0.5, ..., 256 for this element size."""
    out, f = [], int(AI_LO * 2 * elem_bytes)
    while f / (2 * elem_bytes) <= AI_HI:
        out.append(f)
        f *= 2
    return out


def reference(x: np.ndarray, flops_per_element: int, a: float, b: float) -> np.ndarray:
    """What the sweep kernel computes, in float64 (a and b as the fp32 values the kernel sees)."""
    a64, b64 = np.float64(np.float32(a)), np.float64(np.float32(b))
    y = x.astype(np.float64)
    if flops_per_element == 1:
        return y + b64
    for _ in range(flops_per_element // 2):
        y = y * a64 + b64
    return y


def sweep_steps(dtypes: list[str], n_elements: int, quick: bool) -> list[tuple[str, Callable[[], dict]]]:
    """(label, fn -> row) for every (dtype, F) point; rows carry ai, flop/s, bytes/s or an error."""
    import torch

    from gpuspeed.roofline import kernels

    torch_dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    bench_options = dict(budget_s=0.4 if quick else 0.6, warmup_s=0.15 if quick else 0.2)
    n = max(n_elements // BLOCK, 1) * BLOCK
    bufs: dict = {}

    def point(dt: str, f: int):
        def run() -> dict:
            dtype = torch_dtypes[dt]
            esize = torch.empty((), dtype=dtype).element_size()
            row = {"dtype": dt, "flops_per_element": f, "ai": f / (2 * esize), "n": n}
            try:
                xs = torch.randn(8 * BLOCK, device="cuda").to(dtype)
                ys = poison(torch.empty_like(xs))
                kernels.launch_sweep(xs, ys, f, SWEEP_A, SWEEP_B, block=BLOCK, num_warps=WARPS)
                ref = torch.from_numpy(reference(xs.float().cpu().numpy(), f, SWEEP_A, SWEEP_B))
                # fp32: up to 1024 chained roundings, so 1e-4; bf16: the output's own rounding dominates
                res = check(ys, ref, rtol=1e-4 if dt == "fp32" else None, dtype=None if dt == "fp32" else "bfloat16")
                row["check"] = res.summary
                if not res.passed:
                    raise AssertionError(res.summary)
                if dt not in bufs:
                    bufs.clear()  # one dtype's buffers at a time
                    x = (torch.rand(n, device="cuda") + 0.5).to(dtype)
                    bufs[dt] = (x, torch.empty_like(x))
                x, y = bufs[dt]
                m = bench(kernels.launch_sweep, x, y, f, SWEEP_A, SWEEP_B, kwargs=dict(block=BLOCK, num_warps=WARPS),
                          name=f"sweep {dt} F={f}", **bench_options)
                nbytes, flops = 2 * x.nbytes, f * n
                row |= {"median_s": m.median, "rel_noise": m.rel_noise, "samples": m.n, "throttled": m.throttled,
                        "bytes": nbytes, "flops": flops, "TFLOPs": flops / m.median / 1e12,
                        "GBps": nbytes / m.median / 1e9}
            except Exception as exc:  # keep the other points
                row["error"] = one_line(exc)
            return row
        return run

    steps = []
    for dt in dtypes:
        esize = 4 if dt == "fp32" else 2
        steps += [(f"AI sweep {dt}, {f / (2 * esize):g} FLOP/B", point(dt, f)) for f in flops_list(esize)]
    steps.append(("free sweep buffers", lambda: bufs.clear()))
    return steps


def ridges(rows: list[dict]) -> dict:
    """Per dtype: the two-roof fit of the measured curve (bandwidth, peak, ridge, knee)."""
    out = {}
    for dt in sorted({r["dtype"] for r in rows}):
        pts = [(r["ai"], r["TFLOPs"] * 1e12, r["GBps"] * 1e9) for r in rows if r["dtype"] == dt and "TFLOPs" in r]
        out[dt] = ridge_from_curve(pts)
    return out
