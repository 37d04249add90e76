"""V5's kernel choices: which GEMV and which decode attention a model's shapes get.

choose() returns (linear, attention, notes). On a GPU it measures, at the model's own shapes, cuBLAS
(F.linear) against the Triton split-K GEMV configs, and SDPA against split-sequence flash-decoding; a
candidate is used only if gpuspeed.check passes it against torch and gpuspeed.bench finds it faster.
fp32 models keep F.linear and SDPA (their summation order keeps fp32 tokens identical to V0's). On the CPU
torch's ops stay. Decisions are kept per shape, so later engines of the same model reuse them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gpuspeed.decode.model import attention as sdpa_attention

WIN = 0.97  # a kernel must take under 97 % of torch's time to replace it
_decisions: dict = {}  # (kind, shape..., dtype, device name) -> (choice, details)


def _rotate_for(nbytes: int, l2: int) -> int:
    """Argument copies so a timed call never finds its weights in L2 (decode reads each weight once)."""
    return int(min(16, max(2, math.ceil(3 * l2 / max(nbytes, 1)))))


def _bench(fn, *args, rotate: int):
    from gpuspeed import bench

    return bench(fn, *args, rotate=rotate, budget_s=0.3, warmup_s=0.1, max_noise=0.02)


def choose_gemv(n: int, k: int, dtype, notes: list) -> tuple | None:
    """The fastest correct Triton config for W [n, k] at batch 1, or None when cuBLAS is as fast."""
    from gpuspeed import device as _device
    from gpuspeed.decode.kernels.gemv import CONFIGS, gemv
    from gpuspeed.verify import check

    key = ("gemv", n, k, dtype, torch.cuda.get_device_name())
    if key in _decisions:
        return _decisions[key][0]
    w = torch.randn(n, k, device="cuda", dtype=dtype) * 0.02
    x = torch.randn(1, 1, k, device="cuda", dtype=dtype)
    ref = F.linear(x.double(), w.double())
    rot = _rotate_for(w.numel() * w.element_size(), _device.l2_bytes())
    base = _bench(F.linear, x, w, rotate=rot)
    best, best_t, tried = None, base.median, {"cublas_us": base.median * 1e6}
    for cfg in CONFIGS:
        try:
            if not check(gemv(x, w, *cfg), ref).passed:
                tried[str(cfg)] = "wrong"
                continue
            m = _bench(lambda x, w, cfg=cfg: gemv(x, w, *cfg), x, w, rotate=rot)
            tried[str(cfg)] = m.median * 1e6
            if m.median < best_t * (WIN if best is None else 1.0):
                best, best_t = cfg, m.median
        except Exception as exc:  # a config that fails to compile or run is skipped
            tried[str(cfg)] = f"{type(exc).__name__}"
    gbps = w.numel() * w.element_size() / best_t / 1e9
    notes.append(f"GEMV {n}x{k}: {'Triton ' + str(best) if best else 'cuBLAS'} {best_t * 1e6:.1f} us "
                 f"({gbps:.0f} GB/s; cuBLAS {base.median * 1e6:.1f} us)")
    _decisions[key] = (best, tried)
    return best


def choose_attention(batch: int, n_heads: int, n_kv: int, head_dim: int, max_len: int, dtype, notes: list) -> bool:
    """True when flash-decoding beats SDPA on a full cache of max_len (and matches it)."""
    from gpuspeed.decode.kernels.attention import decode_attention
    from gpuspeed.verify import check

    key = ("attn", batch, n_heads, n_kv, head_dim, max_len, dtype, torch.cuda.get_device_name())
    if key in _decisions:
        return _decisions[key][0]
    q = torch.randn(batch, n_heads, 1, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, n_kv, max_len, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    pos = torch.tensor([max_len - 1], device="cuda")
    mask = torch.arange(max_len, device="cuda")[None, :] <= pos[:, None]
    ref = sdpa_attention(q.double(), k.double(), v.double(), mask)
    use, details = False, {}
    try:
        ok = check(decode_attention(q, k, v, mask, pos), ref)
        base = _bench(sdpa_attention, q, k, v, mask, rotate=2)
        mine = _bench(decode_attention, q, k, v, mask, pos, rotate=2)
        use = ok.passed and mine.median < WIN * base.median
        details = {"sdpa_us": base.median * 1e6, "flash_decoding_us": mine.median * 1e6, "check": ok.summary}
        notes.append(f"decode attention over {max_len} keys: {'flash-decoding' if use else 'SDPA'} "
                     f"(SDPA {base.median * 1e6:.1f} us, flash-decoding {mine.median * 1e6:.1f} us"
                     f"{'' if ok.passed else ', flash-decoding FAILED its check'})")
    except Exception as exc:
        notes.append(f"flash-decoding unavailable: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}")
    _decisions[key] = (use, details)
    return use


def make_linear(table: dict):
    """F.linear, with the Triton GEMV for the weight shapes in `table` ((n, k) -> config) at one row."""
    from gpuspeed.decode.kernels.gemv import gemv

    def linear(x, w):
        cfg = table.get((w.shape[0], w.shape[1]))
        if cfg is None or x.numel() != x.shape[-1]:
            return F.linear(x, w)
        return gemv(x, w, *cfg)

    return linear


def choose(model, batch: int, max_len: int):
    """(linear, attention, notes) for V5 on this model, batch and cache length."""
    notes: list[str] = []
    if model.device.type != "cuda":
        notes.append("CPU: torch's F.linear and SDPA (the Triton kernels are GPU choices)")
        return F.linear, sdpa_attention, notes
    try:
        import triton  # noqa: F401
    except ImportError:
        notes.append("Triton is not installed: torch's F.linear and SDPA")
        return F.linear, sdpa_attention, notes
    a = model.args
    linear = F.linear
    if batch == 1 and model.dtype != torch.float32:
        shapes = {(a.q_rows + 2 * a.kv_rows, a.dim), (a.dim, a.q_rows), (2 * a.ffn_dim, a.dim), (a.dim, a.ffn_dim),
                  (a.vocab_size, a.dim)}
        table = {}
        for n, k in sorted(shapes):
            cfg = choose_gemv(n, k, model.dtype, notes)
            if cfg is not None:
                table[(n, k)] = cfg
        if table:
            linear = make_linear(table)
    elif model.dtype == torch.float32:
        notes.append("fp32: F.linear and SDPA kept (their summation order keeps the tokens identical to V0's)")
    attention = sdpa_attention
    if model.dtype != torch.float32 and choose_attention(batch, a.n_heads, a.n_kv_heads, a.head_dim, max_len,
                                                         model.dtype, notes):
        from gpuspeed.decode.kernels.attention import decode_attention

        attention = decode_attention
    return linear, attention, notes
