"""A split-K int8 weight-only GEMV in Triton for batch-1 decode, y[n] = scale[n] * sum_k h[k] q[n, k], with the same
fused forms as the bf16 GEMV (gemv.py): an RMSNorm or SiLU(gate) * up prologue, a residual epilogue, programmatic
dependent launch.

q is int8 [N, K] row-major (one symmetric scale per output row, quant.py), h one row in the model's dtype. The
kernel reads q as 32-bit words, four weights a word. The register budget is the point: with an int8 tile and an
fp32 accumulator of the tile's shape (the first form of this kernel), a thread held one accumulator register per
weight byte in flight, 178 registers at (8, 1024, 4 warps), two programs an SM, 16 KB of weights in flight an SM
where an H200 needs ~28 KB (4.6 TB/s x ~0.8 us): that kernel stalled at 2.3-3.05 TB/s. Here the four weights of
a word meet their four inputs in one accumulator element, so a thread holds one accumulator register per 4 bytes
(72 registers at the same config: seven programs an SM). That moved the 8B's gate/up from 38.6 to 34.9 us, not to
the ~27 us its bytes need at the read roof: the H200 run at be860d1 showed the kernel bound by instructions a
weight (larger tiles, more warps and a prefetch of the next tile were all slower), hence X64 and AFFINE below.

Each weight turns into fp32 without a conversion instruction (an SM retires int -> float conversions at 16 a clock,
a quarter of its FMA rate): one xor flips the four sign bits of a word (w + 128 as unsigned bytes), and a byte
permute (PTX prmt) places each byte under the exponent bits of 2**23, so a weight costs a prmt, an fp32 subtract
of 2**23 + 128 (exact) and its FMA; AFFINE drops the subtract (CONFIGS' comment). Triton's interpreter runs no
inline PTX: there (ASM=0) the bytes come out by shifts and convert, the same numbers.

SPLIT > 1 writes fp32 partials that a torch sum adds (fused by inductor under compile); the scale is applied once
per row after the sums. Registered as a torch.library triton_op so torch.compile(fullgraph=True) keeps it in its
graph. quant.choose() (through kernels.choose_gemv) uses it per shape only where it measures faster than the
compiled dequantize-then-linear and every fused form passes its check against float64.
"""

import functools
from typing import Optional

import torch

from gpuspeed.decode.kernels.gemv import PROLOGUES, pdl_launch, pdl_usable

