"""Int8 weight-only quantization for decode: per-output-channel symmetric int8 weights, activations in the
model's dtype (bf16), dequantized inside the GEMV.

quantize(w) -> Int8Weight(q int8 [N, K], scale fp32 [N]) with scale = max|w_row| / 127 and q = round(w / scale).
An Int8Weight stands where the model had a weight tensor: the model's fused calls (norm_linear, linear_residual,
...) run the Triton int8 GEMV with the layer's norm, SiLU and residual inside (kernels/int8_gemv.py: int8 words,
fp32 sums, the scale in the epilogue) where V5's table has the shape; model._linear calls its .linear(x) otherwise,
which is either that kernel unfused or the torch form F.linear(x, q.to(dtype)) * scale, which torch.compile fuses
into one reduction kernel that reads int8 (inductor's batch-1 mm decomposition: coordinate_descent_tuning on).
choose() measures both per shape on the GPU through kernels.choose_gemv, as for the bf16 GEMV (graph mode,
weights out of L2, the costliest fused form), and keeps the faster one that passes its checks.
The embedding stays in the model's dtype (a lookup reads B rows); the LM head is
quantized (a tied head gets its own int8 copy).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpuspeed.errors import UserError

LINEARS = ("wqkv", "wo", "w_gate_up", "w_down")
# split by columns under tensor parallel (tp.py): a rank holds part of each row, whose scale is the whole row's
ROW_PARALLEL = ("wo", "w_down")


class Int8Weight:
    """An int8 weight with per-row scales; slicing rows keeps the pairing (the ladder's unfused rungs
    multiply by row slices of wqkv and w_gate_up)."""

    __slots__ = ("q", "scale", "cfg")

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, cfg: tuple | None = None):
        self.q, self.scale, self.cfg = q, scale, cfg

    @property
    def shape(self):
        return self.q.shape

    @property
    def nbytes(self) -> int:
        return self.q.numel() * self.q.element_size() + self.scale.numel() * self.scale.element_size()

    def __getitem__(self, rows) -> Int8Weight:
        return Int8Weight(self.q[rows], self.scale[rows], self.cfg)

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        return (self.q.to(torch.float32) * self.scale[:, None].float()).to(dtype)

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        """x @ dequantized.T: the chosen Triton int8 GEMV for one row, else the torch form."""
        if self.cfg is not None and x.numel() == x.shape[-1]:
            from gpuspeed.decode.kernels.int8_gemv import int8_gemv

            return int8_gemv(x, self.q, self.scale, *self.cfg)
        return dequant_linear(x, self.q, self.scale)


def dequant_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x @ (q * scale).T as gpt-fast writes it: the int8 -> dtype cast is exact (|q| <= 127), the scale is
    applied to the product (fp32), then the result is rounded to x's dtype.

    fp16 instead sums in fp32 (as the Triton int8 GEMV does), then rounds once: fp16's range ends at 65504, and the
    unscaled sum of x * q (|q| up to 127, ~1/scale times the answer) overflowed to inf on an LLM's outlier
    activations where the answer and the fp16 model are finite (on the CPU this form is also ~5x faster than the
    fp16 one). bf16 has fp32's range: gpt-fast's form."""
    if x.dtype == torch.float16:
        return (F.linear(x.float(), q.to(torch.float32)) * scale).to(x.dtype)
    return (F.linear(x, q.to(x.dtype)) * scale).to(x.dtype)


@torch.no_grad()
def row_absmax(w: torch.Tensor, rows_per_chunk: int = 8192) -> torch.Tensor:
    """max |w| of each row, fp32 [N] (chunked over rows, as quantize)."""
    return torch.cat([w[i:i + rows_per_chunk].float().abs().amax(dim=1) for i in range(0, w.shape[0], rows_per_chunk)])


