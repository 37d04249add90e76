"""The attention half of a decode step as one Triton kernel: RoPE on the new query and key, the key and value
written into the static cache at the device position, and attention of the G query heads of each KV head over
the cache, for one new token per sequence.

Compiled V5 otherwise spends four to five kernels of a layer here (RoPE + cache write, the value's cache write,
the attention bias, SDPA, on smollm2 ~10 us of a ~30 us layer, each a few us of mostly latency); this one reads
the QKV GEMV's output as it lies ([B, 1, q_rows + 2 kv_rows]) and writes the output projection's input
([B, 1, q_rows]). One program per (sequence, KV head) walks the cached keys before the position in tiles with
an online softmax; the new key and value enter from registers, so the program never reads what it has just
written. Short caches only: a long one (thousands of keys) belongs to flash-decoding, split over the keys
(kernels/attention.py); choose() measures which, per cache length.

SPLITS > 1 spreads each KV head's keys over SPLITS programs (chunks of cdiv(pos, SPLITS) keys, balanced at every
position): a program's loads wait on one another, so one program per KV head runs at a few GB/s (tiny fp32: 8
programs, 96 KB each, 10.6 us on the H200; smollm2 bf16: 3 programs, 48 KB each, 4.6 us). Each writes its
partial softmax state (max, sum, weighted values) to a scratch buffer, then takes a ticket from a per-head
counter (an acq_rel atomic after a fence and a CTA barrier); the program that draws the last ticket merges the
partials with the new key's term, writes the output and resets the counter to 0 for the next layer or replay,
so the step stays one kernel. The counter is the static cache's (zeros, persistent across graph replays).

Rounding follows the compiled step it replaces: RoPE in fp32 from the model-dtype inputs, rounded once to the
model dtype (as inductor's fused RoPE kernel does); scores and P.V as tensor-core dots with fp32 accumulation
for 16-bit models, softmax in fp32. fp32 models with up to 8 query heads per KV head compute the products on CUDA
cores (exact fp32 tensor-core dots cost tiny's layer 12.3 us on the H200, against 4.7 us for a bf16 model's);
more query heads per KV head take exact ("ieee") dots.
"""

import functools
import math
from typing import Optional  # noqa: F401  (the op's schema is read from the annotations)

import torch

from gpuspeed.decode.kernels.gemv import pdl_launch, pdl_usable
from gpuspeed.kernel.capture import interpreting_triton