# (BLOCK_N, BLOCK_K, SPLIT, num_warps, FORM): BLOCK_K counts weights (BLOCK_K / 4 words a row a tile); FORM's bits:
PREFETCH, X64, AFFINE = 1, 2, 4
# PREFETCH: the next tile's loads go out before this one is summed (the H200 at be860d1: slower at every shape, as were
#   BLOCK_K >= 2048, 8 warps and K splits: the kernel is bound by its instructions a weight, not by loads in flight);
# X64: bf16 inputs read as one 8-byte word per four weights (shifts and masks instead of four 2-byte loads);
# AFFINE: each weight becomes f = 1 + (w + 128) / 2**15 (a prmt under the bits of 1.0, no subtract), the sums of f h
#   and of h run side by side, and sum w h = 2**15 sum f h - (2**15 + 128) sum h at the end: one instruction a weight
#   fewer, for ~4e-4 relative error in the result (the cancellation of 2**15 sum f h against sum h), ten times under
#   a bf16 output's rounding: bf16 and fp16 outputs only (an fp32 output runs the exact form).
CONFIGS = [
    (8, 1024, 1, 4, 0), (8, 512, 1, 4, 0), (16, 512, 1, 4, 0),
    (8, 1024, 1, 4, X64), (8, 512, 1, 4, X64), (16, 512, 1, 4, X64),
    (8, 1024, 1, 4, X64 | AFFINE), (8, 512, 1, 4, X64 | AFFINE), (16, 512, 1, 4, X64 | AFFINE),
    (16, 1024, 1, 8, X64 | AFFINE), (4, 1024, 1, 4, X64 | AFFINE), (8, 1024, 2, 4, X64 | AFFINE | PREFETCH),
]


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def int8_gemv_kernel(x_ptr, q_ptr, s_ptr, out_ptr, nw_ptr, res_ptr, N, K, KW, stride_qn, W_PER_SPLIT, eps,
                         BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, PRO: tl.constexpr, DIRECT: tl.constexpr,
                         RES: tl.constexpr, ONE_PASS: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr,
                         ASM: tl.constexpr, X64: tl.constexpr = 0, AFFINE: tl.constexpr = 0):
        # q_ptr: int32 words, four weights each (byte i of word j is q[n, 4j + i]); KW = K / 4 words a row
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()  # the next kernel may launch and prefetch its own weights
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        nm = (rn < N)[:, None]
        dt = x_ptr.dtype.element_ty
        eps = tl.cast(eps, tl.float32)  # inductor passes a Python float as fp64
        r = 1.0
        if PRO == 1 and not ONE_PASS:  # RMSNorm statistics over the whole row first (x is small and in L2)
            if PDL:
                tl.extra.cuda.gdc_wait()
            ss = tl.zeros([4 * BLOCK_W], dtype=tl.float32)
            for k0 in range(0, K, 4 * BLOCK_W):
                rk = k0 + tl.arange(0, 4 * BLOCK_W)
                xs = tl.load(x_ptr + rk, mask=rk < K, other=0.0).to(tl.float32)
                ss += xs * xs
            r = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)
        acc = tl.zeros([BLOCK_N, BLOCK_W], dtype=tl.float32)
        ss1 = tl.zeros([BLOCK_W], dtype=tl.float32)
        hs = tl.zeros([BLOCK_W], dtype=tl.float32)
        jbase = pid_k * W_PER_SPLIT
        jend = tl.minimum(KW, jbase + W_PER_SPLIT)  # the end of this split's words (the last prefetch reads none)
        if PREFETCH:  # the first tile before the loop (and, with PDL, before the wait: weights are never written)
            rj0 = jbase + tl.arange(0, BLOCK_W)
            w_next = tl.load(q_ptr + rn[:, None] * stride_qn + rj0[None, :], mask=nm & (rj0 < KW)[None, :], other=0,
                             eviction_policy="evict_first")
        for jj in range(0, W_PER_SPLIT, BLOCK_W):
            rj = jbase + jj + tl.arange(0, BLOCK_W)
            jm = rj < KW
            if PREFETCH:  # this tile arrived during the last one's sums; the next one's loads go out now
                w = w_next
                rj2 = rj + BLOCK_W
                w_next = tl.load(q_ptr + rn[:, None] * stride_qn + rj2[None, :], mask=nm & (rj2 < jend)[None, :],
                                 other=0, eviction_policy="evict_first")
            else:
                w = tl.load(q_ptr + rn[:, None] * stride_qn + rj[None, :], mask=nm & jm[None, :], other=0,
                            eviction_policy="evict_first")
            if PDL:
                tl.extra.cuda.gdc_wait()  # returns at once after the first tile
            if ASM and AFFINE:  # four fp32 1 + (w + 128) / 2**15 from one word: the byte under the bits of 1.0
                w0, w1, w2, w3 = tl.inline_asm_elementwise(
                    "{.reg .b32 t, m; xor.b32 t, $4, 0x80808080; mov.b32 m, 0x3F800000; prmt.b32 $0, t, m, 0x7604; "
                    "prmt.b32 $1, t, m, 0x7614; prmt.b32 $2, t, m, 0x7624; prmt.b32 $3, t, m, 0x7634;}",
                    "=r,=r,=r,=r,r", [w], dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True,
                    pack=1)
            elif ASM:  # four fp32 2**23 + (w + 128) from one word: xor the sign bits, then a prmt per byte
                w0, w1, w2, w3 = tl.inline_asm_elementwise(
                    "{.reg .b32 t, m; xor.b32 t, $4, 0x80808080; mov.b32 m, 0x4B000000; prmt.b32 $0, t, m, 0x7540; "
                    "prmt.b32 $1, t, m, 0x7541; prmt.b32 $2, t, m, 0x7542; prmt.b32 $3, t, m, 0x7543;}",
                    "=r,=r,=r,=r,r", [w], dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True,
                    pack=1)
            if X64:  # bf16 inputs: the four of word j are one 8-byte load (positions 4j .. 4j + 3)
                xw = tl.load(x_ptr.to(tl.pointer_type(tl.int64)) + rj, mask=jm, other=0)
                xlo, xhi = xw.to(tl.int32), (xw >> 32).to(tl.int32)
                if PRO == 1:
                    nww = tl.load(nw_ptr.to(tl.pointer_type(tl.int64)) + rj, mask=jm, other=0)
                    nlo, nhi = nww.to(tl.int32), (nww >> 32).to(tl.int32)
                if PRO == 2:
                    uw = tl.load(x_ptr.to(tl.pointer_type(tl.int64)) + KW + rj, mask=jm, other=0)
                    ulo, uhi = uw.to(tl.int32), (uw >> 32).to(tl.int32)
            for i in tl.static_range(4):  # byte i of every word: the inputs at 4j + i
                rk = rj * 4 + i
                if X64:  # a bf16 is the top half of its fp32: shift or mask, then reinterpret
                    if i == 0:
                        xf = (xlo << 16).to(tl.float32, bitcast=True)
                    elif i == 1:
                        xf = (xlo & -65536).to(tl.float32, bitcast=True)
                    elif i == 2:
                        xf = (xhi << 16).to(tl.float32, bitcast=True)
                    else:
                        xf = (xhi & -65536).to(tl.float32, bitcast=True)
                    if PRO == 1:
                        if i == 0:
                            nwf = (nlo << 16).to(tl.float32, bitcast=True)
                        elif i == 1:
                            nwf = (nlo & -65536).to(tl.float32, bitcast=True)
                        elif i == 2:
                            nwf = (nhi << 16).to(tl.float32, bitcast=True)
                        else:
                            nwf = (nhi & -65536).to(tl.float32, bitcast=True)
                    if PRO == 2:
                        if i == 0:
                            upf = (ulo << 16).to(tl.float32, bitcast=True)
                        elif i == 1:
                            upf = (ulo & -65536).to(tl.float32, bitcast=True)
                        elif i == 2:
                            upf = (uhi << 16).to(tl.float32, bitcast=True)
                        else:
                            upf = (uhi & -65536).to(tl.float32, bitcast=True)
                else:
                    xf = tl.load(x_ptr + rk, mask=jm, other=0.0).to(tl.float32)
                    if PRO == 1:
                        nwf = tl.load(nw_ptr + rk, mask=jm, other=0.0).to(tl.float32)
                    if PRO == 2:
                        upf = tl.load(x_ptr + K + rk, mask=jm, other=0.0).to(tl.float32)
                if PRO == 1 and ONE_PASS:  # q (x * nw) with the statistics in the same loop; 1/rms scales y at the end
                    ss1 += xf * xf
                    h = xf * nwf
                elif PRO == 1:
                    hn = (xf * r).to(dt)
                    h = (hn.to(tl.float32) * nwf).to(dt).to(tl.float32)
                elif PRO == 2:
                    s = (xf / (1.0 + tl.exp(-xf))).to(dt)
                    h = (s.to(tl.float32) * upf).to(dt).to(tl.float32)
                else:
                    h = xf
                if AFFINE:  # no subtract a weight: sum_k f h = sum h + 2**-15 sum (w + 128) h, undone at the end
                    hs += h
                    if not ASM:
                        wf = 1.0 + (((w >> (8 * i)) & 0xFF) ^ 0x80).to(tl.float32) * (1.0 / 32768.0)
                    elif i == 0:
                        wf = w0
                    elif i == 1:
                        wf = w1
                    elif i == 2:
                        wf = w2
                    else:
                        wf = w3
                elif ASM:
                    if i == 0:
                        wf = w0 - 8388736.0
                    elif i == 1:
                        wf = w1 - 8388736.0
                    elif i == 2:
                        wf = w2 - 8388736.0
                    else:
                        wf = w3 - 8388736.0
                else:  # the interpreter: byte i sign-extended by two shifts
                    wf = ((w << (24 - 8 * i)) >> 24).to(tl.float32)
                acc += wf * h[None, :]
        y = tl.sum(acc, axis=1)
        if AFFINE:  # sum_k w h = 2**15 sum_k f h - (2**15 + 128) sum_k h
            y = 32768.0 * y - 32896.0 * tl.sum(hs, axis=0)
        if ONE_PASS:
            y = y / tl.sqrt(tl.sum(ss1, axis=0) / K + eps)
        if DIRECT:  # one split: the scale, the rounding to the model dtype and the residual here
            s = tl.load(s_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
            y = (y * s).to(dt)
            if RES:
                res = tl.load(res_ptr + rn, mask=rn < N, other=0.0)
                y = (y.to(tl.float32) + res.to(tl.float32)).to(dt)
            tl.store(out_ptr + rn, y, mask=rn < N)
        else:
            tl.store(out_ptr + pid_k * N + rn, y, mask=rn < N)

    return int8_gemv_kernel


def supported(q: torch.Tensor) -> bool:
    """Whether q can be read as 32-bit words (K a multiple of 4, rows and base 4-byte aligned)."""
    return q.dtype == torch.int8 and q.dim() == 2 and q.shape[1] % 4 == 0 and q.stride(1) == 1 \
        and q.stride(0) % 4 == 0 and q.data_ptr() % 4 == 0


def _launch(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, nw: torch.Tensor | None, res: torch.Tensor | None,
            eps: float, prologue: int, block_n: int, block_k: int, split: int, num_warps: int, form: int,
            pdl: int) -> torch.Tensor:
    """x [K] (or [2K] for silu_mul), q [N, K] int8, scale [N] fp32, nw [K], res [N] -> y [N] in x's dtype."""
    from gpuspeed.kernel.capture import interpreting_triton

    n, k = q.shape
    block_w = block_k // 4
    kw = k // 4
    per = -(-kw // split)
    per = -(-per // block_w) * block_w  # whole tiles per split
    split = -(-kw // per)
    direct = split == 1
    out = torch.empty(n, device=x.device, dtype=x.dtype) if direct else \
        torch.empty(split, n, device=x.device, dtype=torch.float32)
    kern = _kernel()
    try:
        from torch.library import wrap_triton

        kern = wrap_triton(kern)
    except ImportError:  # older torch: plain launch (eager only)
        pass
    pdl = pdl_usable(pdl)
    half = x.dtype in (torch.bfloat16, torch.float16)
    try:  # under torch.compile's tracing there is no address: rows of K % 4 == 0 bf16 start 8-byte aligned
        aligned = x.data_ptr() % 8 == 0 and (nw is None or nw.data_ptr() % 8 == 0)
    except Exception:
        aligned = True
    x64 = int(bool(form & X64) and x.dtype == torch.bfloat16 and (nw is None or nw.dtype == torch.bfloat16) and aligned)
    kern[(-(-n // block_n), split)](
        x, q.view(torch.int32), scale, out, nw if nw is not None else x, res if res is not None else x, n, k, kw,
        q.stride(0) // 4, per, eps, BLOCK_N=block_n, BLOCK_W=block_w, PRO=prologue, DIRECT=int(direct),
        RES=int(res is not None and direct), ONE_PASS=int(prologue == PROLOGUES["norm"] and direct), PDL=pdl,
        PREFETCH=int(bool(form & PREFETCH)), ASM=int(not interpreting_triton()), X64=x64,
        AFFINE=int(bool(form & AFFINE) and half), num_warps=num_warps, **pdl_launch(pdl))
    if direct:
        return out
    y = (out.sum(0) * scale.float()).to(x.dtype)
    return y + res if res is not None else y


def _registered():
    try:
        from torch.library import triton_op
    except ImportError:
        return _launch

    @triton_op("gpuspeed::int8_gemv", mutates_args=())
    def int8_gemv_op(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, nw: Optional[torch.Tensor],
                     res: Optional[torch.Tensor], eps: float, prologue: int, block_n: int, block_k: int, split: int,
                     num_warps: int, form: int, pdl: int) -> torch.Tensor:
        return _launch(x, q, scale, nw, res, eps, prologue, block_n, block_k, split, num_warps, form, pdl)

    return int8_gemv_op


OP = None  # registered at the first eager call (dynamo does not trace the registration)


def registered():
    global OP
    if OP is None:
        OP = _registered()
    return OP


def int8_gemv(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, block_n: int = 8, block_k: int = 1024,
              split: int = 1, num_warps: int = 4, form: int = 0, *, norm: torch.Tensor | None = None,
              eps: float = 1e-5, silu_mul: bool = False, residual: torch.Tensor | None = None,
              pdl: bool = False) -> torch.Tensor:
    """(h @ q.T) * scale for x [..., K] holding one row (x [..., 2K] = [gate; up] with silu_mul=True), h = x, or
    RMSNorm(x) * norm, or silu(gate) * up; plus residual. The result has x's leading shape and dtype."""
    lead = x.shape[:-1]
    pro = PROLOGUES["norm"] if norm is not None else PROLOGUES["silu_mul"] if silu_mul else PROLOGUES["none"]
    res = residual.reshape(-1).contiguous() if residual is not None else None
    op = OP if OP is not None else registered()
    y = op(x.reshape(-1).contiguous(), q, scale, norm, res, float(eps), pro, block_n, block_k, split, num_warps,
           int(form), int(pdl))
    return y.reshape(*lead, q.shape[0])
