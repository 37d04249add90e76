"""A split-K GEMV in Triton for batch-1 decode: y[n] = sum_k x[k] W[n, k] with W row-major [N, K] (F.linear's).

Each program reads a BLOCK_N x K/SPLIT tile of W with loads contiguous along K and keeps fp32 partial sums;
with SPLIT > 1 the partials [SPLIT, N] are summed by a second (tiny) reduction. Splitting K raises the
number of programs for the short-and-wide projections of a small model, where one row block per program
leaves most SMs idle. Registered as a torch.library triton_op, so torch.compile(fullgraph=True) keeps it
in its graph. Decode uses it only where choose() measured it faster than cuBLAS and checked it correct.
"""

from __future__ import annotations

import functools

import torch

CONFIGS = [  # (BLOCK_N, BLOCK_K, SPLIT, num_warps) tried per shape (K per split is a runtime value: one
    # compile per config, not per shape)
    (8, 512, 1, 4), (16, 256, 1, 4), (4, 512, 2, 4), (8, 512, 4, 4), (16, 256, 4, 4), (4, 1024, 8, 4),
]


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def gemv_kernel(x_ptr, w_ptr, out_ptr, N, K, stride_wn, K_PER_SPLIT, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        k0 = pid_k * K_PER_SPLIT
        for kk in range(0, K_PER_SPLIT, BLOCK_K):
            rk = k0 + kk + tl.arange(0, BLOCK_K)
            xk = tl.load(x_ptr + rk, mask=rk < K, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K),
                        other=0.0, eviction_policy="evict_first")
            acc += w.to(tl.float32) * xk[None, :]
        tl.store(out_ptr + pid_k * N + rn, tl.sum(acc, axis=1), mask=rn < N)

    return gemv_kernel


def _launch(x: torch.Tensor, w: torch.Tensor, block_n: int, block_k: int, split: int, num_warps: int) -> torch.Tensor:
    """x [K] (contiguous), w [N, K] -> y [N] in x's dtype."""
    n, k = w.shape
    per = -(-k // split)
    per = -(-per // block_k) * block_k  # whole BLOCK_K tiles per split
    split = -(-k // per)
    part = torch.empty(split, n, device=x.device, dtype=torch.float32)
    grid = (-(-n // block_n), split)
    kern = _kernel()
    try:
        from torch.library import wrap_triton

        kern = wrap_triton(kern)
    except ImportError:  # older torch: plain launch (eager only)
        pass
    kern[grid](x, w, part, n, k, w.stride(0), K_PER_SPLIT=per, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps)
    return (part[0] if split == 1 else part.sum(0)).to(x.dtype)


def gemv(x: torch.Tensor, w: torch.Tensor, block_n: int = 8, block_k: int = 512, split: int = 1,
         num_warps: int = 4) -> torch.Tensor:
    """F.linear(x, w) for x [..., K] holding one row; the result has x's leading shape."""
    lead = x.shape[:-1]
    y = _op()(x.reshape(-1).contiguous(), w, block_n, block_k, split, num_warps)
    return y.reshape(*lead, w.shape[0])


@functools.cache
def _op():
    """The triton_op (torch >= 2.6) that torch.compile traces into; the plain launcher where it is absent."""
    try:
        from torch.library import triton_op
    except ImportError:
        return _launch

    @triton_op("gpuspeed::gemv", mutates_args=())
    def gemv_op(x: torch.Tensor, w: torch.Tensor, block_n: int, block_k: int, split: int,
                num_warps: int) -> torch.Tensor:
        return _launch(x, w, block_n, block_k, split, num_warps)

    return gemv_op
