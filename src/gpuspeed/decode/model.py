"""A Llama-family decoder in plain PyTorch (gpt-fast style): RMSNorm, RoPE with Llama-3 scaling, GQA, SwiGLU.

Weights are plain tensors, fused where they share an input (wqkv = [q; k; v] rows, w_gate_up = [gate; up]
rows): the unfused path multiplies by row slices of the fused tensor (contiguous views, the same bytes), so
the ladder's unfused and fused rungs share one copy of the weights. Every projection goes through
`Options.linear`, so a variant can swap in its own GEMV (and a later int8 or tensor-parallel build can swap
the weights' representation) without touching the model. Attention is grouped-query by folding the G query
heads of each KV head into the query length, so no K/V head is ever repeated in memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from gpuspeed.decode.kernels import fused_gemv
from gpuspeed.errors import UserError


@dataclass(frozen=True)
class ModelArgs:
    """The shape of a Llama-family model (what config.json or GGUF metadata says)."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # Llama-3: factor, low_freq_factor, high_freq_factor, original_max_...
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    max_seq_len: int = 2048
    head_dim: int = 0  # 0: dim // n_heads
    name: str = "custom"

    def __post_init__(self):
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        if self.head_dim % 2:  # as transformers' config refuses it: every rung failed in RoPE on a size mismatch
            raise UserError(f"{self.name}: head size {self.head_dim} is odd: RoPE rotates pairs of a head, so a "
                            "Llama's head size is even")
        if self.n_heads % self.n_kv_heads:
            raise UserError(f"{self.name}: {self.n_heads} heads are not a multiple of {self.n_kv_heads} KV heads")

    @property
    def q_rows(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_rows(self) -> int:
        return self.n_kv_heads * self.head_dim

    def param_count(self, *, with_embedding: bool = True) -> int:
        layer = (self.q_rows + 2 * self.kv_rows) * self.dim + self.dim * self.q_rows + 3 * self.dim * self.ffn_dim \
            + 2 * self.dim
        head = 0 if self.tie_embeddings else self.vocab_size * self.dim
        emb = self.vocab_size * self.dim if with_embedding else 0
        return self.n_layers * layer + self.dim + head + emb

    def weight_bytes_per_token(self, elem_bytes: int) -> int:
        """Bytes of weights one decode step reads: every layer, the final norm and the LM head (the
        embedding lookup reads B rows only, so it does not count; a tied head reads the embedding)."""
        layers = self.param_count(with_embedding=False) - (0 if self.tie_embeddings else self.vocab_size * self.dim)
        return (layers + self.vocab_size * self.dim) * elem_bytes


CONFIGS: dict[str, ModelArgs] = {
    # the brief's launch-bound toy (transformers' LlamaConfig defaults where the issue says nothing)
    "tiny": ModelArgs(vocab_size=32000, dim=512, n_layers=8, n_heads=8, n_kv_heads=8, ffn_dim=1376,
                      rope_theta=10000.0, norm_eps=1e-6, max_seq_len=2048, name="tiny"),
    "smollm2-135m": ModelArgs(vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3, ffn_dim=1536,
                              rope_theta=100000.0, norm_eps=1e-5, tie_embeddings=True, max_seq_len=8192,
                              name="smollm2-135m"),
    "llama-3.2-1b": ModelArgs(vocab_size=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192,
                              rope_theta=500000.0, norm_eps=1e-5, tie_embeddings=True, max_seq_len=131072,
                              rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                              name="llama-3.2-1b"),
    "llama-3-8b": ModelArgs(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336,
                            rope_theta=500000.0, norm_eps=1e-5, max_seq_len=8192, name="llama-3-8b"),
    # 141 GB in bf16: more than one H200 holds, so tensor parallel only (tp.py makes each rank's shard alone)
    "llama-3-70b": ModelArgs(vocab_size=128256, dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672,
                             rope_theta=500000.0, norm_eps=1e-5, max_seq_len=8192, name="llama-3-70b",
                             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
}


def named_config(name: str, **overrides) -> ModelArgs:
    """A named config, optionally reshaped (tests use fewer layers and a smaller vocabulary)."""
    if name not in CONFIGS:
        raise UserError(f"unknown model {name!r}: use {', '.join(CONFIGS)} or a path to a .gguf file or an HF folder")
    base = CONFIGS[name]
    if ({"dim", "n_heads"} & overrides.keys() and "head_dim" not in overrides
            and base.head_dim == base.dim // base.n_heads):
        overrides["head_dim"] = 0  # derived from dim / n_heads, not chosen: follow the new shape (0 re-derives it)
    return replace(base, **overrides) if overrides else base


# ---------------------------------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------------------------------


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """Inverse frequencies as transformers computes them (fp32), with Llama-3's frequency scaling."""
    d = args.head_dim
    inv = 1.0 / (args.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    sc = args.rope_scaling or {}
    kind = sc.get("rope_type", sc.get("type"))
    if kind in (None, "default"):
        return inv
    if kind != "llama3":
        raise UserError(f"rope scaling {kind!r} is not supported (only llama3)")
    try:
        factor, low, high = float(sc["factor"]), float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
        old = float(sc["original_max_position_embeddings"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"llama3 rope scaling needs factor, low_freq_factor, high_freq_factor and "
                        f"original_max_position_embeddings as numbers: {type(exc).__name__} {exc}") from None
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(args: ModelArgs, length: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [length, head_dim] in transformers' half-split layout, computed in fp32 then cast."""
    inv = rope_inv_freq(args).to(device)
    pos = torch.arange(length, device=device, dtype=torch.float32)
    freqs = torch.outer(pos, inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, S, D]; cos/sin [S, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def attn_bias(mask: torch.Tensor | None, dtype) -> torch.Tensor | None:
    """The bool mask [S, L] as SDPA's additive bias in the model's dtype (0 where attended, -inf elsewhere),
    made once per forward: SDPA would otherwise convert the bool mask again in every layer."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.full(mask.shape, float("-inf"), dtype=dtype, device=mask.device).masked_fill_(mask, 0.0)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: normalize in fp32, cast back, then scale."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              input_pos: torch.Tensor | None = None) -> torch.Tensor:
    """Grouped-query attention: q [B, H, S, D], k/v [B, Hkv, L, D], mask [S, L] bool (True = attend) or the
    additive bias attn_bias() makes of it (0 / -inf), or None (input_pos: the queries' positions, for kernels
    that read the length on the device).

    The G = H / Hkv query heads of a KV head are folded into the query length, so one SDPA call serves the
    group without repeating K/V (transformers' repeat_kv pairs query head h with KV head h // G: the same)."""
    b, h, s, d = q.shape
    hkv = k.shape[1]
    g = h // hkv
    qg = q.reshape(b, hkv, g * s, d)
    # one query row (a decode step) is the same row for all G folded heads: it broadcasts, no copy per layer
    m = None if mask is None else mask if mask.shape[0] == 1 else mask.repeat(g, 1)
    y = F.scaled_dot_product_attention(qg, k, v, attn_mask=m)
    return y.reshape(b, h, s, d)


# ---------------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """How a forward pass computes: fused projections or row slices, which GEMV and attention, and the
    weight shapes (n, k) that run as gpuspeed's Triton GEMV with the layer's norm / SiLU / residual fused in
    (`gemv`: shape -> kernel config; one-row inputs only, every other call takes the torch path)."""

    fused_qkv: bool = False
    fused_gate_up: bool = False
    linear: Callable = F.linear
    attention: Callable = attention
    gemv: dict = field(default_factory=dict)
    # one kernel for RoPE + cache write + attention of a one-token step on a static cache (fused_qkv only):
    # step_attention(qkv, cos_table, sin_table, input_pos, k_cache, v_cache, counter=) -> [B, 1, q_rows] (counter:
    # the static cache's per-(sequence, KV head) int32 zeros, for kernels that merge split partials)
    step_attention: Callable | None = None
    # Triton kernels launched with programmatic dependent launch (each lets the next launch and prefetch its
    # weights early): eager insides only, as torch.compile does not pass the launch option (variants.Fast)
    pdl: bool = False


PLAIN = Options()


def _gemv_cfg(opts: Options, x: torch.Tensor, w):
    """The Triton GEMV config for weight w (a tensor or an int8 quant.Int8Weight) on a one-row x, or None."""
    if not opts.gemv or x.numel() != x.shape[-1]:
        return None
    return opts.gemv.get((w.shape[0], w.shape[1]))



def _linear(opts: Options, x, w):
    """opts.linear(x, w), or an int8 weight's own dequantizing GEMV (quant.Int8Weight is not a tensor)."""
    return opts.linear(x, w) if isinstance(w, torch.Tensor) else w.linear(x)


def tp_reduce(y, tp):
    """The all-reduce after a row-parallel projection (tensor parallel: tp.TP); nothing on one GPU."""
    return y if tp is None else tp.all_reduce(y)


def norm_linear(x, norm_w, eps, w, opts: Options):
    """linear(rms_norm(x)), the norm inside the GEMV where opts.gemv has the shape."""
    cfg = _gemv_cfg(opts, x, w)
    if cfg is None:
        return _linear(opts, rms_norm(x, norm_w, eps), w)
    return fused_gemv(x, w, cfg, norm=norm_w, eps=eps, pdl=opts.pdl)


def linear_residual(y, w, residual, opts: Options, tp=None):
    """residual + linear(y), the add inside the GEMV where opts.gemv has the shape (tensor parallel: the
    partial product all-reduced first, the residual added once)."""
    cfg = _gemv_cfg(opts, y, w)
    if cfg is None:
        return residual + tp_reduce(_linear(opts, y, w), tp)
    if tp is not None:
        return residual + tp.all_reduce(fused_gemv(y, w, cfg, pdl=opts.pdl))
    return fused_gemv(y, w, cfg, residual=residual, pdl=opts.pdl)


def silu_mul_linear_residual(gate_up, w, residual, opts: Options, tp=None):
    """residual + linear(silu(gate) * up) from the fused [gate; up] projection (all-reduced as above)."""
    cfg = None if gate_up.numel() != gate_up.shape[-1] else _gemv_cfg(opts, gate_up[..., :w.shape[1]], w)
    if cfg is None:
        gate, up = gate_up.chunk(2, dim=-1)
        return residual + tp_reduce(_linear(opts, F.silu(gate) * up, w), tp)
    if tp is not None:
        return residual + tp.all_reduce(fused_gemv(gate_up, w, cfg, silu_mul=True, pdl=opts.pdl))
    return fused_gemv(gate_up, w, cfg, silu_mul=True, residual=residual, pdl=opts.pdl)


class Block(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        a = args
        self.attn_norm = nn.Parameter(torch.empty(a.dim))
        self.wqkv = nn.Parameter(torch.empty(a.q_rows + 2 * a.kv_rows, a.dim))
        self.wo = nn.Parameter(torch.empty(a.dim, a.q_rows))
        self.ffn_norm = nn.Parameter(torch.empty(a.dim))
        self.w_gate_up = nn.Parameter(torch.empty(2 * a.ffn_dim, a.dim))
        self.w_down = nn.Parameter(torch.empty(a.dim, a.ffn_dim))


class Transformer(nn.Module):
    """The decoder. forward(tokens [B, S], input_pos [S] (a device tensor), cache) -> logits [B, S, V]."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_emb = nn.Parameter(torch.empty(args.vocab_size, args.dim))
        self.layers = nn.ModuleList(Block(args) for _ in range(args.n_layers))
        self.norm = nn.Parameter(torch.empty(args.dim))
        self.lm_head = None if args.tie_embeddings else nn.Parameter(torch.empty(args.vocab_size, args.dim))
        self.rope_cos: torch.Tensor | None = None
        self.rope_sin: torch.Tensor | None = None
        # tables replaced by longer ones, kept alive: a captured graph holds their addresses, not the tensors
        self.retired_rope: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.tp = None  # tp.TP on a rank's shard: vocab-sharded embedding / head, all-reduces (tp.py)

    @property
    def head_weight(self) -> torch.Tensor:
        return self.tok_emb if self.lm_head is None else self.lm_head

    @property
    def device(self) -> torch.device:
        return self.tok_emb.device

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_emb.dtype

    def setup_rope(self, length: int) -> None:
        """RoPE tables for positions [0, length) in the model's dtype (re-made when longer ones are needed)."""
        if length > self.args.max_seq_len:
            raise UserError(f"{length} positions exceed {self.args.name}'s context of {self.args.max_seq_len}")
        if self.rope_cos is None or self.rope_cos.shape[0] < length or self.rope_cos.dtype != self.dtype \
                or self.rope_cos.device != self.device:
            if self.rope_cos is not None:  # a graph captured by an earlier engine still reads the old tables
                self.retired_rope.append((self.rope_cos, self.rope_sin))
            self.rope_cos, self.rope_sin = rope_tables(self.args, length, self.device, self.dtype)

    def _ffn(self, x, layer, opts: Options):
        """x + down(silu(gate(norm(x))) * up(norm(x))), all-reduced under tensor parallel."""
        a = self.args
        if opts.fused_gate_up:
            gate_up = norm_linear(x, layer.ffn_norm, a.norm_eps, layer.w_gate_up, opts)
            return silu_mul_linear_residual(gate_up, layer.w_down, x, opts, self.tp)
        h = rms_norm(x, layer.ffn_norm, a.norm_eps)
        gate, up = _linear(opts, h, layer.w_gate_up[:a.ffn_dim]), _linear(opts, h, layer.w_gate_up[a.ffn_dim:])
        return x + tp_reduce(_linear(opts, F.silu(gate) * up, layer.w_down), self.tp)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor, cache=None, opts: Options = PLAIN,
                last_only: bool = False) -> torch.Tensor:
        """Logits [B, S, V], or [B, 1, V] for the last position only (a prefill needs no more)."""
        a = self.args
        b, s = tokens.shape
        x = F.embedding(tokens, self.tok_emb) if self.tp is None else self.tp.embed(tokens, self.tok_emb)
        # the fused step kernel reads the RoPE tables and the position itself: no lookups, mask or bias (in eager
        # insides each was a kernel of its own a token; inductor drops them as dead code anyway)
        step_kernel = opts.fused_qkv and opts.step_attention is not None and s == 1 and cache is not None
        cos = sin = mask = None
        if not step_kernel:
            cos, sin = self.rope_cos[input_pos], self.rope_sin[input_pos]
            mask = None if cache is None else cache.mask(input_pos)
            if cache is None and s > 1:
                mask = torch.ones(s, s, dtype=torch.bool, device=tokens.device).tril()
            if opts.attention is attention:  # other attentions (flash-decoding) take the bool mask or none
                mask = attn_bias(mask, x.dtype)

        def lin(h, w):
            return _linear(opts, h, w)
        for i, layer in enumerate(self.layers):
            if opts.fused_qkv:
                qkv = norm_linear(x, layer.attn_norm, a.norm_eps, layer.wqkv, opts)
                q, k, v = qkv.split([a.q_rows, a.kv_rows, a.kv_rows], dim=-1)
                if step_kernel:
                    y = opts.step_attention(qkv, self.rope_cos, self.rope_sin, input_pos, cache.k[i], cache.v[i],
                                            counter=getattr(cache, "counter", None), pdl=opts.pdl)
                    x = linear_residual(y, layer.wo, x, opts, self.tp)
                    x = self._ffn(x, layer, opts)
                    continue
            else:
                h = rms_norm(x, layer.attn_norm, a.norm_eps)
                w = layer.wqkv
                q = lin(h, w[:a.q_rows])
                k = lin(h, w[a.q_rows:a.q_rows + a.kv_rows])
                v = lin(h, w[a.q_rows + a.kv_rows:])
            q = q.view(b, s, a.n_heads, a.head_dim).transpose(1, 2)
            k = k.view(b, s, a.n_kv_heads, a.head_dim).transpose(1, 2)
            v = v.view(b, s, a.n_kv_heads, a.head_dim).transpose(1, 2)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            if cache is not None:
                k, v = cache.update(i, input_pos, k, v)
            y = opts.attention(q, k, v, mask, input_pos)
            y = y.transpose(1, 2).reshape(b, s, a.q_rows)
            x = linear_residual(y, layer.wo, x, opts, self.tp)
            x = self._ffn(x, layer, opts)
        if last_only:
            x = x[:, -1:]
        logits = norm_linear(x, self.norm, a.norm_eps, self.head_weight, opts)
        return logits if self.tp is None else self.tp.gather_vocab(logits)  # each rank holds a vocab shard


DTYPE_NAMES = {"fp32": torch.float32, "float32": torch.float32, "float": torch.float32, "bf16": torch.bfloat16,
               "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16, "half": torch.float16}


def as_dtype(dtype) -> torch.dtype:
    """A floating torch dtype, or the command line's name of one ("bf16"): Module.to took a string as a device
    ("Invalid device string: 'bf16'")."""
    if isinstance(dtype, str) and dtype.lower() in DTYPE_NAMES:
        return DTYPE_NAMES[dtype.lower()]
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    raise UserError(f"dtype {dtype!r} is not a model dtype: use fp32, bf16 or fp16 (or a floating torch.dtype)")


def build(args: ModelArgs, *, device="cpu", dtype=torch.float32, seed: int | None = 0) -> Transformer:
    """The model on `device` in `dtype`; random weights from `seed` (None: left empty for a loader).

    Weights are made on the target device directly (an 8B model never passes through the host)."""
    dtype = as_dtype(dtype)
    with torch.device("meta"):
        model = Transformer(args)
    model = model.to_empty(device=device).to(dtype)
    if seed is not None:
        init_random(model, seed)
    return model.eval().requires_grad_(False)


@torch.no_grad()
def init_random(model: Transformer, seed: int, std: float = 0.02) -> None:
    """transformers' Llama init: normal(0, 0.02) matrices, unit norm weights; one seeded device generator."""
    gen = torch.Generator(device=model.device).manual_seed(seed)
    for p in model.parameters():
        if p.dim() == 1:
            p.fill_(1.0)
        else:
            p.normal_(0.0, std, generator=gen)
