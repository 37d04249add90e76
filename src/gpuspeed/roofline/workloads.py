"""The built-in workload set placed on the roofline: elementwise, normalization, reduction, matmul, attention.

On the GPU the elementwise points (add, sin, the fused chain) are gpuspeed's Triton kernels, written like the
bandwidth ceilings, with torch's own add and sin placed beside them ("torch elementwise"): the first show
what this GPU does for an elementwise stream, the second what torch's kernels get of it (torch's sin
computes in fp32 whatever the output's precision, so it can be instruction-bound: docs/notes/studies.md).

FLOP conventions for ops FlopCounterMode does not count (it counts matmul, conv and attention): one FLOP
per elementwise operation, sin counted as one; softmax 5 per element (max, subtract, exp, sum, divide),
layer norm 8 (mean 1, variance 3, normalize 2, affine 2), a sum 1. Matmul and attention FLOPs are counted.
GPU sizes are far larger than L2; CPU sizes are at least twice a 32 MiB last-level cache.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Workload:
    name: str
    group: str  # elementwise, normalization, reduction, matmul, attention
    dtype: str  # fp32, tf32, bf16
    make: Callable[[], tuple]  # -> (fn, args)
    flops: Callable[[tuple], float] | None = None  # from args; None: counted by FlopCounterMode
    nbytes: Callable[[tuple], int] | None = None  # from args; None: the minimum traffic of args + output
    unit: str | None = None
    precision: str = "highest"  # torch float32 matmul precision while it runs
    notes: list = field(default_factory=list)
    verify: Callable[[], None] | None = None  # raises if the kernel is wrong (run on fresh inputs before timing)


@contextlib.contextmanager
def matmul_precision(precision: str):
    import torch

    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def builtin(device: str, quick: bool, dtypes: list[str] | None = None) -> list[Workload]:
    """The workload set for 'cuda' or 'cpu' (smaller sizes), filtered to `dtypes` (fp32, tf32, bf16)."""
    import torch
    import torch.nn.functional as F

    gpu = device == "cuda"
    dev = "cuda" if gpu else "cpu"
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}
    n_el = (2**26 if quick else 2**28) if gpu else 2**25  # CPU: the size of the bandwidth ceilings
    rows, cols = ((8192, 8192) if quick else (16384, 8192)) if gpu else (4096, 4096)
    mm_sizes = [256, 512, 1024, 2048, 4096, 8192] if gpu else [128, 256, 512]

    def rand(*shape, dtype=torch.float32):
        return (torch.rand(*shape, device=dev) + 0.5).to(dtype)  # never zeros

    def n_of(args):
        return args[0].numel()

    out: list[Workload] = []
    # torch's add and sin: the elementwise points on the CPU, placed beside the Triton kernels on the GPU
    prefix, group = ("torch ", "torch elementwise") if gpu else ("", "elementwise")
    if gpu:
        out += _triton_elementwise(n_el, rand, dt)
    for name in ("fp32", "bf16"):
        d = dt[name]
        out.append(Workload(f"{prefix}add {name}", group, name,
                            lambda d=d: (torch.add, (rand(n_el, dtype=d), rand(n_el, dtype=d))), flops=n_of))
        out.append(Workload(f"{prefix}sin {name}", group, name, lambda d=d: (torch.sin, (rand(n_el, dtype=d),)),
                            flops=n_of))
    if not gpu:
        out.append(Workload("fused chain fp32", "elementwise", "fp32",
                            lambda: ((lambda x: torch.sin(x * 1.1 + 0.2) * 0.5 + 0.1), (rand(n_el),)),
                            flops=lambda a: 5 * a[0].numel(),
                            notes=["y = sin(x*a + b)*c + d, 5 FLOP/element; eager torch on the CPU (not fused: "
                                   "several passes)"]))
    out.append(Workload("softmax fp32", "normalization", "fp32",
                        lambda: ((lambda x: torch.softmax(x, dim=-1)), (rand(rows, cols),)),
                        flops=lambda a: 5 * a[0].numel()))
    out.append(Workload("layer norm fp32", "normalization", "fp32",
                        lambda: ((lambda x, w, b: F.layer_norm(x, (cols,), w, b)),
                                 (rand(rows, cols), rand(cols), rand(cols))),
                        flops=lambda a: 8 * a[0].numel()))
    out.append(Workload("sum fp32", "reduction", "fp32", lambda: (torch.sum, (rand(n_el),)), flops=n_of))
    for n in mm_sizes:
        out.append(Workload(f"mm bf16 {n}", "matmul", "bf16",
                            lambda n=n: (torch.mm, (torch.randn(n, n, device=dev, dtype=torch.bfloat16),
                                                    torch.randn(n, n, device=dev, dtype=torch.bfloat16)))))
        if gpu:
            out.append(Workload(f"mm tf32 {n}", "matmul", "tf32",
                                lambda n=n: (torch.mm, (torch.randn(n, n, device=dev), torch.randn(n, n, device=dev))),
                                precision="high"))
        out.append(Workload(f"mm fp32 {n}", "matmul", "fp32",
                            lambda n=n: (torch.mm, (torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)))))
    b, h, s, hd = (4, 16, 4096, 128) if gpu else (1, 8, 1024, 64)
    adt = torch.bfloat16 if gpu else torch.float32
    out.append(Workload(f"sdpa {'bf16' if gpu else 'fp32'}", "attention", "bf16" if gpu else "fp32",
                        lambda: (F.scaled_dot_product_attention,
                                 tuple(torch.randn(b, h, s, hd, device=dev, dtype=adt) for _ in range(3))),
                        notes=[f"B={b}, H={h}, S={s}, D={hd}, not causal"]))
    if dtypes:
        keep = set(dtypes)
        out = [w for w in out if w.dtype in keep]
    return out


CHAIN = (1.1, 0.2, 0.5, 0.1)  # y = sin(x * a + b) * c + d


def _triton_elementwise(n_el: int, rand, dt: dict) -> list[Workload]:
    """add and sin (fp32, bf16) and the fused chain as gpuspeed Triton kernels: one read per input, one
    write, the output preallocated (an argument, so counted once: nbytes is given)."""
    import torch

    from gpuspeed.roofline import kernels
    from gpuspeed.verify import check, poison

    def verified(op: str, d, coeffs=(1.0, 0.0, 1.0, 0.0)):
        def run():  # fresh values over many scales; sin judged on its own scale (|sin| <= 1)
            for seed in random.sample(range(2**31), 3):
                g = torch.Generator(device="cuda").manual_seed(seed)
                x = torch.randn(64 * kernels.EW_BLOCK, device="cuda", generator=g)
                if op != "chain":  # the chain's fp32 argument x*a+b carries |x| * 2^-24 of rounding: keep |x| small
                    x = x * 10.0 ** torch.randint(-2, 4, x.shape, device="cuda", generator=g)
                x = x.to(d)
                z = torch.randn_like(x) if op == "add" else None
                y = poison(torch.empty_like(x))
                kernels.launch_elementwise(op, x, y, z, coeffs=coeffs)
                x64 = x.double()
                a, b, c, e = (float(torch.tensor(v, dtype=torch.float32)) for v in coeffs)
                ref = (x64 + z.double() if op == "add" else torch.sin(x64 * a + b) * c + e)
                res = check(y, ref) if op == "add" else check(y, ref, atol=1e-6 if d == torch.float32 else 4e-3)
                if not res.passed:
                    raise AssertionError(f"{op}: {res.summary}")
        return run

    out = []
    for name in ("fp32", "bf16"):
        d = dt[name]

        def make_add(d=d):
            x, z = rand(n_el, dtype=d), rand(n_el, dtype=d)
            return (lambda x, z, y: kernels.launch_elementwise("add", x, y, z)), (x, z, torch.empty_like(x))

        def make_sin(d=d):
            x = rand(n_el, dtype=d)
            return (lambda x, y: kernels.launch_elementwise("sin", x, y)), (x, torch.empty_like(x))

        note = "Triton, one read per input and one write, 1024-element tiles, evict_last loads"
        out.append(Workload(f"add {name}", "elementwise", name, make_add, flops=lambda a: a[0].numel(),
                            nbytes=lambda a: 3 * a[0].numel() * a[0].element_size(), notes=[note],
                            verify=verified("add", d)))
        sin_note = "sin in fp32 by libdevice sinf" if name == "fp32" else (
            "sin to bf16 precision (fp32 polynomial after reduction by pi, 2.3e-6 rel; sinf past 2^15)")
        out.append(Workload(f"sin {name}", "elementwise", name, make_sin, flops=lambda a: a[0].numel(),
                            nbytes=lambda a: 2 * a[0].numel() * a[0].element_size(), notes=[note, sin_note],
                            verify=verified("sin", d)))

    def make_chain():
        x = rand(n_el)
        return (lambda x, y: kernels.launch_chain(x, y, *CHAIN)), (x, torch.empty_like(x))

    out.append(Workload("fused chain fp32", "elementwise", "fp32", make_chain, flops=lambda a: 5 * a[0].numel(),
                        nbytes=lambda a: 2 * a[0].numel() * a[0].element_size(),
                        notes=["y = sin(x*a + b)*c + d, 5 FLOP/element; Triton kernel, one read and one write"],
                        verify=verified("chain", torch.float32, CHAIN)))
    return out


def sdpa_flops(args) -> float:
    """4 B H S^2 D: QK^T and PV (FlopCounterMode's own count; used where it counts none, as on the CPU)."""
    q, k = args[0], args[1]
    b, h, s, d = q.shape
    return 4.0 * b * h * s * k.shape[-2] * d
