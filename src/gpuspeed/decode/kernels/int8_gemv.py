"""A split-K int8 weight-only GEMV in Triton for batch-1 decode: y[n] = scale[n] * sum_k x[k] q[n, k].

q is int8 [N, K] row-major (one symmetric scale per output row, quant.py), x one row in the model's dtype.
Each program loads a BLOCK_N x K/SPLIT tile of q as int8 (half the bytes of bf16: decode is a weight
stream, so the bytes are the time), converts to fp32 in registers and accumulates in fp32; the scale is
applied once per row in the epilogue. SPLIT > 1 writes fp32 partials that a torch sum adds (fused by
inductor under compile). Registered as a torch.library triton_op so torch.compile(fullgraph=True) keeps it
in its graph. quant.choose() uses it per shape only where it measures faster than the compiled
dequantize-then-linear and passes its check.
"""

import functools
from typing import Optional  # noqa: F401  (the op's schema is read from the annotations)

import torch

# (BLOCK_N, BLOCK_K, SPLIT, num_warps, MAGIC): int8 rows want longer K tiles than bf16 for 16-byte loads.
# MAGIC=1 turns each weight into fp32 with an integer add and a bitcast instead of a conversion instruction: per
# the CUDA guide's throughput table an SM retires int -> float conversions at 16 a clock (a quarter of its FMA
# rate), which caps the 8B's 7.5 G weights per token at ~1.8 ms on an H200 (the plain form measured 4.04 ms/token)
# MAGIC=2 does the same with one byte permute a weight (PTX prmt, inline assembly): four weights arrive packed in
# one 32-bit register, one xor flips their sign bits (w + 128 as unsigned bytes) and each prmt places one byte under
# the exponent bits of 2**23, so a weight costs a prmt, an fp32 subtract and its FMA. MAGIC=1 still sign-extends
# each byte to 32 bits before its integer add. On the H200 at 065c26b (results/nvidia-h200/decode_round5/) the
# chooser took MAGIC=2 for the 8B's gate/up (38.6 us, 3.05 TB/s) and down (19.5 us, 3.01 TB/s), MAGIC=1 for QKV.
# MAGIC=2 has no interpreter form (inline PTX): on the CPU it runs as MAGIC=1.
_PLAIN = [(8, 1024, 1, 4), (16, 512, 1, 4), (32, 512, 1, 8), (8, 1024, 2, 4), (16, 1024, 4, 8), (4, 2048, 8, 4)]
_WIDE = [(8, 2048, 1, 8), (16, 2048, 2, 8)]
_PRMT = [(8, 1024, 1, 4), (16, 512, 1, 4), (16, 1024, 1, 8), (32, 512, 1, 8), (8, 2048, 1, 8), (32, 1024, 1, 8),
         (8, 1024, 2, 4), (16, 1024, 2, 8)]
CONFIGS = [c + (0,) for c in _PLAIN] + [c + (1,) for c in _PLAIN + _WIDE] + [c + (2,) for c in _PRMT]

# MAGIC=2's asm (in the kernel): four int8 weights in $4 -> four fp32 2**23 + (w + 128), byte i of q ^ 0x80808080
# placed under the bytes 00 00 4B by prmt selector 0x754i


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def int8_gemv_kernel(x_ptr, q_ptr, s_ptr, out_ptr, N, K, stride_qn, K_PER_SPLIT,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DIRECT: tl.constexpr, MAGIC: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        kbase = pid_k * K_PER_SPLIT
        for kk in range(0, K_PER_SPLIT, BLOCK_K):
            rk = kbase + kk + tl.arange(0, BLOCK_K)
            km = rk < K
            xk = tl.load(x_ptr + rk, mask=km, other=0.0).to(tl.float32)
            w = tl.load(q_ptr + rn[:, None] * stride_qn + rk[None, :], mask=(rn[:, None] < N) & km[None, :],
                        other=0, eviction_policy="evict_first")
            if MAGIC == 2:  # the same value as MAGIC=1's, built by byte permutes from four packed weights
                # the asm is a literal here: inductor compiles user kernels from their source in a subprocess,
                # where a closure constant is not defined (the H200 run at 065c26b failed so)
                wf = tl.inline_asm_elementwise(
                    "{.reg .b32 t, m; xor.b32 t, $4, 0x80808080; mov.b32 m, 0x4B000000; prmt.b32 $0, t, m, 0x7540; "
                    "prmt.b32 $1, t, m, 0x7541; prmt.b32 $2, t, m, 0x7542; prmt.b32 $3, t, m, 0x7543;}",
                    "=r,=r,=r,=r,r", [w], dtype=tl.float32, is_pure=True, pack=4) - 8388736.0
            elif MAGIC:  # 0x4B000080 is 2**23 + 128: w + 128 lands in its mantissa exactly, then 2**23 + 128 goes
                wf = (w.to(tl.int32) + 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0
            else:
                wf = w.to(tl.float32)
            acc += wf * xk[None, :]
        y = tl.sum(acc, axis=1)
        if DIRECT:  # one split: the scale and the rounding to the model dtype here
            s = tl.load(s_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
            tl.store(out_ptr + rn, (y * s).to(out_ptr.dtype.element_ty), mask=rn < N)
        else:
            tl.store(out_ptr + pid_k * N + rn, y, mask=rn < N)

    return int8_gemv_kernel


def _launch(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, block_n: int, block_k: int, split: int,
            num_warps: int, magic: int = 0) -> torch.Tensor:
    """x [K], q [N, K] int8, scale [N] fp32 -> y [N] in x's dtype."""
    n, k = q.shape
    per = -(-k // split)
    per = -(-per // block_k) * block_k  # whole BLOCK_K tiles per split
    split = -(-k // per)
    direct = split == 1
    out = torch.empty(n, device=x.device, dtype=x.dtype) if direct else \
        torch.empty(split, n, device=x.device, dtype=torch.float32)
    from gpuspeed.kernel.capture import interpreting_triton

    if magic == 2 and interpreting_triton():
        magic = 1  # no inline PTX in the interpreter: the same numbers by the integer add
    kern = _kernel()
    try:
        from torch.library import wrap_triton

        kern = wrap_triton(kern)
    except ImportError:  # older torch: plain launch (eager only)
        pass
    kern[(-(-n // block_n), split)](x, q, scale, out, n, k, q.stride(0), per, BLOCK_N=block_n, BLOCK_K=block_k,
                                    DIRECT=int(direct), MAGIC=int(magic), num_warps=num_warps)
    if direct:
        return out
    return (out.sum(0) * scale.float()).to(x.dtype)


def _registered():
    try:
        from torch.library import triton_op
    except ImportError:
        return _launch

    @triton_op("gpuspeed::int8_gemv", mutates_args=())
    def int8_gemv_op(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, block_n: int, block_k: int, split: int,
                     num_warps: int, magic: int) -> torch.Tensor:
        return _launch(x, q, scale, block_n, block_k, split, num_warps, magic)

    return int8_gemv_op


OP = None  # registered at the first eager call (dynamo does not trace the registration)


def registered():
    global OP
    if OP is None:
        OP = _registered()
    return OP


def int8_gemv(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, block_n: int = 8, block_k: int = 1024,
              split: int = 1, num_warps: int = 4, magic: int = 0) -> torch.Tensor:
    """(x @ q.T) * scale for x [..., K] holding one row; the result has x's leading shape and dtype."""
    lead = x.shape[:-1]
    op = OP if OP is not None else registered()
    y = op(x.reshape(-1).contiguous(), q, scale, block_n, block_k, split, num_warps, magic)
    return y.reshape(*lead, q.shape[0])