@torch.no_grad()
def quantize(w: torch.Tensor, rows_per_chunk: int = 8192, absmax: torch.Tensor | None = None) -> Int8Weight:
    """Symmetric per-row int8 (chunked over rows: an 8B LM head in fp32 at once would be 2 GB of temporaries).
    absmax: each row's max |w| where w holds only part of the rows (a tensor-parallel rank's columns)."""
    n = w.shape[0]
    q = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    scale = torch.empty(n, dtype=torch.float32, device=w.device)
    for i in range(0, n, rows_per_chunk):
        wf = w[i:i + rows_per_chunk].float()
        m = wf.abs().amax(dim=1) if absmax is None else absmax[i:i + rows_per_chunk].float()
        s = (m / 127.0).clamp_min(torch.finfo(torch.float32).tiny)  # an all-zero row: q = 0
        q[i:i + rows_per_chunk] = torch.round(wf / s[:, None]).clamp_(-127, 127).to(torch.int8)
        scale[i:i + rows_per_chunk] = s
    return Int8Weight(q, scale)


def _whole_row_absmax(model, name: str, w: torch.Tensor) -> torch.Tensor | None:
    """Under tensor parallel, a column-split weight's row maxima over every rank (None: w holds whole rows), so each
    rank's int8 weights are the slices of one process's: scaled by half a row, --tp 2 decoded other weights."""
    tp = getattr(model, "tp", None)
    if tp is None or tp.world == 1 or name not in ROW_PARALLEL:
        return None
    return tp.all_reduce_max(row_absmax(w))


@torch.no_grad()
def quantize_model(model) -> None:
    """Every projection and the LM head to Int8Weight, in place (the bf16 tensors are released)."""
    for layer in model.layers:
        for name in LINEARS:
            w = getattr(layer, name)
            if not isinstance(w, torch.Tensor):
                continue
            qw = quantize(w, absmax=_whole_row_absmax(model, name, w))
            delattr(layer, name)
            object.__setattr__(layer, name, qw)
    head = model.head_weight
    if isinstance(head, torch.Tensor):
        qh = quantize(head)
        if model.lm_head is not None:
            delattr(model, "lm_head")
        object.__setattr__(model, "lm_head", qh)  # tied: the embedding keeps its rows for the lookup
    model.quant = "int8"


def int8_weights(model) -> list[Int8Weight]:
    out = [getattr(layer, n) for layer in model.layers for n in LINEARS]
    out.append(model.head_weight)
    return [w for w in out if isinstance(w, Int8Weight)]


def weight_bytes_per_token(model) -> int:
    """Bytes one decode step reads from the weights as they are stored (int8 + scales, norms, the head; the
    embedding lookup reads B rows only). Equals ModelArgs.weight_bytes_per_token for an unquantized model."""
    def nb(w):
        return w.nbytes if isinstance(w, Int8Weight) else w.numel() * w.element_size()

    total = nb(model.norm) + nb(model.head_weight)
    for layer in model.layers:
        total += nb(layer.attn_norm) + nb(layer.ffn_norm) + sum(nb(getattr(layer, n)) for n in LINEARS)
    return total


def int8_model_bytes(args, elem_bytes: int) -> int:
    """The bytes quantize_model leaves on the device for a model of these shapes (ModelArgs): int8 projections and
    LM head with fp32 row scales (a tied head gets its own int8 copy), the embedding and norms in the run's dtype."""
    def int8(rows: int, cols: int) -> int:
        return rows * cols + rows * 4

    a = args
    layer = int8(a.q_rows + 2 * a.kv_rows, a.dim) + int8(a.dim, a.q_rows) + int8(2 * a.ffn_dim, a.dim) \
        + int8(a.dim, a.ffn_dim) + 2 * a.dim * elem_bytes
    return a.n_layers * layer + int8(a.vocab_size, a.dim) + (a.vocab_size * a.dim + a.dim) * elem_bytes


def quant_peak_bytes(args, elem_bytes: int) -> int:
    """prepare()'s peak on the device: the model and its unquantized copy (the reference) in the run's dtype, before
    quantize_model replaces the model's weights one by one with smaller int8 ones (the unquantized weights are
    materialized first: the int8 model alone is what the ladder runs, not what loading needs)."""
    return 2 * args.param_count() * elem_bytes


# ---------------------------------------------------------------------------------------------------
# Choosing the GEMV per shape (GPU)
# ---------------------------------------------------------------------------------------------------


