"""Planted workloads with known answers for the profiler.

Each planted line carries a `# PLANTED: <tag>` comment; `planted_line(tag)` finds its number, so tests
and the benchmark never hard-code line numbers. Sizes are parameters: small on the CPU, larger on a GPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

ITEM_SYNCS = 12  # .item() calls per step in item_loop
TINY_KERNELS = 24  # tiny kernels per step in tiny_kernels
WHILE_SYNCS = 4  # evaluations of the while condition per call of scalar_syncs (sums 12, 8, 4, 0)
# planted tag in scalar_syncs -> (kind of host sync, syncs per call)
SCALAR_SYNCS = {"any": ("bool(tensor)", 1), "int": ("int(tensor)", 1), "float": ("float(tensor)", 1),
                "bool": ("bool(tensor)", 1), "while": ("bool(tensor)", WHILE_SYNCS)}


def planted_line(tag: str) -> int:
    """The line number of the `# PLANTED: tag` comment in this file."""
    for i, text in enumerate(Path(__file__).read_text().splitlines(), start=1):
        if text.rstrip().endswith(f"# PLANTED: {tag}"):
            return i
    raise KeyError(tag)


def item_loop(x: torch.Tensor, n: int = ITEM_SYNCS) -> float:
    """Exactly n `.item()` host syncs, one per iteration."""
    total = 0.0
    for i in range(n):
        total += x[i].item()  # PLANTED: item
    return total


def scalar_syncs(x: torch.Tensor) -> float:
    """The commonest host syncs in real code, one of each at a known line: a tensor read as a Python value."""
    total = 0.0
    if (x > 100).any():  # PLANTED: any
        total += 1.0
    total += int(x[0])  # PLANTED: int
    total += float(x[1])  # PLANTED: float
    if bool(x[2] > 0):  # PLANTED: bool
        total += 1.0
    t = torch.full((4,), 3.0, device=x.device)
    while t.sum() > 0:  # PLANTED: while
        t = t - 1.0
    return total


def tiny_kernels(x: torch.Tensor, k: int = TINY_KERNELS) -> torch.Tensor:
    """A run of k tiny in-place kernels on a small tensor: each far shorter than its launch."""
    for _ in range(k):
        x.mul_(0.999)  # PLANTED: tiny
    return x


def transfers(pageable: torch.Tensor, pinned: torch.Tensor):
    """One H2D copy from pageable memory and one from pinned memory, of known sizes."""
    a = pageable.to("cuda")  # PLANTED: pageable
    b = pinned.to("cuda", non_blocking=True)  # PLANTED: pinned
    return a, b


def big_kernel(a: torch.Tensor, b: torch.Tensor, small: torch.Tensor) -> torch.Tensor:
    """One large matrix product that dominates a few small element-wise kernels."""
    c = a @ b  # PLANTED: matmul
    small.add_(1.0)
    small.mul_(0.5)
    return c


def python_hotspot(a: np.ndarray, n: int) -> float:
    """A double Python loop over array elements: the interpreter-bound hotspot at a known line."""
    total = 0.0
    for i in range(n):  # PLANTED: loop
        for j in range(n):
            total += a[i, j] * a[j, i] + 1.0  # PLANTED: hotline
    return total
