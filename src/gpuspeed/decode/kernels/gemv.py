"""A split-K GEMV in Triton for batch-1 decode: y[n] = sum_k h[k] W[n, k] with W row-major [N, K] (F.linear's),
with the decode layer's neighbours fused in:

- prologue "norm": h = RMSNorm(x) * weight, computed per program from x (a few KB, from L2), so the norm
  costs no kernel of its own; with one split the statistics accumulate in the GEMV's own loop and 1/rms scales
  the sums at the end (one pass: the weight loads no longer wait for a statistics loop over x; on the H200 the
  two-pass form ran 5-15 % behind cuBLAS on the 1B's QKV and gate/up while the plain forms beat it);
- prologue "silu_mul": h = silu(gate) * up from the fused gate/up output [gate; up];
- epilogue "residual": y = residual + W h.

PDL=1 (programmatic dependent launch, Hopper on; launched with launch_pdl): the kernel lets the next one launch at
once and waits (griddepcontrol.wait) for the previous one only after issuing its first weight tile's loads. The
weights are never written, so a chain of GEMVs streams each one's weights while the one before finishes (measured in
the model: results/nvidia-h200/decode.json, V5's compiled_replay_us against pdl_replay_us). Nothing else may be read
before the wait: a kernel launched early can overlap any number of PDL predecessors, so only data no kernel writes
is safe there.

Rounding follows the eager torch code it replaces (transformers' RMSNorm: normalize in fp32, round to the
model dtype, multiply by the weight in the model dtype; silu rounded before the product; the GEMV rounded
before the residual add), so only the summation order differs from F.linear -- except the one-pass norm,
which keeps x * weight and the 1/rms scale in fp32 (closer to float64 than the eager rounding). Each program reads a
BLOCK_N x K/SPLIT tile of W, contiguous along K, with fp32 sums; SPLIT > 1 writes fp32 partials that a
second step sums (torch ops, fused by inductor). Registered as a torch.library triton_op, so
torch.compile(fullgraph=True) keeps it in its graph. Decode uses it only where choose() measured it faster
than cuBLAS and checked it correct.
"""

import functools
from typing import Optional

import torch

CONFIGS = [  # (BLOCK_N, BLOCK_K, SPLIT, num_warps) tried per shape (K per split is a runtime value: one
    # compile per config and prologue, not per shape)
    (8, 512, 1, 4), (16, 256, 1, 4), (4, 512, 2, 4), (4, 1024, 8, 4),
    # wider K tiles: a bf16 row tile of 512 is 1 KB, half an fp32 one, and the first H200 runs had every bf16 1B
    # shape at 1.3-2.6 TB/s with 8 KB tiles per program (too few bytes in flight per SM); (32, 256, 1, 8),
    # (8, 512, 4, 4) and (16, 256, 4, 4) were never within 10 % of the best and made room for these
    (8, 1024, 1, 4), (4, 2048, 1, 4), (8, 2048, 1, 8), (16, 1024, 1, 8),
]
PROLOGUES = {"none": 0, "norm": 1, "silu_mul": 2}


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def gemv_kernel(x_ptr, w_ptr, out_ptr, nw_ptr, res_ptr, N, K, stride_wn, K_PER_SPLIT, eps,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRO: tl.constexpr, DIRECT: tl.constexpr,
                    RES: tl.constexpr, ONE_PASS: tl.constexpr, PDL: tl.constexpr = 0):
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()  # the next kernel may launch and prefetch its own weights
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        dt = x_ptr.dtype.element_ty
        r = 1.0
        eps = tl.cast(eps, tl.float32)  # inductor passes a Python float as fp64: the norm stays in fp32, as eager's
        if PRO == 1 and not ONE_PASS:  # RMSNorm statistics over the whole row first (x is small and in L2)
            if PDL:
                tl.extra.cuda.gdc_wait()
            ss = tl.zeros([BLOCK_K], dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                xs = tl.load(x_ptr + rk, mask=rk < K, other=0.0).to(tl.float32)
                ss += xs * xs
            r = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        ss1 = tl.zeros([BLOCK_K], dtype=tl.float32)
        kbase = pid_k * K_PER_SPLIT
        for kk in range(0, K_PER_SPLIT, BLOCK_K):
            rk = kbase + kk + tl.arange(0, BLOCK_K)
            km = rk < K
            # the weight tile first: with PDL its loads are in flight before the wait for x's producer
            w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=(rn[:, None] < N) & km[None, :],
                        other=0.0, eviction_policy="evict_first")
            if PDL:
                tl.extra.cuda.gdc_wait()  # returns at once after the first tile
            xk = tl.load(x_ptr + rk, mask=km, other=0.0)
            if PRO == 1 and ONE_PASS:  # W (x * nw) with the statistics in the same loop; 1/rms scales y at the end
                nw = tl.load(nw_ptr + rk, mask=km, other=0.0)
                xf = xk.to(tl.float32)
                ss1 += xf * xf
                h = xf * nw.to(tl.float32)
            elif PRO == 1:
                nw = tl.load(nw_ptr + rk, mask=km, other=0.0)
                hn = (xk.to(tl.float32) * r).to(dt)
                h = (hn.to(tl.float32) * nw.to(tl.float32)).to(dt).to(tl.float32)
            elif PRO == 2:
                up = tl.load(x_ptr + K + rk, mask=km, other=0.0)
                g = xk.to(tl.float32)
                s = (g / (1.0 + tl.exp(-g))).to(dt)
                h = (s.to(tl.float32) * up.to(tl.float32)).to(dt).to(tl.float32)
            else:
                h = xk.to(tl.float32)
            acc += w.to(tl.float32) * h[None, :]
        y = tl.sum(acc, axis=1)
        if ONE_PASS:
            y = y / tl.sqrt(tl.sum(ss1, axis=0) / K + eps)
        if DIRECT:  # one split: round to the model dtype here, add the residual, store
            y = y.to(dt)
            if RES:
                res = tl.load(res_ptr + rn, mask=rn < N, other=0.0)
                y = (y.to(tl.float32) + res.to(tl.float32)).to(dt)
            tl.store(out_ptr + rn, y, mask=rn < N)
        else:
            tl.store(out_ptr + pid_k * N + rn, y, mask=rn < N)

    return gemv_kernel