def choose(model, notes: list) -> dict:
    """Set each Int8Weight's kernel (GPU only): kernels.choose_gemv times the int8 GEMV's configs in the fused form
    each shape runs in against the compiled dequantize-then-linear and checks every form against float64. Returns
    the decisions per shape (the results record them)."""
    if model.device.type != "cuda":
        notes.append("int8 on the CPU: the torch form (F.linear of the int8 weight cast, times the scales)")
        return {}
    try:
        import triton  # noqa: F401
    except ImportError:
        notes.append("Triton is not installed: int8 runs as the compiled torch form")
        return {}
    from gpuspeed.decode import kernels
    from gpuspeed.decode.kernels.int8_gemv import registered

    registered()  # the op is registered eagerly: dynamo does not trace the registration
    uses = kernels.gemv_uses(model.args)
    out = {}
    for w in int8_weights(model):
        n, k = w.shape
        u = uses.get((n, k), {"plain"})
        w.cfg = kernels.choose_gemv(n, k, model.dtype, u, notes, quant="int8")
        out[f"{n}x{k}"] = kernels._decisions[kernels.gemv_key(n, k, model.dtype, u, "int8")][1]
    return out


def prepare(ck, ref_model, spec, notes: list):
    """study.run's --quant step: (checkpoint with the int8 model, the unquantized model as the reference).
    The reference is the model in the run's dtype (bf16): agreement and logit error are against it."""
    from gpuspeed.decode.study import _cast

    if spec.quant != "int8":
        raise UserError(f"unknown --quant {spec.quant!r}: use int8")
    m = ck.model
    ref = _cast(m, m.dtype)
    ref.tp = getattr(m, "tp", None)
    del ref_model  # the fp32 copy: int8 is compared with the dtype it replaces
    quantize_model(m)
    if m.device.type == "cuda":
        import torch._inductor.config as icfg

        # inductor turns a batch-1 mm into a reduction it can fuse the int8 -> bf16 cast into (gpt-fast's setting)
        icfg.coordinate_descent_tuning = True
        notes.append("int8: inductor's coordinate_descent_tuning on (fuses the dequantize into the batch-1 GEMV)")
    m.int8_choices = choose(m, notes)
    return ck, ref


def relabel(doc: dict, label: str) -> None:
    """A quantized run's reference is the unquantized model: the study's *_vs_fp32 columns are vs bf16 (the
    run's dtype); the summary gets the issue's names."""
    dt = doc["params"].get("dtype", "bf16")
    for r in doc["rows"]:
        for key in [k for k in r if k.endswith("_vs_fp32")]:
            r[key[:-len("_vs_fp32")] + f"_vs_{dt}"] = r.pop(key)
    s = doc["summary"]
    for key in [k for k in s if k.endswith("_vs_fp32")]:
        s[key[:-len("_vs_fp32")] + f"_vs_{dt}"] = s.pop(key)
    # a partial file's ladder rows carry no study yet
    ok = [r for r in doc["rows"] if "ms_per_token" in r and r.get("study", "ladder") == "ladder"
          and not str(r.get("variant", "")).startswith("HF")]
    tf = [r[f"teacher_forced_agreement_vs_{dt}"] for r in ok if f"teacher_forced_agreement_vs_{dt}" in r]
    if tf:
        s[f"{label}_token_agreement_vs_{dt}"] = min(tf)
        from gpuspeed.decode.generate import worst

        # the rows are a results document's: a NaN error is null there (max over two of them was a TypeError that
        # lost the whole run), and so is the summary's
        err = worst(r[f"teacher_forced_max_logit_err_vs_{dt}"] for r in ok if f"teacher_forced_max_logit_err_vs_{dt}" in r)
        s[f"{label}_max_logit_err_vs_{dt}"] = None if err != err else err
    free = [r[f"token_agreement_vs_{dt}"] for r in ok if f"token_agreement_vs_{dt}" in r]
    if free:
        s[f"{label}_free_running_token_agreement_vs_{dt}"] = min(free)
