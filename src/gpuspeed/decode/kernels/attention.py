"""Flash-decoding in Triton: one query token per sequence attends to a long static cache, split over the keys.

Stage 1: program (sequence x KV head, split) takes the G query heads that share that KV head (padded to 16
rows for tl.dot), walks its slice of the keys up to the current length (read from the device position, so
the kernel needs no host value and can live inside a CUDA graph), and keeps an online softmax: partial
outputs and their log-sum-exp. Stage 2 combines the splits with torch ops (a softmax over the split LSEs).
With a 4096-token cache the keys of one head spread over many programs instead of one, which is the point.
Dots run on fp32 operands: exact ("ieee") for fp32 models; tf32 for bf16/fp16, whose values tf32 holds
exactly, so the scores equal 16-bit dots with fp32 accumulation.
"""

import functools
import math

import torch

CHUNK = 256  # keys per split
BLOCK_L = 64  # keys per tile inside a split


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def decode_attn_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, o_ptr, lse_ptr, G, HKV, scale,
                           sq_b, sq_h, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l, n_splits,
                           D: tl.constexpr, G_PAD: tl.constexpr, CHUNK: tl.constexpr, BLOCK_L: tl.constexpr,
                           IEEE: tl.constexpr):
        # inductor passes a Python float argument as fp64 (its signature keeps a float's precision): one
        # fp64 score would make p fp64 and tl.dot(p, v) refuse mixed operands, so the math runs in fp32
        scale = tl.cast(scale, tl.float32)
        bh = tl.program_id(0)
        sp = tl.program_id(1)
        b = bh // HKV
        h = bh % HKV
        rg = tl.arange(0, G_PAD)
        rd = tl.arange(0, D)
        q = tl.load(q_ptr + b * sq_b + (h * G + rg)[:, None] * sq_h + rd[None, :], mask=rg[:, None] < G,
                    other=0.0).to(tl.float32)
        length = tl.load(pos_ptr) + 1
        start = sp * CHUNK
        end = tl.minimum(start + CHUNK, length)
        m_i = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([G_PAD], dtype=tl.float32)
        acc = tl.zeros([G_PAD, D], dtype=tl.float32)
        for l0 in range(start, end, BLOCK_L):
            rl = l0 + tl.arange(0, BLOCK_L)
            valid = rl < end
            k = tl.load(k_ptr + b * sk_b + h * sk_h + rl[:, None] * sk_l + rd[None, :], mask=valid[:, None],
                        other=0.0).to(tl.float32)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            else:
                s = tl.dot(q, tl.trans(k), input_precision="tf32") * scale
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_ptr + b * sv_b + h * sv_h + rl[:, None] * sv_l + rd[None, :], mask=valid[:, None],
                        other=0.0).to(tl.float32)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="tf32")
            m_i = m_new
        empty = l_i == 0.0
        out = acc / tl.where(empty, 1.0, l_i)[:, None]
        lse = tl.where(empty, float("-inf"), m_i + tl.log(tl.where(empty, 1.0, l_i)))
        base = (bh * n_splits + sp) * G_PAD
        tl.store(o_ptr + (base + rg)[:, None] * D + rd[None, :], out)
        tl.store(lse_ptr + base + rg, lse)

    return decode_attn_kernel


def _launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """q [B, H, 1, D]; k/v [B, Hkv, L, D] (the static cache); pos [1] the query's position -> [B, H, 1, D]."""
    b, h, _, d = q.shape
    hkv, cap = k.shape[1], k.shape[2]
    g = h // hkv
    g_pad = max(16, 1 << (g - 1).bit_length())
    n_splits = -(-cap // CHUNK)
    q3 = q.reshape(b, h, d)
    o = torch.empty(b * hkv, n_splits, g_pad, d, device=q.device, dtype=torch.float32)
    lse = torch.empty(b * hkv, n_splits, g_pad, device=q.device, dtype=torch.float32)
    kern = _kernel()
    try:
        from torch.library import wrap_triton

        kern = wrap_triton(kern)
    except ImportError:
        pass
    kern[(b * hkv, n_splits)](q3, k, v, pos, o, lse, g, hkv, 1.0 / math.sqrt(d), q3.stride(0), q3.stride(1),
                              k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), n_splits,
                              D=d, G_PAD=g_pad, CHUNK=CHUNK, BLOCK_L=BLOCK_L, IEEE=int(q.dtype == torch.float32),
                              num_warps=4)
    w = torch.softmax(lse, dim=1)  # splits past the length have lse -inf: weight 0
    out = (o * w[..., None]).sum(1)[:, :g]  # [B*Hkv, G, D]
    return out.reshape(b, h, 1, d).to(q.dtype)


def _registered():
    """The triton_op torch.compile keeps in its graph, or the plain launcher where torch has none."""
    try:
        from torch.library import triton_op
    except ImportError:
        return _launch

    @triton_op("gpuspeed::decode_attention", mutates_args=())
    def decode_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return _launch(q, k, v, pos)

    return decode_attention_op


ATTENTION_OP = None  # registered at the first eager call, as gemv.GEMV_OP


def registered():
    global ATTENTION_OP
    if ATTENTION_OP is None:
        ATTENTION_OP = _registered()
    return ATTENTION_OP


def decode_attention(q, k, v, mask, input_pos):
    """The Options.attention signature: split-K flash-decoding for one query token, SDPA otherwise."""
    if q.shape[2] != 1:
        from gpuspeed.decode.model import attention  # model imports kernels.gemv, not this module: no cycle

        return attention(q, k, v, mask, input_pos)
    op = ATTENTION_OP if ATTENTION_OP is not None else registered()
    return op(q.contiguous(), k, v, input_pos)