BLOCK_L = 64  # cached keys per tile (before a config's scale)
# (tile scale, num_warps, splits) that choose_step_attention times. One program per KV head (splits 1) ran
# 10.6-11.7 us on tiny fp32 whatever its tile (3 tiles of 64 keys or one of 256: not the tile chain but the bytes
# one program can have in flight), so the keys are also split over 2-8 programs per head, tiles cut to the chunk
CONFIGS = [(1, 4, 1), (2, 4, 1), (2, 8, 1), (4, 8, 1), (1, 4, 2), (1, 4, 4), (1, 4, 8), (1, 2, 4), (1, 2, 8)]


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def step_attn_kernel(qkv_ptr, cos_ptr, sin_ptr, pos_ptr, kc_ptr, vc_ptr, out_ptr, cnt_ptr, part_ptr, ml_ptr,
                         G, HKV, Q_ROWS, KV_ROWS, s_qkv_b, s_c_b, s_c_h, s_c_l, s_out_b, scale,
                         D: tl.constexpr, G_PAD: tl.constexpr, BLOCK_L: tl.constexpr, IEEE: tl.constexpr,
                         DOT: tl.constexpr, SPLITS: tl.constexpr, FENCE: tl.constexpr, PDL: tl.constexpr = 0):
        if PDL:  # launched early (programmatic dependent launch): everything read here may be in flight before
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        scale = tl.cast(scale, tl.float32)  # inductor passes Python floats as fp64: keep the math in fp32
        bh = tl.program_id(0)
        sp = tl.program_id(1)
        b = bh // HKV
        h = bh % HKV
        dt = kc_ptr.dtype.element_ty
        pos = tl.load(pos_ptr)
        rd = tl.arange(0, D)
        partner = tl.where(rd < D // 2, rd + D // 2, rd - D // 2)  # rotate-half: [-x2, x1]
        sign = tl.where(rd < D // 2, -1.0, 1.0)
        cos = tl.load(cos_ptr + pos * D + rd).to(tl.float32)
        sin = tl.load(sin_ptr + pos * D + rd).to(tl.float32)
        src = qkv_ptr + b * s_qkv_b
        # the new key (RoPE) and value, written into the cache at pos
        kx = tl.load(src + Q_ROWS + h * D + rd).to(tl.float32)
        kp = tl.load(src + Q_ROWS + h * D + partner).to(tl.float32)
        k_new = (kx * cos + sign * kp * sin).to(dt)
        v_new = tl.load(src + Q_ROWS + KV_ROWS + h * D + rd)
        dst = b * s_c_b + h * s_c_h + pos * s_c_l
        first = rd + sp * D < D  # split 0 writes the new key and value; no program reads position pos
        tl.store(kc_ptr + dst + rd, k_new, mask=first)
        tl.store(vc_ptr + dst + rd, v_new, mask=first)
        # the G query heads of this KV head (RoPE), padded to G_PAD rows for tl.dot
        rg = tl.arange(0, G_PAD)
        gm = rg < G
        qrow = (h * G + rg)[:, None] * D
        qx = tl.load(src + qrow + rd[None, :], mask=gm[:, None], other=0.0).to(tl.float32)
        qp = tl.load(src + qrow + partner[None, :], mask=gm[:, None], other=0.0).to(tl.float32)
        q = (qx * cos[None, :] + sign[None, :] * qp * sin[None, :]).to(dt)
        m_i = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([G_PAD], dtype=tl.float32)
        acc = tl.zeros([G_PAD, D], dtype=tl.float32)
        base = b * s_c_b + h * s_c_h
        chunk = (pos + SPLITS - 1) // SPLITS  # (tl.cdiv is a jit function: the interpreter needs it imported late)
        lo = sp * chunk
        hi = tl.minimum(lo + chunk, pos)
        for l0 in range(lo, hi, BLOCK_L):  # this program's keys before pos, from the cache
            rl = l0 + tl.arange(0, BLOCK_L)
            valid = rl < hi
            k = tl.load(kc_ptr + base + rl[:, None] * s_c_l + rd[None, :], mask=valid[:, None], other=0.0)
            if not DOT:  # fp32 with few query heads per KV head: CUDA-core products (exact fp32 dots are slow)
                s = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], axis=2) * scale
            elif IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            else:
                s = tl.dot(q, tl.trans(k)) * scale
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(vc_ptr + base + rl[:, None] * s_c_l + rd[None, :], mask=valid[:, None], other=0.0)
            if not DOT:
                acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
            elif IEEE:
                acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(dt), v)
            m_i = m_new
        # the new key, from registers
        s_new = tl.sum(q.to(tl.float32) * k_new.to(tl.float32)[None, :], axis=1) * scale
        if SPLITS == 1:
            m_new = tl.maximum(m_i, s_new)
            alpha = tl.exp(m_i - m_new)
            p_new = tl.exp(s_new - m_new)
            l_i = l_i * alpha + p_new
            acc = acc * alpha[:, None] + p_new[:, None] * v_new.to(tl.float32)[None, :]
            out = acc / l_i[:, None]
            tl.store(out_ptr + b * s_out_b + qrow + rd[None, :], out.to(dt), mask=gm[:, None])
        else:
            # this split's state (m = -inf, l = 0, acc = 0 where its chunk is empty), then a ticket
            slot = (bh * SPLITS + sp) * G_PAD + rg
            tl.store(ml_ptr + slot * 2, m_i)
            tl.store(ml_ptr + slot * 2 + 1, l_i)
            tl.store(part_ptr + slot[:, None] * D + rd[None, :], acc)
            if FENCE:  # every thread's stores visible GPU-wide before the ticket (CUDA's threadfence reduction)
                tl.inline_asm_elementwise("fence.acq_rel.gpu; // $0", "=r", [], dtype=tl.int32, is_pure=False,
                                          pack=1)
            tl.debug_barrier()
            ticket = tl.atomic_add(cnt_ptr + bh, 1, sem="acq_rel", scope="gpu")
            if ticket == SPLITS - 1:  # the last one in merges: the new key's term first, then each split's
                if FENCE:
                    tl.inline_asm_elementwise("fence.acq_rel.gpu; // $0", "=r", [], dtype=tl.int32,
                                              is_pure=False, pack=1)
                m_t = s_new
                l_t = tl.full([G_PAD], 1.0, dtype=tl.float32)
                a_t = tl.zeros([G_PAD, D], dtype=tl.float32) + v_new.to(tl.float32)[None, :]
                for j in tl.static_range(SPLITS):
                    other = (bh * SPLITS + j) * G_PAD + rg
                    # volatile: past L1, which is not coherent across SMs (a replay reuses these addresses)
                    m_j = tl.load(ml_ptr + other * 2, volatile=True)
                    l_j = tl.load(ml_ptr + other * 2 + 1, volatile=True)
                    a_j = tl.load(part_ptr + other[:, None] * D + rd[None, :], volatile=True)
                    m_n = tl.maximum(m_t, m_j)
                    alpha = tl.exp(m_t - m_n)
                    beta = tl.exp(m_j - m_n)
                    l_t = l_t * alpha + l_j * beta
                    a_t = a_t * alpha[:, None] + a_j * beta[:, None]
                    m_t = m_n
                out = a_t / l_t[:, None]
                tl.store(out_ptr + b * s_out_b + qrow + rd[None, :], out.to(dt), mask=gm[:, None])
                tl.atomic_xchg(cnt_ptr + bh, 0)  # ready for the next layer's (or replay's) tickets

    return step_attn_kernel


