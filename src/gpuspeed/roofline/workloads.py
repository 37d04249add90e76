"""The built-in workload set placed on the roofline: elementwise, normalization, reduction, matmul, attention.

FLOP conventions for ops FlopCounterMode does not count (it counts matmul, conv and attention): one FLOP
per elementwise operation, sin counted as one; softmax 5 per element (max, subtract, exp, sum, divide),
layer norm 8 (mean 1, variance 3, normalize 2, affine 2), a sum 1. Matmul and attention FLOPs are counted.
GPU sizes are far larger than L2; CPU sizes are at least twice a 32 MiB last-level cache.
"""

from __future__ import annotations

import contextlib
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
    for name in ("fp32", "bf16"):
        d = dt[name]
        out.append(Workload(f"add {name}", "elementwise", name, lambda d=d: (torch.add, (rand(n_el, dtype=d),
                                                                                          rand(n_el, dtype=d))),
                            flops=n_of))
        out.append(Workload(f"sin {name}", "elementwise", name, lambda d=d: (torch.sin, (rand(n_el, dtype=d),)),
                            flops=n_of))
    if gpu:
        def make_chain():
            from gpuspeed.roofline import kernels as K

            x = rand(n_el)
            y = torch.empty_like(x)
            return (lambda x, y: K.launch_chain(x, y, 1.1, 0.2, 0.5, 0.1)), (x, y)
        chain_note = "Triton kernel, one read and one write"
    else:
        def make_chain():
            x = rand(n_el)
            return (lambda x: torch.sin(x * 1.1 + 0.2) * 0.5 + 0.1), (x,)
        chain_note = "eager torch on the CPU (not fused: several passes)"
    # on the GPU y is both an argument and the output: count read x + write y, not y twice
    out.append(Workload("fused chain fp32", "elementwise", "fp32", make_chain, flops=lambda a: 5 * a[0].numel(),
                        nbytes=lambda a: 2 * a[0].numel() * a[0].element_size(),
                        notes=[f"y = sin(x*a + b)*c + d, 5 FLOP/element; {chain_note}"]))
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


def sdpa_flops(args) -> float:
    """4 B H S^2 D: QK^T and PV (FlopCounterMode's own count; used where it counts none, as on the CPU)."""
    q, k = args[0], args[1]
    b, h, s, d = q.shape
    return 4.0 * b * h * s * k.shape[-2] * d
