"""The tiny-kernel sweep: K = 1..4096 tiny kernels in a row, eager (torch, Triton, CuPy) and as one graph.

Eager cost is host wall time from a synchronize to a synchronize; graph cost is a replayed capture()
timed with bench() on CUDA events. Each series is fitted to T(K) = fixed + per_launch * K.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from gpuspeed import graphs, timing
from gpuspeed.device import why_cpu
from gpuspeed.launch.fit import fit_linear

TINY_N = 1024  # elements of a "tiny" kernel: launch cost, not work

Progress = Callable[[str], None]


def err_text(exc: BaseException) -> str:
    """`Type: first line of the message`, for a row's error field."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def wall_time(launch: Callable[[], object], k: int, sync: Callable[[], None], repeats: int) -> list[float]:
    """Host wall seconds of `k` back-to-back launches, from a synchronize to a synchronize.

    Not bench(): the issue defines eager launch cost as this host wall time (issue + queue + the final
    wait), while bench() times device events, which would hide host-side launch cost behind queued work.
    """
    for _ in range(k):  # warm: JIT, caches, allocator
        launch()
    sync()
    out = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(k):
            launch()
        sync()
        out.append(time.perf_counter() - t0)
    return out


def _repeats(k: int, per_launch_s: float, budget_s: float) -> int:
    return int(max(5, min(31, budget_s / max(k * per_launch_s, 1e-9))))


def _tiny_backends(where: str, notes: list[str]) -> dict:
    """name -> (launch, sync) for one tiny kernel each: torch op, Triton kernel, CuPy kernel."""
    import torch

    if where != "cuda":
        x = torch.randn(TINY_N)
        notes.append(f"{why_cpu()}: the sweep times CPU torch ops (dispatcher cost); "
                     "Triton, CuPy and graph rows are skipped")
        return {"torch": (lambda: x.add_(1.0), lambda: None)}
    x = torch.randn(TINY_N, device="cuda")
    out = {"torch": (lambda: x.add_(1.0), torch.cuda.synchronize)}
    try:
        kernel = _triton_add()
        y = torch.randn(TINY_N, device="cuda")
        out["triton"] = (lambda: kernel[(1,)](y, TINY_N, BLOCK=TINY_N), torch.cuda.synchronize)
    except Exception as exc:
        notes.append(f"Triton row skipped: {err_text(exc)}")
    try:
        import cupy

        c = cupy.random.standard_normal(TINY_N, dtype=cupy.float32)
        dev = cupy.cuda.Device()
        out["cupy"] = (lambda: cupy.add(c, 1.0, out=c), dev.synchronize)
    except Exception as exc:
        notes.append(f"CuPy row skipped: {err_text(exc)}")
    return out


_TRITON_KERNEL = None


def _triton_add():
    """A one-block Triton kernel that adds 1 in place (built once, lazily: triton is optional)."""
    global _TRITON_KERNEL
    if _TRITON_KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def tiny_add(x_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)

        _TRITON_KERNEL = tiny_add
    return _TRITON_KERNEL


def _adds(k: int):
    """k in-place adds on x: the graph sweep's body."""
    def body(x):
        for _ in range(k):
            x.add_(1.0)
        return x
    body.__name__ = f"adds_{k}"
    return body


def launch_sweep(ks, where: str, budget_s: float, progress: Progress, notes: list[str],
                 rows: list | None = None) -> tuple[list, dict]:
    """Rows and fits of the tiny-kernel sweep. `rows`: the list each row goes into as it is measured (the caller's,
    so that a run stopped part-way keeps them)."""
    import torch

    rows = [] if rows is None else rows
    fits: dict = {}
    est = 10e-6 if where == "cuda" else 3e-6
    for name, (launch, sync) in _tiny_backends(where, notes).items():
        ks_ok, meds = [], []
        for k in ks:
            progress(f"sweep {name} K={k}")
            row = {"study": "sweep", "variant": f"eager-{name}", "K": k, "clock": "host wall"}
            try:
                samples = wall_time(launch, k, sync, _repeats(k, est, budget_s))
                med = float(np.median(samples))
                row |= {"time_s": med, "us_per_launch": med / k * 1e6, "n": len(samples),
                        "rel_iqr": float(np.subtract(*np.percentile(samples, [75, 25])) / med)}
                ks_ok.append(k)
                meds.append(med)
            except Exception as exc:
                row["error"] = err_text(exc)
            rows.append(row)
        if len(ks_ok) >= 2:
            fits[f"eager-{name}"] = fit_linear(ks_ok, meds)
        else:
            notes.append(_no_fit(f"eager-{name}", ks_ok))
    if where != "cuda":
        return rows, fits

    ks_ok, meds = [], []
    x = torch.randn(TINY_N, device="cuda")
    for k in ks:
        progress(f"sweep graph K={k}")
        row = {"study": "sweep", "variant": "graph", "K": k, "clock": "cuda events"}
        try:
            g = graphs.capture(_adds(k), x)
            m = timing.bench(g.replay, name=f"graph K={k}", device="cuda", mode="events", flush=False,
                             budget_s=budget_s)
            row |= {"time_s": m.median, "us_per_launch": m.median / k * 1e6, "n": m.n, "rel_iqr": m.rel_iqr,
                    "rel_noise": m.rel_noise, "throttled": m.throttled,
                    "unreliable": bool(getattr(m, "unreliable", False))}
            ks_ok.append(k)
            meds.append(m.median)
            del g
        except Exception as exc:
            row["error"] = err_text(exc)
        rows.append(row)
    if len(ks_ok) >= 2:
        fits["graph"] = fit_linear(ks_ok, meds)
    else:
        notes.append(_no_fit("graph", ks_ok))
    return rows, fits


def _no_fit(series: str, ks_ok: list) -> str:
    """Why a series has no per-launch figure: the fit T(K) = fixed + per_launch*K needs two K values."""
    return (f"{series}: no fit of the per-launch cost (its summary figures are null): it needs at least two K values "
            f"that ran, got {len(ks_ok)}" + (f" (K={ks_ok[0]}; see its row)" if ks_ok else "") +
            ": pass more --ks")