def pdl_launch(pdl: int) -> dict:
    """The launch option of a PDL=1 kernel (none under the interpreter, which runs no inline PTX)."""
    return {"launch_pdl": True} if pdl else {}


def pdl_supported() -> str:
    """'' where programmatic dependent launch can run here (a GPU of compute capability >= 9, Triton's
    griddepcontrol intrinsics, no interpreter); else why not, in a few words."""
    from gpuspeed.kernel.capture import interpreting_triton

    if interpreting_triton():
        return "Triton's interpreter runs no PTX"
    if not torch.cuda.is_available():
        return "no GPU"
    if torch.cuda.get_device_capability()[0] < 9:
        return f"compute capability {torch.cuda.get_device_capability()} (PDL needs 9.0 or more)"
    try:
        import triton.language as tl

        tl.extra.cuda.gdc_wait  # noqa: B018
    except (ImportError, AttributeError):
        return "this Triton has no griddepcontrol intrinsics"
    return ""


def pdl_usable(pdl: int) -> int:
    """pdl, or 0 under Triton's interpreter (no inline PTX there)."""
    from gpuspeed.kernel.capture import interpreting_triton

    return int(bool(pdl) and not interpreting_triton())


def _launch(x: torch.Tensor, w: torch.Tensor, nw: torch.Tensor | None, res: torch.Tensor | None, eps: float,
            prologue: int, block_n: int, block_k: int, split: int, num_warps: int, pdl: int = 0) -> torch.Tensor:
    """x [K] (or [2K] for silu_mul), w [N, K], nw [K], res [N] -> y [N] in x's dtype (pdl: launched with
    programmatic dependent launch, eager callers only: torch.compile does not pass launch_pdl)."""
    n, k = w.shape
    per = -(-k // split)
    per = -(-per // block_k) * block_k  # whole BLOCK_K tiles per split
    split = -(-k // per)
    direct = split == 1
    out = torch.empty(n, device=x.device, dtype=x.dtype) if direct else \
        torch.empty(split, n, device=x.device, dtype=torch.float32)
    kern = _kernel()
    try:
        from torch.library import wrap_triton

        kern = wrap_triton(kern)
    except ImportError:  # older torch: plain launch (eager only)
        pass
    kern[(-(-n // block_n), split)](
        x, w, out, nw if nw is not None else x, res if res is not None else x, n, k, w.stride(0), per, eps,
        BLOCK_N=block_n, BLOCK_K=block_k, PRO=prologue, DIRECT=int(direct), RES=int(res is not None and direct),
        ONE_PASS=int(prologue == PROLOGUES["norm"] and direct), PDL=pdl_usable(pdl), num_warps=num_warps,
        **pdl_launch(pdl_usable(pdl)))
    if direct:
        return out
    y = out.sum(0).to(x.dtype)
    return y + res if res is not None else y


def _registered():
    """The triton_op (torch >= 2.6) that torch.compile keeps in its graph; the plain launcher where it is absent."""
    try:
        from torch.library import triton_op
    except ImportError:
        return _launch

    @triton_op("gpuspeed::gemv", mutates_args=())
    def gemv_op(x: torch.Tensor, w: torch.Tensor, nw: Optional[torch.Tensor], res: Optional[torch.Tensor], eps: float,
                prologue: int, block_n: int, block_k: int, split: int, num_warps: int, pdl: int) -> torch.Tensor:
        return _launch(x, w, nw, res, eps, prologue, block_n, block_k, split, num_warps, pdl)

    return gemv_op


GEMV_OP = None  # registered at the first eager call (importing torch.library's triton support costs ~1 s)


def registered():
    """The op, registered now if needed. Dynamo will not trace the registration, so the first call must be
    eager: kernels.choose() calls every kernel it selects before any compile."""
    global GEMV_OP
    if GEMV_OP is None:
        GEMV_OP = _registered()
    return GEMV_OP


def gemv(x: torch.Tensor, w: torch.Tensor, block_n: int = 8, block_k: int = 512, split: int = 1,
         num_warps: int = 4, *, norm: torch.Tensor | None = None, eps: float = 1e-5, silu_mul: bool = False,
         residual: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    """F.linear(x, w) for x [..., K] holding one row (x [..., 2K] = [gate; up] with silu_mul=True); the result
    has x's leading shape. norm: RMSNorm weight applied to x first; residual: added to the result; pdl: launch
    with programmatic dependent launch (eager only, on a GPU of compute capability 9 or more)."""
    lead = x.shape[:-1]
    pro = PROLOGUES["norm"] if norm is not None else PROLOGUES["silu_mul"] if silu_mul else PROLOGUES["none"]
    res = residual.reshape(-1).contiguous() if residual is not None else None
    op = GEMV_OP if GEMV_OP is not None else registered()
    y = op(x.reshape(-1).contiguous(), w, norm, res, float(eps), pro, block_n, block_k, split, num_warps, int(pdl))
    return y.reshape(*lead, w.shape[0])