def new_counter(batch: int, n_kv: int, device) -> torch.Tensor:
    """The per-(sequence, KV head) ticket counters a split config needs: zeros, reset by the kernel after use."""
    return torch.zeros(batch * n_kv, device=device, dtype=torch.int32)


def _launch(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor,
            v_cache: torch.Tensor, block_scale: int = 1, num_warps: int = 4, splits: int = 1,
            counter: torch.Tensor | None = None, pdl: int = 0) -> torch.Tensor:
    """qkv [B, 1, q_rows + 2 kv_rows]; cos/sin [L, D]; pos [1] (device); caches [B, Hkv, L, D] -> [B, 1, q_rows]
    (counter: int32 [>= B * Hkv] zeros, needed when splits > 1)."""
    b, hkv, cap, d = k_cache.shape
    kv_rows = hkv * d
    q_rows = qkv.shape[-1] - 2 * kv_rows
    g = q_rows // d // hkv
    out = torch.empty(b, 1, q_rows, device=qkv.device, dtype=qkv.dtype)
    kern = _kernel()
    try:
        from torch.library import wrap_triton

        kern = wrap_triton(kern)
    except ImportError:
        pass
    ieee = qkv.dtype == torch.float32
    g_pow2 = 1 << (g - 1).bit_length()
    # fp32 and G <= 8: products on CUDA cores over a [G, BLOCK_L, D] tile (~64 fp32 registers a thread at most);
    # else tensor-core dots, whose rows pad to 16
    dot = not (ieee and g_pow2 <= 8)
    g_pad = max(16, g_pow2) if dot else g_pow2
    block_l = (BLOCK_L if dot else max(16, BLOCK_L // g_pow2)) * block_scale
    if splits > 1:  # a split's chunk in one tile where it fits (at the cache's capacity)
        chunk = -(-cap // splits)
        block_l = max(16, min(block_l, 1 << (chunk - 1).bit_length()))
        part = torch.empty(b * hkv * splits * g_pad * d, device=qkv.device, dtype=torch.float32)
        ml = torch.empty(b * hkv * splits * g_pad * 2, device=qkv.device, dtype=torch.float32)
        if counter is None:
            counter = new_counter(b, hkv, qkv.device)
    else:
        part = ml = out
        counter = out if counter is None else counter
    kern[(b * hkv, splits)](qkv, cos, sin, pos, k_cache, v_cache, out, counter, part, ml, g, hkv, q_rows, kv_rows,
                            qkv.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), out.stride(0),
                            1.0 / math.sqrt(d), D=d, G_PAD=g_pad, BLOCK_L=block_l, IEEE=int(ieee), DOT=int(dot),
                            SPLITS=splits, FENCE=int(not interpreting_triton()), PDL=pdl_usable(pdl), num_warps=num_warps,
                            **pdl_launch(pdl_usable(pdl)))
    return out


def _registered():
    """The triton_op torch.compile keeps in its graph (mutating the caches), or the plain launcher."""
    try:
        from torch.library import triton_op
    except ImportError:
        return _launch

    @triton_op("gpuspeed::step_attention", mutates_args={"k_cache", "v_cache", "counter"})
    def step_attention_op(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor,
                          k_cache: torch.Tensor, v_cache: torch.Tensor, block_scale: int, num_warps: int,
                          splits: int, counter: Optional[torch.Tensor], pdl: int) -> torch.Tensor:
        return _launch(qkv, cos, sin, pos, k_cache, v_cache, block_scale, num_warps, splits, counter, pdl)

    return step_attention_op


STEP_ATTENTION_OP = None  # registered at the first eager call, as gemv.GEMV_OP


def registered():
    global STEP_ATTENTION_OP
    if STEP_ATTENTION_OP is None:
        STEP_ATTENTION_OP = _registered()
    return STEP_ATTENTION_OP


def step_attention(qkv, cos, sin, pos, k_cache, v_cache, block_scale: int = 1, num_warps: int = 4, splits: int = 1,
                   *, counter: torch.Tensor | None = None, pdl: bool = False):
    """The Options.step_attention signature: [B, 1, q_rows] for one new token, the caches written at pos
    (block_scale, num_warps, splits: one of CONFIGS, bound by functools.partial where chosen; counter: the
    static cache's ticket counters, which the model passes; without one a split config zeroes a new one; pdl:
    programmatic dependent launch, as kernels/gemv.py, eager callers only)."""
    op = STEP_ATTENTION_OP if STEP_ATTENTION_OP is not None else registered()
    return op(qkv.contiguous(), cos, sin, pos, k_cache, v_cache, block_scale, num_warps, splits, counter, int(pdl))


def reference(qkv, cos, sin, pos, k_cache, v_cache, attention_fn=None):
    """The same step in torch ops (the model's own RoPE, cache update and attention, or `attention_fn` with the
    model's attention signature), for checks and timing."""
    from gpuspeed.decode.model import apply_rope, attention, attn_bias

    b, hkv, cap, d = k_cache.shape
    q_rows = qkv.shape[-1] - 2 * hkv * d
    h = q_rows // d
    q, k, v = qkv.split([q_rows, hkv * d, hkv * d], dim=-1)
    q = q.view(b, 1, h, d).transpose(1, 2)
    k = k.view(b, 1, hkv, d).transpose(1, 2)
    v = v.view(b, 1, hkv, d).transpose(1, 2)
    c, s = cos[pos], sin[pos]
    q, k = apply_rope(q, c, s), apply_rope(k, c, s)
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos, v)
    mask = torch.arange(cap, device=qkv.device)[None, :] <= pos[:, None]
    if attention_fn is None:  # as the model's forward: SDPA gets the additive bias, made once per step
        attention_fn, mask = attention, attn_bias(mask, q.dtype)
    y = attention_fn(q, k_cache, v_cache, mask, pos)
    return y.transpose(1, 2).reshape(b, 1, q_rows)
