"""The decode study: run the ladder on one model and dtype, measure it, and write results/<gpu>/decode.json.

For each variant: one warm generation (compile and capture timed apart, tokens kept for the equality
check), prefill and decode timed with gpuspeed.bench (decode: repeated generations from the prefilled
state, ms/token = median / steps), peak memory with gpuspeed.peak_memory, kernels and host syncs per token
from gpuspeed.profile's trace. Weight bytes per token over time gives GB/s against the read ceiling the
roofline module measures in the same run. A failing variant is recorded with its error; the rest go on (under
--tp, where the ranks' collectives must match, a failure on any rank ends the run instead).
"""

from __future__ import annotations

import gc
import numbers
import os
import re
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from gpuspeed import device as _device
from gpuspeed.decode import checkpoints, model as M, variants as V
from gpuspeed.decode.generate import Sampling, generate, logit_error, worst
from gpuspeed.decode.quant import weight_bytes_per_token
from gpuspeed.errors import UserError, one_line

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Spec:
    """What one `gpuspeed decode` run does."""

    model: str = "tiny"
    dtype: str = "fp32"
    variants: list = field(default_factory=lambda: list(V.ORDER))
    batch: int = 1
    prompt_len: int = 32
    prompt: str | None = None
    new_tokens: int = 128
    device: str = "auto"
    seed: int = 0
    compile_backend: str = "inductor"
    hf: bool = True  # transformers generate rows (dynamic and static cache)
    profile: bool = True
    agreement: bool = True  # bf16/fp16: token agreement and max logit error against fp32
    batches: list = field(default_factory=list)  # extra batch sizes for the best variant (e.g. 8, 32)
    long_prompt: int | None = None  # an extra row for the best variant at this prompt length
    time_cap_s: float | None = None  # past this, the remaining variants are skipped (recorded as skipped)
    read_roof_GBps: float | None = None  # a read ceiling measured earlier in the same run (else measured now)
    bench_budget_s: float = 2.0
    max_layers: int | None = None  # shrink a named config (CPU demos and tests)
    out: str | None = None  # traces go to <out>/traces/
    sampling: Sampling = field(default_factory=Sampling)
    tp: int = 1  # ranks (tensor parallel, tp.py); the study runs once per rank
    quant: str | None = None  # "int8": weight-only int8 (quant.py), compared with the unquantized model

    def __post_init__(self):
        if isinstance(self.variants, str):  # "V2,V5" or "all" as on the command line: it was read letter by letter
            self.variants = V.parse_variants(self.variants)
        elif isinstance(self.variants, (list, tuple)):  # ["v2"] as the string form takes it; unknown ones stay for check_spec
            named = [next((k for k in V.ORDER if isinstance(v, str) and k.lower() == v.strip().lower()), v)
                     for v in self.variants]
            # once each, as the string form: ["V2", "V2"] timed V2 twice (two rows of one rung)
            self.variants = [v for i, v in enumerate(named) if v not in named[:i]]
        short = {t: name for name, t in DTYPES.items()}
        as_torch = M.DTYPE_NAMES.get(self.dtype.lower()) if isinstance(self.dtype, str) else self.dtype
        if isinstance(as_torch, torch.dtype) and as_torch in short:  # torch.bfloat16 or "bfloat16", as model.build takes
            self.dtype = short[as_torch]
        if isinstance(self.model, os.PathLike):  # a pathlib.Path: check_spec failed on Path.strip
            self.model = os.fspath(self.model)
        self.batches = parse_batches(self.batches)
        if None in (self.prompt_len, self.new_tokens, self.bench_budget_s):  # unset, as on the command line: its defaults
            small = _device.resolve_device(self.device) != "cuda"
            self.prompt_len = (8 if small else 32) if self.prompt_len is None else self.prompt_len
            self.new_tokens = (16 if small else 128) if self.new_tokens is None else self.new_tokens
            self.bench_budget_s = (0.5 if small else 2.0) if self.bench_budget_s is None else self.bench_budget_s
        if self.sampling is None:  # greedy, as the default: run() failed on None.__dict__ after loading the model
            self.sampling = Sampling()
        elif isinstance(self.sampling, dict):  # as a results file's params hold it: run() failed on dict.__dict__
            self.sampling = Sampling.from_fields(self.sampling)
        elif not isinstance(self.sampling, Sampling):
            raise UserError(f"sampling must be a gpuspeed.decode.generate.Sampling or a dict of its fields, got "
                            f"{type(self.sampling).__name__} {self.sampling!r}")
        # `--model=~/m.gguf`: no shell expands a ~ after '=', so it is expanded here (as --out's is)
        if isinstance(self.model, str) and self.model.startswith("~") and self.model not in M.CONFIGS:
            try:
                self.model = str(Path(self.model).expanduser())
            except RuntimeError:  # ~nosuchuser: left as given, and refused as no model
                pass

    def label(self) -> str:
        return run_name(model_key(self.model), self.dtype, self.quant, self.tp)

    @property
    def transformers_rows(self) -> bool:
        """Whether the run has transformers generate rows: asked for (hf), and not under --quant (transformers
        cannot run the int8 weights) nor --tp N (the ranks hold shards; tp.worker drops them)."""
        return self.hf and not self.quant and self.tp == 1


def parse_batches(batches) -> list[int]:
    """--batches as the command line writes it ("8,32"), one size, or a list of sizes (their ranges: check_spec)."""
    if batches is None:
        return []
    if isinstance(batches, int):
        return [batches]
    if isinstance(batches, str):
        try:
            return [int(t) for t in batches.split(",") if t.strip()]
        except ValueError:
            raise UserError(f"--batches takes comma-separated integers like 8,32, got {batches!r}") from None
    return list(batches)


def model_key(model: str) -> str:
    """The name a model's results go under (<key>_<dtype>_... summary keys, rows' "model"): a named model's own; a
    GGUF file's name less .gguf; a folder's whole name (its dots are not a suffix: Path.stem made Llama-3.2-1B and
    Llama-3.1-8B both 'llama-3'), the folder itself for '.', and for a Hugging Face hub cache snapshot
    (models--ORG--NAME/snapshots/<commit>) the repository's NAME, not the commit hash."""
    if model in M.CONFIGS:
        return model
    p = Path(model)
    if p.name in ("", ".", ".."):
        p = p.absolute().resolve()
    name = p.name[:-len(".gguf")] if p.name.lower().endswith(".gguf") else p.name
    if len(p.parts) >= 3 and p.parts[-2] == "snapshots" and p.parts[-3].startswith("models--") and name == p.name:
        name = p.parts[-3].split("--")[-1]
    return re.sub(r"[^A-Za-z0-9.\-]+", "-", name).strip("-").lower() or "model"


def _err(exc: BaseException) -> str:
    return one_line(exc, 300)


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def check_context(what: str, prompt_len: int, new_tokens: int, ctx: int, whose: str = "the model's",
                  at_least: bool = False) -> None:
    """Every rung's cache (and RoPE table) holds V.max_len_for(P, T) positions: the prompt, the new tokens and
    room for a capture's warm-up steps. Past the context, each rung would fail on it alone: refuse it up front."""
    need = V.max_len_for(prompt_len, new_tokens)
    if need > ctx:
        fit = ctx // 16 * 16 - (4 * V.STEPS_PER_REPLAY + 8)  # the largest P + T that max_len_for keeps inside ctx
        if fit < 3:  # a one-token prompt and --new-tokens 2 are the least a run takes
            raise UserError(f"{whose} context of {ctx} is too short for gpuspeed decode: every rung's cache holds "
                            f"prompt + new tokens + {4 * V.STEPS_PER_REPLAY + 8} positions of a graph capture's "
                            f"warm-up (rounded up to 16), so it needs a context of at least {V.max_len_for(1, 2)}")
        raise UserError(f"{what} of {'at least ' if at_least else ''}{prompt_len} token{'s' if prompt_len != 1 else ''} "
                        f"plus {new_tokens} new ones exceeds {whose} context of {ctx}: "
                        f"the cache holds {need} positions (a graph capture's warm-up steps included), so prompt + "
                        f"new tokens can be at most {fit}")


# Spec's numeric fields: a float batch or a string budget failed deep in torch (randint, manual_seed, a '<') or a row
_INTEGER_FIELDS = ("batch", "prompt_len", "new_tokens", "seed", "tp", "max_layers", "long_prompt")
_NUMBER_FIELDS = ("bench_budget_s", "time_cap_s", "read_roof_GBps")


def _check_numbers(spec: Spec) -> None:
    """A one-line UserError for a numeric field of the wrong kind; NumPy's integers and floats become Python's."""
    for key in _INTEGER_FIELDS + _NUMBER_FIELDS:
        value = getattr(spec, key)
        if value is None and key not in ("batch", "new_tokens", "seed", "tp", "bench_budget_s"):
            continue
        whole = key in _INTEGER_FIELDS
        if isinstance(value, bool) or not isinstance(value, numbers.Integral if whole else numbers.Real):
            raise UserError(f"{key} must be {'an integer' if whole else 'a number'}, got {type(value).__name__} "
                            f"{value!r}")
        setattr(spec, key, int(value) if whole else float(value))
    for i, b in enumerate(spec.batches):
        if isinstance(b, bool) or not isinstance(b, numbers.Integral):
            raise UserError(f"batches must be integers, got {type(b).__name__} {b!r}")
        spec.batches[i] = int(b)


def check_spec(spec: Spec) -> None:
    """User mistakes, before any work."""
    _check_numbers(spec)
    if spec.dtype not in DTYPES:
        raise UserError(f"unknown dtype {spec.dtype!r}: use {', '.join(DTYPES)}")
    if spec.batch < 1:
        raise UserError(f"--batch must be >= 1, got {spec.batch}")
    if spec.new_tokens < 2:
        raise UserError(f"--new-tokens must be >= 2 (one from prefill, the rest decoded), got {spec.new_tokens}")
    if spec.prompt is None and spec.prompt_len < 1:
        raise UserError(f"--prompt-len must be >= 1, got {spec.prompt_len}")
    if spec.model not in M.CONFIGS and (not spec.model.strip() or not Path(spec.model).exists()):  # Path("") is "."
        raise UserError(f"no model {spec.model!r}: use {', '.join(M.CONFIGS)} or a path to a .gguf file or HF folder")
    if spec.prompt is not None:
        try:
            spec.prompt.encode("utf-8")
        except UnicodeEncodeError as exc:  # argv bytes that are not UTF-8 arrive as surrogates: the tokenizer's TypeError
            code = ord(spec.prompt[exc.start])
            what = f"the byte 0x{code & 0xFF:02x}" if 0xDC80 <= code <= 0xDCFF else f"a lone surrogate U+{code:04X}"
            raise UserError(f"--prompt is not UTF-8 text ({what} at character {exc.start}): give the text in UTF-8 "
                            "(iconv -f latin1 -t utf-8 converts a Latin-1 file)") from None
    if spec.prompt is not None and spec.model in M.CONFIGS:  # before its random weights are made (an 8B: 32 GB)
        real = checkpoints.smollm2_gguf() if spec.model == "smollm2-135m" else None  # the README's real model
        raise UserError("--prompt needs a checkpoint with a tokenizer (a .gguf file or an HF folder); "
                        "random-weight models take --prompt-len" + (
                            f" (smollm2-135m is random weights of SmolLM2-135M's shapes; the real "
                            f"SmolLM2-135M-Instruct is installed: --model {real})" if real else ""))
    if spec.model in M.CONFIGS and spec.prompt is None:
        ctx = M.CONFIGS[spec.model].max_seq_len
        for what, p in [("a prompt", spec.prompt_len)] + ([("--long-prompt", spec.long_prompt)] if spec.long_prompt else []):
            check_context(what, p, spec.new_tokens, ctx, f"{spec.model}'s")
    for b in spec.batches:
        if b < 1:
            raise UserError(f"batch sizes must be >= 1, got {b}")
    unknown = [v for v in spec.variants if v not in V.ORDER]
    if unknown or not spec.variants:
        raise UserError(f"unknown variant(s) {unknown}: use {', '.join(V.ORDER)}")
    if spec.tp < 1:
        raise UserError(f"--tp must be >= 1, got {spec.tp}")
    if not -2**63 <= spec.seed < 2**63:  # torch's generators take 64 bits (seed + 1, + 2 ... for the prompts)
        raise UserError(f"--seed must fit in 64 bits (-2**63 <= seed < 2**63), got {spec.seed}")
    if spec.quant not in (None, "int8"):
        raise UserError(f"unknown --quant {spec.quant!r}: use int8")
    if spec.max_layers is not None and spec.max_layers < 1:
        raise UserError(f"--layers must be >= 1, got {spec.max_layers}")
    if spec.max_layers is not None and spec.model not in M.CONFIGS:  # the loaders read every layer
        raise UserError(f"--layers shrinks a named model ({', '.join(M.CONFIGS)}); a checkpoint runs all its layers")
    if spec.max_layers is not None and spec.max_layers > M.CONFIGS[spec.model].n_layers:
        raise UserError(f"--layers {spec.max_layers}: {spec.model} has {M.CONFIGS[spec.model].n_layers} layers")
    if spec.long_prompt is not None and spec.long_prompt < 1:
        raise UserError(f"--long-prompt must be >= 1, got {spec.long_prompt}")
    # `not x > 0` also refuses NaN
    if spec.time_cap_s is not None and not spec.time_cap_s > 0:
        raise UserError(f"--time-cap is seconds and must be positive, got {spec.time_cap_s:g}")
    if not 0 < spec.bench_budget_s < float("inf"):  # bench() takes a finite budget: every rung failed on inf
        raise UserError(f"--budget is seconds of timing per variant and must be positive and finite, got "
                        f"{spec.bench_budget_s:g}")
    if spec.read_roof_GBps is not None and not 0 < spec.read_roof_GBps < float("inf"):
        raise UserError(f"--read-roof is GB/s and must be positive and finite, got {spec.read_roof_GBps:g}")
    compiled = [v for v in spec.variants if v in ("V3", "V4c", "V5")]
    if compiled:
        import torch._dynamo

        if spec.compile_backend not in torch._dynamo.list_backends(exclude_tags=()):  # debug backends too
            raise UserError(f"unknown --compile-backend {spec.compile_backend!r} (for {', '.join(compiled)}): use "
                            f"{', '.join(torch._dynamo.list_backends())}")


def load_model(spec: Spec, device: str) -> tuple[checkpoints.Checkpoint, M.Transformer | None]:
    """(checkpoint in the run's dtype, fp32 reference model or None). Random weights are made in fp32 on the
    device and cast, so the fp32 reference is the very model the bf16 one came from."""
    dtype = DTYPES[spec.dtype]
    want_ref = _loads_fp32_copy(spec)
    if spec.model in M.CONFIGS:
        over = {"n_layers": spec.max_layers} if spec.max_layers else {}
        args = M.named_config(spec.model, **over)
        m = M.build(args, device=device, dtype=torch.float32 if want_ref else dtype, seed=spec.seed)
        ref = None
        if want_ref:
            ref, m = m, _cast(m, dtype)
        return checkpoints.Checkpoint(model=m, source="random"), ref
    ck = checkpoints.load(spec.model, device=device, dtype=torch.float32 if want_ref else dtype)
    ref = None
    if want_ref:
        ref = ck.model
        ck.model = _cast(ref, dtype)
    return ck, ref


def _loads_fp32_copy(spec: Spec) -> bool:
    """Whether load_model keeps the fp32 model a bf16/fp16 one is cast from (the agreement check's reference).
    Under --quant the reference is the unquantized model in --dtype, and run() drops the fp32 copy at once: a
    checkpoint is then read straight in --dtype (the same values: each tensor rounds once either way), random
    weights are still drawn in fp32 and cast, to be the very weights of the unquantized run."""
    return spec.agreement and spec.dtype != "fp32" and not (spec.quant and spec.model not in M.CONFIGS)


@torch.no_grad()
def _cast(model: M.Transformer, dtype) -> M.Transformer:
    """A copy of the model in dtype, made parameter by parameter (an 8B model never has two fp32 copies)."""
    out = M.build(model.args, device=model.device, dtype=dtype, seed=None)
    for dst, src in zip(out.parameters(), model.parameters(), strict=True):
        dst.copy_(src)
    return out


def make_prompt(spec: Spec, ck: checkpoints.Checkpoint, device: str) -> tuple[torch.Tensor, object]:
    a = ck.model.args if getattr(ck.model, "tp", None) is None else ck.model.tp.args  # a TP shard: the whole model's
    tok = None
    if spec.prompt is not None:
        tok = ck.tokenizer()
        if tok is None and ck.source == "hf":  # an HF folder, but its tokenizer files were not copied with it
            raise UserError(f"--prompt needs a tokenizer: {ck.path} has no tokenizer.json, tokenizer.model or "
                            "tokenizer_config.json; give --prompt-len for a random prompt")
        if tok is None:
            raise UserError("--prompt needs a checkpoint with a tokenizer (a .gguf file or an HF folder); "
                            "random-weight models take --prompt-len")
        ids = tok(spec.prompt, return_tensors="pt").input_ids
        if ck.add_bos and ck.bos_id is not None and (ids.shape[1] == 0 or ids[0, 0] != ck.bos_id):
            ids = torch.cat([torch.tensor([[ck.bos_id]]), ids], dim=1)
        prompt = ids.repeat(spec.batch, 1)
    else:
        g = torch.Generator().manual_seed(spec.seed + 1)
        prompt = torch.randint(0, a.vocab_size, (spec.batch, spec.prompt_len), generator=g)
    p = prompt.shape[1]
    if p == 0:
        raise UserError("--prompt gives no tokens (and the tokenizer adds no BOS): give it some text")
    if int(prompt.max()) >= a.vocab_size or int(prompt.min()) < 0:  # on a GPU: a device-side assert, a dead context
        raise UserError(f"the tokenizer gives token id {int(prompt.max())}, past the model's vocab of {a.vocab_size}: "
                        "the tokenizer is not this model's")
    for what, n in [("a prompt", p)] + ([("--long-prompt", spec.long_prompt)] if spec.long_prompt else []):
        check_context(what, n, spec.new_tokens, a.max_seq_len)
    return prompt.to(device), tok


def read_ceiling(device: str) -> dict:
    """The read-bandwidth ceiling measured now by the roofline module (GB/s)."""
    from gpuspeed.roofline.ceilings import ceiling_steps

    steps = dict(ceiling_steps(device, quick=True))
    label = "read (Triton)" if device == "cuda" else "read"
    try:
        c = steps[label]()
    finally:
        if "free buffers" in steps:
            steps["free buffers"]()
        _free(device)
    return {"name": c.name, "GBps": c.value, "how": c.how, "error": c.error}


def count_trace(path: str, tokens: int, gpu: bool) -> dict:
    """Kernels and host syncs per token from a profile() trace of one decode of `tokens` tokens."""
    from gpuspeed.profiling.trace import _SYNC_PRONE, STEP_PREFIX, SYNC_APIS, load_trace

    events = load_trace(path).get("traceEvents", [])
    step = next((e for e in events if e.get("cat") == "user_annotation" and e.get("name") == f"{STEP_PREFIX}0"), None)
    t0, t1 = (float(step["ts"]), float(step["ts"]) + float(step.get("dur", 0))) if step else (float("-inf"), float("inf"))
    kernels = sum(1 for e in events if e.get("cat") == "kernel")
    inside = [e for e in events if "ts" in e and t0 <= float(e["ts"]) <= t1]
    if gpu:
        syncs = sum(1 for e in inside if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("name") in SYNC_APIS)
    else:
        syncs = sum(1 for e in inside if e.get("cat") == "python_function" and _SYNC_PRONE.search(e.get("name", "")))
    launches = sum(1 for e in inside if e.get("cat") in ("cuda_runtime", "cuda_driver")
                   and e.get("name") in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                                         "cudaGraphLaunch"))
    # where a step's time goes: the GPU's kernel time, and the host ops that cost the most (inclusive, under
    # the profiler) -- an eager rung far above its kernel time is host-bound, and these ops say on what
    kernel_us = sum(float(e.get("dur", 0)) for e in events if e.get("cat") == "kernel")
    # tensor parallel: the collectives' kernels (NCCL's names), for the all-reduce's share of the step
    comm_us = sum(float(e.get("dur", 0)) for e in events if e.get("cat") == "kernel"
                  and re.search(r"nccl|all_?reduce|all_?gather", e.get("name", ""), re.I))
    ops: dict = {}
    for e in inside:
        if e.get("cat") == "cpu_op":
            ops[e["name"]] = ops.get(e["name"], 0.0) + float(e.get("dur", 0))
    top = sorted(ops.items(), key=lambda kv: -kv[1])[:6]
    return {"kernels_per_token": kernels / tokens if gpu else None, "host_syncs_per_token": syncs / tokens,
            "launch_calls_per_token": launches / tokens if gpu else None, "profiled_tokens": tokens,
            "kernel_ms_per_token": kernel_us / tokens / 1e3 if gpu else None,
            "comm_kernel_ms_per_token": comm_us / tokens / 1e3 if gpu else None,
            "profiled_ms_per_token": (t1 - t0) / tokens / 1e3 if step else None,
            "host_top_ops_us_per_token": {k: round(v / tokens, 1) for k, v in top}}


class _Logits:
    def __init__(self):
        self.steps: list[torch.Tensor] = []

    def __call__(self, logits):
        self.steps.append(logits.detach().float().clone())


def _bench_kw(device: str, budget_s: float) -> dict:
    kw = dict(budget_s=budget_s, min_samples=5, warmup_s=min(0.5, budget_s / 2), name="decode")
    if device == "cuda":
        kw["mode"] = "events"  # a whole generation: long, with host work between launches
    return kw


EAGER_TIMED_STEPS = 32  # decode steps timed for the Python-driven rungs (V0, V1, V2; transformers' loops)


def timed_steps_for(engine, steps: int) -> int:
    """Decode steps one timed generation runs: all of them for the compiled and graphed rungs, the first
    EAGER_TIMED_STEPS for the eager ones. bench runs a generation at least 7 times (2 warm-up, 5 samples): 127
    eager steps of the 8B at ~30 ms are ~27 s a rung. Their per-token cost hardly moves with the position at
    these lengths (launch-bound), and for V0 the short run under-states its cost (a shorter prefix to re-run),
    so the speedups over V0 err low."""
    return min(steps, EAGER_TIMED_STEPS) if engine.eager else steps


def text_tokens(tokens: torch.Tensor, eos_ids=None) -> int:
    """The tokens a generation's text holds (tokens [B, n], the prefill's first included): in each row, those up to
    and including its first EOS, summed over the rows. The EOS a finished row repeats after it are not text."""
    if not eos_ids:
        return int(tokens.numel())
    hit = torch.zeros_like(tokens, dtype=torch.bool)
    for e in eos_ids:
        hit |= tokens == int(e)
    after = (hit.long().cumsum(1) - hit.long()) > 0  # an EOS came before: padding
    return int((~after).sum())


def _predictions(logits: list) -> torch.Tensor:
    """Greedy's choice [B, steps] at each recorded step: the logits' argmax, as the rungs take it."""
    return torch.stack([step.argmax(-1).cpu() for step in logits], dim=1)


def teacher_forced(engine, prompt: torch.Tensor, ref_tokens: torch.Tensor, steps: int) -> tuple[torch.Tensor, list]:
    """The variant's greedy predictions [B, steps + 1] and logits when every step is fed the reference's previous
    token (the prefill sees the prompt): what it predicts given the same prefix as the reference. Taken from the
    logits, not the tokens the engine emitted: after a predicted EOS those are EOS whatever the step predicts."""
    rec = _Logits()
    dev = prompt.device
    engine.prefill(prompt, on_logits=rec)
    engine.decode(ref_tokens[:, 0].to(dev), steps, on_logits=rec, forced=ref_tokens[:, 1:steps + 1].to(dev))
    return _predictions(rec.steps), rec.steps


def _forced_agreement(tokens, ref_tokens, logits, ref_logits) -> dict:
    """tokens: teacher_forced's predictions; the reference's are its logits' argmax at each step (ref_tokens hold EOS
    after its first EOS, whatever it predicted there, while the rung fed those EOS predicts on)."""
    n = min(tokens.shape[1], ref_tokens.shape[1], len(logits), len(ref_logits))
    same = tokens[:, :n] == _predictions(ref_logits[:n])
    err, rel = logit_error(logits[:n], ref_logits[:n])
    return {"teacher_forced_agreement_vs_fp32": float(same.float().mean()), "teacher_forced_steps": n,
            "teacher_forced_max_logit_err_vs_fp32": err, "teacher_forced_rel_logit_err_vs_fp32": rel}


def measure_variant(name: str, m: M.Transformer, spec: Spec, prompt: torch.Tensor, device: str, *, eos_ids=None,
                    trace_dir: Path | None = None, bench_budget_s: float | None = None,
                    ref: tuple | None = None, deferred: list | None = None) -> tuple[dict, torch.Tensor, list]:
    """One variant: (row, tokens [B, T], recorded logits per step or []). ref: the fp32 reference's (tokens,
    logits), for the teacher-forced agreement columns.

    deferred: a list to append the profiling pass to, as a callable that fills the row's profile columns and then
    drops the engine, for the caller to run once every variant is timed. A torch.profiler session leaves CUPTI
    attached to the process (Kineto skips cuptiFinalize unless TEARDOWN_CUPTI=1: pytorch/pytorch#144455), and its
    callbacks add host time to every later launch, so an eager rung timed after another rung's profile reads slow
    (a scratch probe on the H200 host: a 512-float add from ~10 to ~15 us a launch). None: profiled here."""
    from gpuspeed import bench, peak_memory
    from gpuspeed.decode.tp import lockstep
    from gpuspeed.profiling.run import record_trace

    bench = lockstep(bench, getattr(m, "tp", None))  # TP ranks make the same calls (collectives) as rank 0
    # a TP rank that failed and went on would leave the others in a collective until the group's timeout
    in_tp = getattr(m, "tp", None) is not None

    b, p, t = prompt.shape[0], prompt.shape[1], spec.new_tokens
    row: dict = {"variant": name, "what": V.VARIANTS[name], "batch": b, "prompt_len": p, "new_tokens": t}
    engine = V.make_engine(name, m, b, V.max_len_for(p, t), sampling=spec.sampling, eos_ids=eos_ids,
                           compile_backend=spec.compile_backend,
                           reference=ref if (ref is not None and spec.sampling.greedy) else None)
    rec = _Logits()
    want_logits = spec.agreement or spec.dtype == "fp32"
    # the per-step logits come from the warm generation itself where asking for them runs the same code
    in_place = want_logits and not engine.logits_change_path
    if device == "cuda":  # this variant's own peak (the allocator's peak is a running maximum otherwise)
        _sync(device)
        torch.cuda.reset_peak_memory_stats()
        held_before = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    tokens = generate(engine, prompt, t, on_logits=rec if in_place else None)  # compiles and captures happen here
    _sync(device)
    row["first_generation_s"] = time.perf_counter() - t0
    for key in ("compile_s", "capture_s_k1", f"capture_s_k{V.STEPS_PER_REPLAY}", "explain_s", "graph_breaks",
                "recompiles", "fullgraph_ok", "graph_mode", "triton_gemv_shapes", "attention", "fused_step_attention",
                "kernel_choice_s", "kernel_choices", "insides", "compiled_replay_us", "pdl_replay_us",
                "pdl_token_agreement", "insides_replay_steps", "pdl_capture_s", "insides_replay_us",
                "insides_token_agreement", "insides_rel_logit_err_vs_reference", "insides_reference_steps"):
        if key in engine.info:
            row[key] = engine.info[key]
    row["notes"] = list(engine.info.get("notes", []))
    budget = bench_budget_s or spec.bench_budget_s
    # the timed decodes run every step past an EOS (ignore-EOS, as llama.cpp's and vLLM's benchmarks): stopped at
    # it, V0/V1 timed 1 step and V2+ 16 (their first check), and the ladder's ratios compared different work
    steps = timed_steps_for(engine, t - 1)
    if steps < t - 1:
        row["notes"].append(f"timed over the first {steps} of {t - 1} decode steps (an eager rung: "
                            "each timed generation is repeated >= 7 times)")
    mp = bench(lambda: engine.prefill(prompt), **_bench_kw(device, budget / 2))
    first = engine.prefill(prompt)
    md = bench(lambda: engine.decode(first, steps, stop_at_eos=False), **_bench_kw(device, budget))
    row |= {"prefill_ms": mp.median * 1e3, "prefill_rel_iqr": mp.rel_iqr, "decode_ms": md.median * 1e3,
            "ms_per_token": md.median * 1e3 / steps, "decode_rel_iqr": md.rel_iqr, "decode_samples": md.n,
            "decode_throttled": md.throttled, "timed_steps": steps, "timed_tokens": b * steps,
            "text_tokens": text_tokens(tokens, eos_ids), "tokens_per_s": b * steps / md.median}
    wb = weight_bytes_per_token(m)  # as stored: int8 + scales under --quant, a rank's shard under --tp
    row["weight_bytes_per_token"] = wb
    row["weight_GBps"] = wb / (md.median / steps) / 1e9
    if hasattr(engine, "cache") and hasattr(engine.cache, "nbytes"):
        row["kv_cache_bytes"] = engine.cache.nbytes
    mem = peak_memory(lambda: engine.decode(first, steps, stop_at_eos=False), device=device)
    row["peak_decode_bytes"] = mem.peak_bytes
    if device == "cuda":
        # the process's peak while this variant ran (weights, and whatever else is alive: rungs awaiting their
        # profile), and this variant's own share of it (its cache, graphs, compiled buffers and activations)
        row["peak_vram_bytes"] = torch.cuda.max_memory_allocated()
        row["variant_vram_bytes"] = torch.cuda.max_memory_allocated() - held_before

    def profile_pass():
        # a few tokens give kernels and syncs per token exactly; the trace of an eager 32-layer model grows
        # by ~2 MB a token (Python stacks on every op), so deep models profile fewer
        n = min(steps, 8 if m.args.n_layers <= 16 else 4)
        path = (trace_dir / f"{spec.label()}_{name}.trace.json.gz") if trace_dir else None
        try:
            # profile()'s trace pass alone: its source-line pass runs the call under a TorchFunctionMode,
            # which a fullgraph-compiled step refuses to trace
            if path is None:
                path = Path(tempfile.mkdtemp(prefix="gpuspeed-decode-")) / f"{spec.label()}_{name}.trace.json.gz"
            engine.decode(first, n, stop_at_eos=False)
            _sync(device)
            record_trace(lambda: engine.decode(first, n, stop_at_eos=False), (), {}, steps=1, on_gpu=device == "cuda", path=path)
            row.update(count_trace(str(path), n, device == "cuda"))
            row["trace"] = str(path) if trace_dir else None
        except Exception as exc:  # the timing stands without the trace
            if in_tp:
                raise
            row["profile_error"] = _err(exc)

    if spec.profile and deferred is None:
        profile_pass()
    if want_logits and not in_place:
        generate(engine, prompt, t, on_logits=rec)
    if ref is not None and spec.sampling.greedy:
        ref_tokens, ref_logits = ref
        n = min(ref_tokens.shape[1] - 1, steps)  # the eager rungs force as many steps as they time
        try:
            ftoks, flogits = teacher_forced(engine, prompt, ref_tokens, n)
            row |= _forced_agreement(ftoks, ref_tokens, flogits, ref_logits)
        except Exception as exc:  # the row stands without it
            if in_tp:
                raise
            row["teacher_forced_error"] = _err(exc)
    if spec.profile and deferred is not None:
        def profile_then_drop():
            try:
                profile_pass()
            finally:
                engine.__dict__.clear()
        deferred.append((name, row, profile_then_drop))
        return row, tokens, rec.steps
    engine.__dict__.clear()  # drop the cache and graphs now (the closures above still name the engine)
    _free(device)
    return row, tokens, rec.steps


def _reference(ref_model: M.Transformer, spec: Spec, prompt, eos_ids):
    """fp32 tokens and per-step logits for the agreement columns: the static-cache step captured as a graph
    (V4, one replay per step: the eager V2 loop took seconds on the 8B), the eager step where capture fails.
    It samples as the rungs do (the same seed draws the same numbers), so a sampled run is compared like for like."""
    engine = V.make_engine("V4", ref_model, prompt.shape[0], V.max_len_for(prompt.shape[1], spec.new_tokens),
                           sampling=spec.sampling, eos_ids=eos_ids)
    rec = _Logits()
    tokens = generate(engine, prompt, spec.new_tokens, on_logits=rec)
    engine.__dict__.clear()
    return tokens, rec.steps


def _same_length(a: torch.Tensor, b: torch.Tensor, eos_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """With EOS ids, runs stop at different steps (V0/V1 at once, V2+ at the next check): after a row's
    first EOS every token counts as EOS, and the shorter run is padded with EOS."""
    if not eos_ids:
        return a, b
    n = max(a.shape[1], b.shape[1])
    eos = int(eos_ids[0])
    out = []
    for t in (a, b):
        t = torch.cat([t, torch.full((t.shape[0], n - t.shape[1]), eos, dtype=t.dtype)], dim=1)
        hit = torch.zeros_like(t, dtype=torch.bool)
        for e in eos_ids:
            hit |= t == int(e)
        after = hit.cumsum(1) > 0
        out.append(torch.where(after, torch.full_like(t, eos), t))
    return out[0], out[1]


def decode_text(tok, ids: list, eos_ids) -> str:
    """One sequence's generated tokens as text, up to and including its first EOS."""
    stop = next((i for i, t in enumerate(ids) if t in (eos_ids or [])), len(ids) - 1)
    return tok.decode(ids[:stop + 1])


def _agreement(tokens, ref_tokens, logits, ref_logits, eos_ids=None) -> dict:
    tokens, ref_tokens = _same_length(tokens, ref_tokens, eos_ids)
    n = min(tokens.shape[1], ref_tokens.shape[1])
    same = (tokens[:, :n] == ref_tokens[:, :n])
    diverged = (~same).any(0).nonzero()
    first = int(diverged[0]) if len(diverged) else n
    # logits are comparable while both runs saw the same tokens: up to and including the first divergence
    k = min(first + 1, len(logits), len(ref_logits))
    err = worst(float((a.cpu() - r.cpu()).abs().max()) for a, r in zip(logits[:k], ref_logits[:k], strict=True))
    return {"token_agreement": float(same.float().mean()), "first_divergence": first, "max_logit_err": err,
            "logit_err_steps": k}


PROFILE_PASS_RESERVE_S = 6.0  # a deferred profiling pass (a few tokens traced): 1-3 s for a graphed rung of the 1B
# on the H200, more for an eager one (Python stacks on every op)

HF_KINDS = {"HF static": {"cache_implementation": "static"}, "HF dynamic": {}, "HF no-cache": {"use_cache": False}}
HF_NOCACHE_MAX_PARAMS = 5e8  # the no-cache row re-runs the prefix every step: small models only


def hf_row(hf, label: str, m: M.Transformer, spec: Spec, prompt, device: str, our_tokens, eos_ids=None) -> dict:
    """transformers generate (label: "HF static" or "HF dynamic") on the same weights: one row."""
    from gpuspeed import bench

    # the static cache is sized by max_new_tokens (another count compiles another shape): it runs them all;
    # the Python-driven kinds run as many steps as our eager rungs time
    t = spec.new_tokens if label == "HF static" else min(spec.new_tokens, EAGER_TIMED_STEPS + 1)
    kw = dict(HF_KINDS[label])
    s = spec.sampling
    what = f"transformers generate, {label.split()[1]}{'' if 'no-' in label else ' cache'}"
    if s.greedy:
        kw["do_sample"] = False
    else:  # the rungs' sampling, so the rows time the same work; transformers' own default top-k (50) is turned off
        kw |= {"do_sample": True, "temperature": s.temperature, "top_k": s.top_k or 0,
               "top_p": 1.0 if s.top_p is None else s.top_p}
        what += (f", sampled (temperature {s.temperature:g}" + (f", top-k {s.top_k}" if s.top_k else "")
                 + (f", top-p {s.top_p:g}" if s.top_p is not None else "") + ")")
    row = {"variant": label, "what": what,
           "batch": prompt.shape[0], "prompt_len": prompt.shape[1], "new_tokens": t, "timed_steps": t - 1}

    def run(n):
        # to_hf's model has no EOS: exactly n tokens, the same count each timed call
        return hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, pad_token_id=0, **kw)

    t0 = time.perf_counter()
    out = run(t)
    _sync(device)
    row["first_generation_s"] = time.perf_counter() - t0
    toks = out[:, prompt.shape[1]:].cpu()
    if our_tokens is not None and spec.dtype == "fp32" and spec.sampling.greedy:  # sampled: other random numbers
        # ours stop at an EOS (a checkpoint's prompt), transformers' run on: compared up to each row's first EOS
        a, b = _same_length(toks, our_tokens[:, :t], eos_ids)
        row["tokens_identical_to_V0"] = bool(a.shape == b.shape and (a == b).all())
    # decode = generation minus a prefill forward (generate(max_new_tokens=1) would size the static cache
    # differently and make transformers compile a second shape)
    mt = bench(lambda: run(t), **_bench_kw(device, spec.bench_budget_s))
    m1 = bench(lambda: hf(prompt), **_bench_kw(device, spec.bench_budget_s / 2))
    dec = mt.median - m1.median
    row |= {"prefill_ms": m1.median * 1e3, "generate_ms": mt.median * 1e3}
    if not dec > 0:  # noise put the prefill past the whole generation: no decode time to report
        row["error"] = (f"decode time not measurable: generate {mt.median * 1e3:.3g} ms is not above its prefill "
                        f"{m1.median * 1e3:.3g} ms (±{100 * max(mt.rel_iqr, m1.rel_iqr):.0f} %): a noisy machine")
        return row
    row |= {"decode_ms": dec * 1e3,
            "ms_per_token": dec * 1e3 / (t - 1), "ms_per_token_incl_prefill": mt.median * 1e3 / t,
            "decode_rel_iqr": mt.rel_iqr, "decode_samples": mt.n, "tokens_per_s": prompt.shape[0] * (t - 1) / dec}
    wb = weight_bytes_per_token(m)
    row["weight_GBps"] = wb / (row["ms_per_token"] * 1e-3) / 1e9
    return row


def _partial_of_this_run(path: Path, since: float) -> bool:
    import json

    try:
        return path.stat().st_mtime >= since and json.loads(path.read_text())["params"].get("partial") is True
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def partial_kept(out, since: float) -> str | None:
    """Where a run stopped part-way left the rungs it measured, in words (None: nothing of this run's is there): the
    decode.json in `out` that run() rewrites as each rung ends (decode.partial.json where a complete decode.json was
    there: _partial), marked params.partial and written after `since` (the run's start, time.time(): an earlier
    run's file is not this one's)."""
    if not out:
        return None
    for name in ("decode.partial.json", "decode.json"):
        path = Path(out) / name
        if _partial_of_this_run(path, since):
            kept = f"; the complete {path.with_name('decode.json')} is kept" if name != "decode.json" else ""
            return f"the rungs measured are in {path} (marked partial){kept}"
    return None


def drop_partial(out, since: float) -> None:
    """A finished run's decode.partial.json (its rungs are in decode.json now): not left to be taken for a later one."""
    path = Path(out) / "decode.partial.json" if out else None
    if path is not None and _partial_of_this_run(path, since):
        path.unlink(missing_ok=True)


def _partial(spec: Spec, rows: list, notes: list, roof: dict | None = None) -> None:
    """With --out, the rows so far go to decode.json after every variant: a run killed by a time limit
    still leaves what it measured (the final write replaces it)."""
    if not spec.out:
        return
    from gpuspeed.results import make_results, partial_stem, write_results

    try:
        hf = [r for r in rows if str(r.get("variant", "")).startswith("HF")]
        extra = [r for r in rows if r.get("study") in ("batch", "long_prompt")]
        ladder = [r for r in rows if r not in hf and r not in extra]
        summary = summarize(spec.label(), ladder, extra, hf, spec)
        # named as the finished run's rows are (tp.add_tp_figures): a merge tells a tp run's rows by their tp
        tags = ({"quant": spec.quant} if spec.quant else {}) | ({"tp": spec.tp} if spec.tp > 1 else {})
        doc = make_results("decode", params={"model": spec.model, "dtype": spec.dtype, "partial": True,
                                             "read_ceiling": roof, "quant": spec.quant, "tp": spec.tp},
                           summary=summary,
                           rows=[dict(r, model=model_key(spec.model), dtype=spec.dtype, **tags) for r in rows],
                           notes=notes + ["partial: the run had not finished when this was written"],
                           device=spec.device)
        if spec.quant:  # named as the finished run's are: its reference is the unquantized model
            from gpuspeed.decode import quant

            quant.relabel(doc, spec.label())
        # a complete decode.json there (an earlier run's) is kept: this run's rungs go beside it till the run ends
        write_results(doc, Path(spec.out) / f"{partial_stem(spec.out, 'decode')}.json")
    except Exception:  # never lose the run over a partial write
        pass


def has_reference(spec: Spec) -> bool:
    """Whether run() makes a reference run before the rungs: the fp32 model a bf16/fp16 one is cast from (the
    agreement check's), or under --quant the unquantized model."""
    return bool(spec.quant) or _loads_fp32_copy(spec)


def plan(spec: Spec, args: M.ModelArgs | None = None) -> list[tuple[str, str, object]]:
    """What run() measures after loading, in its order: (progress text, kind, key) with kind ladder (key: the
    variant), long_prompt or batch (key: the size) or hf (key: the transformers row). args: the model's shapes
    (None: a named model's, else assumed small enough for transformers' no-cache row)."""
    if args is None and spec.model in M.CONFIGS:
        args = M.named_config(spec.model, **({"n_layers": spec.max_layers} if spec.max_layers else {}))
    label = spec.label()
    # the order a time cap cuts from the end: the rungs and rows the summary needs first
    names = sorted(spec.variants, key=V.PRIORITY.index)
    first, later = [n for n in names if n in V.PRIORITY[:4]], [n for n in names if n not in V.PRIORITY[:4]]
    steps: list[tuple[str, str, object]] = [(f"{label} {n}", "ladder", n) for n in first]
    long_step = [(f"{label} prompt {spec.long_prompt}", "long_prompt", spec.long_prompt)] if spec.long_prompt else []
    if first:  # the long prompt runs the best rung measured before it: after V5/V4/V2/V0 when any was asked for
        steps += long_step
    if spec.transformers_rows:
        steps.append((f"{label} transformers static", "hf", "HF static"))
    steps += [(f"{label} {n}", "ladder", n) for n in later]
    if not first:  # else after every rung asked for (V1, V3, V4c)
        steps += long_step
    if spec.transformers_rows:
        steps.append((f"{label} transformers dynamic", "hf", "HF dynamic"))
        if args is None or args.param_count() < HF_NOCACHE_MAX_PARAMS:
            steps.append((f"{label} transformers no-cache", "hf", "HF no-cache"))
    # each batch size once (--batches 8,8 measured it twice, two rows for one summary key); the run's own is the ladder
    steps += [(f"{label} batch {b}", "batch", b) for b in dict.fromkeys(spec.batches) if b != spec.batch]
    return steps


def progress_steps(spec: Spec, args: M.ModelArgs | None = None) -> int:
    """How many times run() calls its progress callback when every step succeeds: loading, the read ceiling, the
    reference run where there is one, plan()'s steps and a profiling pass for each rung (run() gives the exact
    count to its `total` callback as it learns it: a checkpoint's size, a rung that failed has no pass)."""
    steps = plan(spec, args)
    return 2 + has_reference(spec) + len(steps) + (sum(kind == "ladder" for _, kind, _ in steps) if spec.profile else 0)


def run(spec: Spec, progress: Callable[[str], None] | None = None, tp=None,
        total: Callable[[int], None] | None = None) -> dict:
    """The whole study for one model and dtype; returns the results document (tp: this rank, tp.worker).
    progress(text) is called as each step starts; total(n), where given, with the number of those calls once the
    model is loaded and again where it changes (a rung that failed has no profiling pass): progress_steps(spec)
    before the run, exact at its end."""
    from gpuspeed.results import make_results

    check_spec(spec)
    if tp is None and spec.tp > 1:  # the ranks, as --tp N starts them (one process ran the whole model as "tpN")
        from gpuspeed.decode import tp as _tp

        return _tp.launch(spec, spec.tp, progress=progress, total=total)
    device = _device.resolve_device(spec.device)
    if tp is None:  # a rank's shard was checked by tp.launch, before the ranks started
        check_fits(spec, device)  # the weights and caches fit, before any is made or read (the CLI relied on its own)
    said = [0]

    def say(what: str) -> None:
        said[0] += 1
        if progress:
            progress(what)

    def set_total(n: int) -> None:
        if total:
            total(n)
    t_start = time.perf_counter()
    notes: list[str] = []
    if device != "cuda":
        notes.append(f"{_device.why_cpu()}: the CPU runs the ladder (graphs run eagerly, GB/s against the CPU's read "
                     "ceiling); numbers are not GPU numbers")
    say("loading model")
    if tp is not None:
        from gpuspeed.decode import tp as _tp

        ck, ref_model = _tp.load_model(spec, device, tp)
    else:
        ck, ref_model = load_model(spec, device)
    if spec.quant:
        from gpuspeed.decode import quant

        # int8 is compared with the dtype it replaces: drop the fp32 copy before prepare() makes that dtype's copy
        # (held here, it made three copies at once: fp32, the model and the reference; 8 bytes a parameter)
        ref_model = None
        _free(device)
        ck, ref_model = quant.prepare(ck, None, spec, notes)  # the reference: the unquantized model
        if spec.hf:
            notes.append(f"{spec.quant}: no transformers rows (transformers cannot run the {spec.quant} weights)")
    m = ck.model
    prompt, tok = make_prompt(spec, ck, device)
    if tp is None and spec.model not in M.CONFIGS:  # named models: check_fits, before their weights were made
        check_run_memory(spec, m.args, prompt.shape[1], weight_bytes_per_token(m), _device.get_device(device).mem_bytes,
                         device, model_key(spec.model))
    eos_ids = ck.eos_ids if spec.prompt is not None else None
    label = spec.label()
    trace_dir = Path(spec.out) / "traces" if (spec.out and spec.profile) else None
    if trace_dir:
        trace_dir.mkdir(parents=True, exist_ok=True)
    say("read ceiling")
    if spec.read_roof_GBps:
        roof = {"name": "read", "GBps": spec.read_roof_GBps, "how": "given by --read-roof, not measured by this run"}
    else:
        try:
            roof = read_ceiling(device)
        except Exception as exc:
            roof = {"GBps": None, "error": _err(exc)}
    roof_GBps = roof.get("GBps")

    ref_tokens = ref_logits = None
    if ref_model is not None:
        say("fp32 reference")
        ref_tokens, ref_logits = _reference(ref_model, spec, prompt, eos_ids)
        del ref_model
        _free(device)

    rows: list[dict] = []  # the ladder
    extra_rows: list = []  # batch sweep and long prompt of the best variant
    hf: list = []  # transformers
    state: dict = {"v0_tokens": None, "hf_model": None}
    outputs: dict = {}  # variant -> (tokens, per-step logits)
    texts: dict = {}
    batch_texts: dict = {}  # variant -> every sequence's text, where a batch's sequences differ
    profiles: list = []  # (variant, row, its profiling pass): run once every timing is done (measure_variant says why)

    def over_cap() -> bool:
        # the rungs awaiting their profiling pass keep their share inside the cap: the passes run after it, and a
        # driver's hard kill soon after the cap (benchmarks/decode.py) took four of the 1B's seven at b651bde
        reserve = PROFILE_PASS_RESERVE_S * len(profiles)
        late = bool(spec.time_cap_s and time.perf_counter() - t_start + reserve > spec.time_cap_s)
        if tp is not None:  # a rung's collectives run on every rank or on none: rank 0's clock decides for all
            from gpuspeed.decode.tp import rank0_says

            late = rank0_says(tp, late)
        return late

    def best_so_far():
        ok = [r for r in rows if "ms_per_token" in r]
        return min(ok, key=lambda r: r["ms_per_token"]) if ok else None

    def ladder(name):
        ref = (ref_tokens, ref_logits) if ref_tokens is not None else None
        row, tokens, logits = measure_variant(name, m, spec, prompt, device, eos_ids=eos_ids, trace_dir=trace_dir,
                                              ref=ref, deferred=profiles)
        outputs[name] = (tokens, logits)  # compared with V0's once every rung has run (V0 is not first)
        if name == "V0":
            state["v0_tokens"] = tokens
        if ref_tokens is not None:
            row |= {f"{k}_vs_fp32": v for k, v in _agreement(tokens, ref_tokens, logits, ref_logits, eos_ids).items()}
        if tok is not None:
            seqs = [decode_text(tok, ids, eos_ids) for ids in tokens.tolist()]
            texts[name] = row["text"] = seqs[0]
            if len(set(seqs)) > 1:  # sampled sequences differ: each one's, not the first's as the batch's
                batch_texts[name] = row["texts"] = seqs
        rows.append(row)

    def extra(kind, size):
        best = best_so_far()
        if best is None:
            raise RuntimeError("no ladder variant succeeded")
        sub = Spec(**{**spec.__dict__, "profile": False, "agreement": False})
        if kind == "long_prompt":
            check_context("--long-prompt", size, spec.new_tokens, m.args.max_seq_len)
            g = torch.Generator().manual_seed(spec.seed + 2)
            p = torch.randint(0, m.args.vocab_size, (spec.batch, size), generator=g).to(device)
        else:
            p = prompt[:1].repeat(size, 1)
        # the EOS ids, as the ladder's: its text ends there (text_tokens), while the timing runs past it in both
        row, _, _ = measure_variant(best["variant"], m, sub, p, device, eos_ids=eos_ids, trace_dir=None)
        row["study"] = kind
        extra_rows.append(row)

    def transformers_row(label):
        import transformers  # noqa: F401  (ImportError: a note, no row)

        if state["hf_model"] is None:
            state["hf_model"] = checkpoints.to_hf(m)
        hf.append(hf_row(state["hf_model"], label, m, spec, prompt, device, state["v0_tokens"], eos_ids))

    do = {"ladder": ladder, "long_prompt": lambda size: extra("long_prompt", size), "hf": transformers_row,
          "batch": lambda size: extra("batch", size)}
    tasks = [(what, kind, key, lambda kind=kind, key=key: do[kind](key)) for what, kind, key in plan(spec, m.args)]
    set_total(said[0] + len(tasks) + (sum(kind == "ladder" for _, kind, _, _ in tasks) if spec.profile else 0))

    for what, kind, key, task in tasks:
        say(what)
        too_large = naive_too_large(spec, m, prompt.shape[1], device) \
            if (kind, key) == ("ladder", "V0") else None
        if too_large:  # past the host's memory the OOM killer ends the whole run, every row lost: skipped, said why
            rows.append({"variant": key, "skipped": too_large})
            continue
        if over_cap():
            why = f"time cap of {spec.time_cap_s:g} s reached"
            if kind == "ladder":
                rows.append({"variant": key, "skipped": why})
            elif kind == "hf":
                hf.append({"variant": key, "skipped": why})
            else:
                extra_rows.append({"study": kind, "batch" if kind == "batch" else "prompt_len": key, "skipped": why})
            continue
        try:
            task()
        except Exception as exc:
            if tp is not None:  # not on one rank alone: the others would wait in this task's collective (600 s)
                raise
            err = {"error": _err(exc), "traceback": traceback.format_exc(limit=3)[-800:]}
            if isinstance(exc, ImportError):
                notes.append(f"{what}: {exc} (no row)")
            elif kind == "ladder":
                rows.append({"variant": key, **err})
            elif kind == "hf":
                hf.append({"variant": key, **err})
            else:
                extra_rows.append({"study": kind, "batch" if kind == "batch" else "prompt_len": key, **err})
        _partial(spec, rows + extra_rows + hf, notes, roof)
        _free(device)
    if state["hf_model"] is not None:
        state["hf_model"].to("meta")  # its copy of the weights goes now
        state["hf_model"] = None
        _free(device)
    fastest = max((r["weight_GBps"] for r in rows + extra_rows + hf if r.get("weight_GBps")), default=0.0)
    if roof_GBps and fastest > roof_GBps and not spec.read_roof_GBps and tp is None:
        # a rung read faster than the ceiling measured before it, which met a busy machine (a shared CPU's bandwidth
        # wanders by tens of %): a ceiling is the most the machine did, so the faster of two measurements is kept
        set_total(said[0] + 1 + len(profiles))
        say("read ceiling again")
        try:
            again = read_ceiling(device)
        except Exception:  # the first measurement stands
            again = {}
        if (again.get("GBps") or 0) > roof_GBps:
            roof = again | {"how": f"{again['how']}; measured again after the rungs, one of which read faster than "
                                   f"the first measurement ({roof_GBps:.4g} GB/s)"}
            roof_GBps = roof["GBps"]
    # every timing above ran before any profiler session. The passes run past a time cap too: a few tokens each,
    # they belong to rungs already timed (kernels and syncs per token), and each result is written as it comes
    broken = None  # a CUDA error in one pass leaves the context unusable: the later passes are skipped, the rows kept
    set_total(said[0] + len(profiles))  # a pass for each rung measured: none for one that failed or was skipped
    for name, row, profile_then_drop in profiles:
        if broken:
            row["profile_error"] = f"not profiled: an earlier pass broke the CUDA context ({broken})"
            continue
        say(f"{label} {name} profile")
        profile_then_drop()
        _partial(spec, rows + extra_rows + hf, notes, roof)
        try:
            _free(device)
        except Exception as exc:
            if tp is not None:  # the other ranks would wait in the next pass's collectives
                raise
            broken = _err(exc)
            notes.append(f"profiling stopped after {name}'s pass: {broken}")
    profiles.clear()
    set_total(said[0])  # a broken CUDA context skipped the passes after it
    if not broken:
        _free(device)

    rows.sort(key=lambda r: V.ORDER.index(r["variant"]))  # the ladder's order, whatever order ran
    asked = spec.batch * spec.new_tokens  # text_tokens count every sequence's
    ended = sorted({r["text_tokens"] for r in rows if "text_tokens" in r and r["text_tokens"] < asked})
    if ended:  # the texts stop at their EOS; the timings ran on past it (measure_variant)
        timed = ", ".join(f"{r['variant']} {r['timed_steps']}" for r in rows if "timed_steps" in r)
        several = f" ({spec.batch} sequences of {spec.new_tokens})" if spec.batch > 1 else ""
        notes.append(f"an EOS ended the text{'s' if several else ''} after {' or '.join(map(str, ended))} of the "
                     f"{asked} tokens asked for{several}; the timed generations ran on past it, EOS ignored as "
                     f"llama.cpp's and vLLM's benchmarks do, so every rung times the same work (decode steps timed: "
                     f"{timed}; each row's timed_tokens against its text_tokens)")
    if "V0" in outputs:
        v0_tokens, v0_logits = outputs["V0"]
        for r in rows:
            if r["variant"] not in outputs:
                continue
            tokens, logits = outputs[r["variant"]]
            a, b = _same_length(tokens, v0_tokens, eos_ids)
            r["tokens_identical_to_V0"] = bool(a.shape == b.shape and (a == b).all())
            if logits and v0_logits:
                r["max_logit_diff_vs_V0"] = _agreement(tokens, v0_tokens, logits, v0_logits, eos_ids)["max_logit_err"]
            if r["variant"] == "V0":
                r["reference"] = True
    elif outputs:
        notes.append("V0 was not measured: no row is compared with V0's tokens")
    outputs.clear()
    ok = [r for r in rows if "ms_per_token" in r]
    by = {r["variant"]: r for r in ok}
    prev = None
    for r in ok:
        if "V0" in by:
            r["speedup_over_V0"] = by["V0"]["ms_per_token"] / r["ms_per_token"]
        if prev is not None:
            r["speedup_over_previous"] = prev["ms_per_token"] / r["ms_per_token"]
        prev = r
    for r in rows + extra_rows + hf:
        if roof_GBps and "weight_GBps" in r:
            r["pct_of_read_roof"] = 100 * r["weight_GBps"] / roof_GBps
        for choice in (r.get("kernel_choices") or {}).values():  # how far cuBLAS's GEMV sits from the roof
            if roof_GBps and choice.get("cublas_GBps"):
                choice["cublas_pct_of_read_roof"] = 100 * choice["cublas_GBps"] / roof_GBps
    over = list(dict.fromkeys(r["variant"] for r in rows + extra_rows + hf if (r.get("pct_of_read_roof") or 0) > 100))
    if over:
        notes.append(f"{', '.join(over)} read the weights faster than the read ceiling ({roof_GBps:.4g} GB/s, "
                     f"{'given by --read-roof' if spec.read_roof_GBps else 'measured in this run'}), which is then "
                     "no bound for them: weights small enough to stay in a cache, or a ceiling measured while other "
                     "work shared the machine; their % of read roof over 100 is not a measured fraction of a roof")
    for r in rows + extra_rows + hf:
        r.setdefault("study", "ladder" if not r.get("variant", "").startswith("HF") else "transformers")
        r["model"], r["dtype"] = model_key(spec.model), spec.dtype
        if spec.quant:
            r["quant"] = spec.quant
    all_rows = rows + extra_rows + hf
    summary = summarize(label, rows, extra_rows, hf, spec)
    params = {k: v for k, v in spec.__dict__.items() if k != "sampling"} | {
        "hf": spec.transformers_rows, "sampling": spec.sampling.__dict__, "model_args": m.args.__dict__,
        "source": ck.source, "checkpoint": ck.path, "read_ceiling": roof, "prompt_tokens": int(prompt.shape[1]),
        "prompt_len": int(prompt.shape[1]),  # a text prompt's own length, not the unused default of a random one
        "weight_bytes_per_token": weight_bytes_per_token(m)}
    if texts:
        params["texts"] = texts
    if batch_texts:
        params["batch_texts"] = batch_texts
    doc = make_results("decode", params=params, summary=summary, rows=all_rows, notes=notes, device=spec.device)
    if spec.quant:
        from gpuspeed.decode import quant

        doc["params"]["int8_gemv_choices"] = getattr(m, "int8_choices", {})
        quant.relabel(doc, label)
    return doc


def summarize(label: str, rows, extra_rows, hf, spec: Spec) -> dict:
    """The issue's summary keys for this model and dtype (<model>_<dtype>_...)."""
    s: dict = {}
    ok = [r for r in rows if "ms_per_token" in r]
    best = min(ok, key=lambda r: r["ms_per_token"]) if ok else {}  # {}: every rung failed or was skipped
    s[f"{label}_best_ms_per_token"] = best.get("ms_per_token")
    s[f"{label}_best_variant"] = best.get("variant")
    # the headline keys are always there: None where the row they need failed, was skipped or has no roof
    # (another row's number never stands in); a key whose rung was not asked for stays out
    s[f"{label}_pct_of_read_roof"] = best.get("pct_of_read_roof")
    s[f"{label}_best_weight_GBps"] = best.get("weight_GBps")
    s[f"{label}_variants_measured"] = len(ok)
    s[f"{label}_variants_failed_or_skipped"] = len(rows) - len(ok)
    if spec.dtype == "fp32":
        # over the rungs measured; without V0 there is nothing to compare with: None, not a false "NO"
        # and None while any row is not yet compared (a partial results file written mid-run): not a false "NO"
        compared = [r.get("tokens_identical_to_V0") for r in ok]
        s[f"{label}_tokens_identical"] = (all(compared) if any(r["variant"] == "V0" for r in ok)
                                          and None not in compared else None)
    by = {r["variant"]: r for r in ok}
    asked = set(spec.variants)
    # V2 and V4: the same eager step, launched one op at a time or as one graph replay; V3 and V4c: compiled
    for key, a, b in (("v0_over_v2", "V0", "V2"), ("graph_step_speedup", "V2", "V4"),
                      ("graph_compiled_step_speedup", "V3", "V4c")):
        if a in by and b in by:
            s[f"{label}_{key}"] = by[a]["ms_per_token"] / by[b]["ms_per_token"]
        elif {a, b} <= asked:
            s[f"{label}_{key}"] = None
    for r in rows:  # a rung that failed or was skipped: None
        s[f"{label}_{r['variant'].lower()}_ms_per_token"] = r.get("ms_per_token")
    hs = next((r for r in hf if r.get("variant") == "HF static" and "ms_per_token" in r), None)
    for key, kind in (("hf_dynamic", "HF dynamic"), ("hf_nocache", "HF no-cache"), ("hf_static", "HF static")):
        row = next((r for r in hf if r.get("variant") == kind), None)
        if row is not None:  # a row that failed or was skipped: None, as a rung's (no row: not run, or no transformers)
            s[f"{label}_{key}_ms_per_token"] = row.get("ms_per_token")
    if hs and best:
        s[f"{label}_best_over_hf_static"] = hs["ms_per_token"] / best["ms_per_token"]
    elif spec.transformers_rows:  # asked for, but failed, skipped by a cap, or transformers missing
        s[f"{label}_best_over_hf_static"] = None
    for r in extra_rows:  # one that failed or was skipped: None
        if r["study"] == "long_prompt":
            s[f"{label}_p{r['prompt_len']}_best_ms_per_token"] = r.get("ms_per_token")
        elif r["study"] == "batch":
            s[f"{label}_b{r['batch']}_tokens_per_s"] = r.get("tokens_per_s")
    s[f"{label}_b{spec.batch}_tokens_per_s"] = best.get("tokens_per_s")
    if spec.dtype != "fp32":
        ag = [r.get("token_agreement_vs_fp32") for r in ok if r.get("token_agreement_vs_fp32") is not None]
        if ag:
            s[f"{label}_min_token_agreement_vs_fp32"] = min(ag)  # free-running: parts at the first near-tie
        tf = [r["teacher_forced_agreement_vs_fp32"] for r in ok if "teacher_forced_agreement_vs_fp32" in r]
        if tf:  # the same prefix at every step: the meaningful bf16-vs-fp32 figure
            s[f"{label}_min_teacher_forced_agreement_vs_fp32"] = min(tf)
            s[f"{label}_max_teacher_forced_logit_err_vs_fp32"] = worst(  # a NaN rung's: NaN, not the others'
                r["teacher_forced_max_logit_err_vs_fp32"] for r in ok if "teacher_forced_max_logit_err_vs_fp32" in r)
        if spec.agreement and not spec.quant:  # no rung compared with fp32 (failed, skipped): None, not missing
            s.setdefault(f"{label}_min_token_agreement_vs_fp32", None)
            if spec.sampling.greedy:  # teacher forcing is greedy's alone
                s.setdefault(f"{label}_min_teacher_forced_agreement_vs_fp32", None)
                s.setdefault(f"{label}_max_teacher_forced_logit_err_vs_fp32", None)
    return s


def run_label(doc: dict) -> str:
    """The label a decode run's summary keys and rows go under (Spec.label, run_name), from
    its params: a checkpoint's path gives its model key, as its rows name it."""
    p = doc.get("params") or {}
    return run_name(model_key(str(p.get("model"))), p.get("dtype"), p.get("quant"), p.get("tp") or 1)


def run_name(model: str, dtype, quant, tp: int) -> str:
    """<model key>_<dtype>[_tpN], or <model key>_int8[-dtype][_tpN] under --quant: an int8 run from bf16 weights keeps
    the name it had (results/nvidia-h200/decode.json's llama-3-8b_int8_* keys), one from fp32 or fp16 weights names
    them (it was named as the bf16 one, and merging the two runs overwrote one's summary keys with the other's). The
    '-' keeps each name from being the start of another's keys (benchmarks/decode.py splits a merged file by them)."""
    what = dtype if not quant else quant if dtype in ("bf16", None) else f"{quant}-{dtype}"
    return f"{model}_{what}" + (f"_tp{tp}" if tp > 1 else "")


def _device_words(doc: dict) -> str:
    from gpuspeed.results import measured_on

    name = measured_on(doc)
    if name is None:
        return "an unrecorded device"
    kind = doc["device"].get("kind")
    return f"{name} ({'a CPU' if kind == 'cpu' else 'a GPU'})" if kind in ("cpu", "cuda") else name


def check_one_device(docs: list[dict], names: list[str] | None = None) -> None:
    """Refuse (UserError, one line) runs measured on different devices in one document: its single device stamp
    would name one of them for all, and ratios across its rows would compare two machines. names: how to call each
    run in the message (default: its label)."""
    seen: dict = {}
    for i, d in enumerate(docs):
        seen.setdefault(_device_words(d), (names[i] if names else run_label(d)))
    if len(seen) > 1:
        (a, first), (b, second) = list(seen.items())[:2]
        raise UserError(f"runs from different devices cannot go into one file: {first} was measured on {a}, {second} "
                        f"on {b} (merge each device's runs into its own file)")


def read_run(path, what: str = "decode run") -> dict:
    """A decode results file (a run's, or a merged one) read for a merge: a missing, corrupt or truncated file, or
    another study's, is a one-line UserError naming it."""
    from gpuspeed.results import read_results

    try:
        doc = read_results(path)
    except UserError as exc:  # validate()'s words name no file: 'a results document is a JSON object, got an array'
        raise UserError(str(exc) if str(path) in str(exc) else f"{path}: {exc}") from None
    if doc.get("study") != "decode":
        raise UserError(f"{path} is a {doc.get('study')!r} results file, not a {what}")
    params = doc.get("params")
    if not isinstance(params, dict) or not (isinstance(params.get("runs"), list) or
                                            (params.get("model") and params.get("dtype"))):
        raise UserError(f"{path}: its params name no model and dtype (not a {what})")
    return doc


def stamp_from_runs(doc: dict, docs: list[dict]) -> dict:
    """doc with the runs' device, versions and commit, not those of the process merging them (which may be a
    CPU machine after the fact); a note when the runs come from several commits. Runs from different devices are
    refused (check_one_device): one document, one device."""
    check_one_device(docs)
    for key in ("device", "versions", "git"):
        doc[key] = docs[0].get(key, doc[key]) if docs else doc[key]
    if len({d.get("git") for d in docs}) > 1:
        doc["notes"].append(f"the runs come from several commits: {sorted({str(d.get('git')) for d in docs})}")
    return doc


def merge(docs: list[dict], command=None) -> dict:
    """One decode.json from several runs (one per model and dtype): rows concatenated, summaries merged."""
    from gpuspeed.results import make_results

    summary: dict = {}
    rows: list = []
    notes: list = []
    params: dict = {"runs": []}
    for d in docs:
        summary |= d["summary"]
        rows += [dict(r, git=r.get("git") or d.get("git")) for r in d["rows"]]  # each row names its run's commit
        notes += [n for n in d["notes"] if n not in notes]
        params["runs"].append(d["params"] | {"git": d.get("git"), "created": d.get("created")})
    doc = stamp_from_runs(make_results("decode", params=params, summary=summary, rows=rows, notes=notes), docs)
    if command is not None:
        doc["command"] = command
    return doc


def check_run_memory(spec: Spec, args, prompt_len: int, weight_bytes: int, have: int | None, device: str,
                     what: str) -> None:
    """The largest run's static KV cache and the per-step logits the checks keep (fp32), beside weights that fit:
    a huge --batch fails here in one line, not as every rung's allocation error (or the host's OOM killer)."""
    elem = DTYPES[spec.dtype].itemsize
    runs = [(b, prompt_len) for b in [spec.batch, *spec.batches]] + (
        [(spec.batch, spec.long_prompt)] if spec.long_prompt else [])
    kvs = [2 * args.n_layers * b * V.max_len_for(p, spec.new_tokens) * args.kv_rows * elem for b, p in runs]
    kv = max(kvs)
    # profiled rungs keep their engines, caches included, until the passes after every timing (measure_variant):
    # the ladder's caches are all held at its end, and the batch and long-prompt rows run beside them
    held = sum(v != "V0" for v in spec.variants) if spec.profile else 0
    if held > 1:
        kv = max(kv, held * kvs[0] + max(kvs[1:], default=0))
    run_bytes = kv + spec.batch * spec.new_tokens * args.vocab_size * 4
    if have and weight_bytes <= 0.8 * have < weight_bytes + run_bytes:
        raise UserError(f"{what} at batch {max(b for b, _ in runs)} needs about {run_bytes / 2**30:.1f} GiB of KV "
                        f"cache and logits beside {weight_bytes / 2**30:.1f} GiB of weights; this {device} has "
                        f"{have / 2**30:.1f} GiB: use smaller --batch/--batches or fewer --new-tokens"
                        + (f" (or --no-profile: the {held} rungs profiled keep their caches until the end)"
                           if held > 1 else ""))


def naive_too_large(spec: Spec, m: M.Transformer, prompt_len: int, device: str) -> str | None:
    """Why V0 cannot run in this device's memory, or None. V0 recomputes the logits of every position each step
    ([B, P + T, vocab] in the run's dtype), and the previous step's are still held while the next are made: at a
    large batch and prompt that is many times the KV cache check_run_memory counts (batch 64, prompt 2000: 33 GB)."""
    whole = m.args if m.tp is None else m.tp.args  # a TP shard gathers the whole vocabulary's logits
    ranks = spec.tp if device != "cuda" else 1  # the CPU's ranks share the host; a GPU holds one rank's shard
    elem = DTYPES[spec.dtype].itemsize
    need = ranks * 2 * spec.batch * (prompt_len + spec.new_tokens) * whole.vocab_size * elem
    weights = ranks * weight_bytes_per_token(m)  # as stored (int8 under --quant; the embedding table aside)
    have = _device.get_device(device).mem_bytes
    if not have or weights + need <= 0.8 * have:
        return None
    # short: nothing_measured() keeps a reason's first 120 characters
    return (f"not run: V0 recomputes every position's logits, {need / 2**30:.1f} GiB at batch {spec.batch} x "
            f"{prompt_len + spec.new_tokens} positions; this {device} has {have / 2**30:.1f} GiB")


def _checkpoint_args(model: str):
    """The shapes of a checkpoint's model before any weight is read: a Hugging Face folder's config.json, a GGUF
    file's metadata (memory-mapped: no tensor is dequantized); None where there is nothing at that path. What the
    loader would refuse without reading a weight (no config.json, no safetensors or a shard missing, a file that is no
    GGUF, not a Llama, a bad field, a truncated GGUF) is its one-line UserError, raised now: before the run prints or
    starts anything."""
    p = Path(model)
    if p.is_dir():
        cfg = p / "config.json"
        if not cfg.is_file():
            raise checkpoints.no_config(p)
        args = checkpoints.args_from_hf_config(checkpoints._read_json(cfg), name=checkpoints.folder_name(p))
        checkpoints.check_weight_files(p)
        return args
    if p.is_file() and checkpoints._is_gguf(p):
        return checkpoints.gguf_args(p)
    if p.exists():  # a file that is no GGUF
        raise checkpoints.not_a_checkpoint(p)
    return None


def check_text_prompt(spec: Spec, args) -> None:
    """--prompt on a checkpoint, before its weights are read (minutes for a large one): refused where it has no
    tokenizer (make_prompt's words), or where its context cannot hold --new-tokens after a one-token prompt, or after
    --long-prompt."""
    if not checkpoints.has_tokenizer(spec.model):
        what = "has no tokenizer.json, tokenizer.model or tokenizer_config.json" if Path(spec.model).is_dir() else \
            "holds no tokenizer (no tokenizer.ggml.model)"
        raise UserError(f"--prompt needs a tokenizer: {spec.model} {what}; give --prompt-len for a random prompt")
    check_context("a text prompt", 1, spec.new_tokens, args.max_seq_len, at_least=True)
    if spec.long_prompt:  # its random tokens' length is known now
        check_context("--long-prompt", spec.long_prompt, spec.new_tokens, args.max_seq_len)


def check_fits(spec: Spec, device: str) -> None:
    """Refuse a named model or a checkpoint (Hugging Face folder, GGUF file) whose weights would not fit this device's
    memory (before making or reading them); under tensor parallel, rank 0's shard (the largest) on one GPU.

    What is counted is the peak of loading: the model in --dtype, beside the fp32 model it was cast from where the
    agreement check keeps it; under --quant, the larger of that and prepare()'s peak (the unquantized model and its
    copy kept as the reference, before the int8 weights replace the model's). A checkpoint's context is checked here
    too (check_spec does a named model's), before its weights are read."""
    if spec.model in M.CONFIGS:
        over = {"n_layers": spec.max_layers} if spec.max_layers else {}
        args = M.named_config(spec.model, **over)
    else:
        args = _checkpoint_args(spec.model)
        if args is None:
            return
        if spec.prompt is None:  # a random prompt's length is known now: past the context, refused before loading
            for what, n in [("a prompt", spec.prompt_len)] + ([("--long-prompt", spec.long_prompt)] if spec.long_prompt
                                                              else []):
                check_context(what, n, spec.new_tokens, args.max_seq_len)  # worded as make_prompt's, after loading
        else:  # the text's length is known once it is tokenized, after loading: what holds for any text is refused now
            check_text_prompt(spec, args)
    world = spec.tp or 1
    if world > 1:
        from gpuspeed.decode.tp import local_args

        args = local_args(args, world)  # rank 0's shard, the largest (too few KV heads for N ranks: an error)
        if device != "cuda":  # the CPU's gloo ranks share the host: no per-rank check
            return
    elem = DTYPES[spec.dtype].itemsize
    # a bf16/fp16 run with the agreement check holds the fp32 model it was cast from beside it: 2 + 4 bytes a weight
    with_ref = world == 1 and _loads_fp32_copy(spec)
    need = args.param_count() * (elem + (4 if with_ref else 0))
    resident = need  # beside the KV cache and logits of the runs
    why = " (its fp32 copy for the agreement check included)" if with_ref else ""
    if spec.quant:
        from gpuspeed.decode import quant

        if quant.quant_peak_bytes(args, elem) > need:
            need = quant.quant_peak_bytes(args, elem)
            why = f" (the {spec.dtype} model and its copy kept as the reference, before {spec.quant} replaces its weights)"
        resident = args.param_count() * elem + quant.int8_model_bytes(args, elem)  # the reference run: both models
    have = _device.get_device(device).mem_bytes
    check_run_memory(spec, args, spec.prompt_len, resident, have, device, spec.model)
    if have and need > 0.8 * have:
        if world > 1:
            raise UserError(f"{spec.model} in {spec.dtype} over {world} GPUs needs about {need / 2**30:.1f} GiB per "
                            f"GPU; each has {have / 2**30:.1f} GiB: use a larger --tp")
        hint = "--layers 2" if spec.model in M.CONFIGS else "--dtype bf16" if spec.dtype == "fp32" else "--tp over more GPUs"
        raise UserError(f"{model_key(spec.model)} in {spec.dtype}{'/' + spec.quant if spec.quant else ''} needs about "
                        f"{need / 2**30:.1f} GiB{why}; this {device} has {have / 2**30:.1f} GiB: try {hint}")


def _fmt(v, spec: str = ".3g") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, (int, float)):
        return format(v, spec)
    return str(v)


COLUMNS = ("variant", "batch", "P", "ms/token", "tok/s", "prefill ms", "GB/s", "% read roof", "x V0", "kernels/tok",
           "syncs/tok", "tokens = V0", "compile s")


def nothing_measured(doc: dict) -> str | None:
    """A line saying why no row has a time (every rung skipped or failed), else None."""
    rows = doc.get("rows") or []
    if any("ms_per_token" in r for r in rows):
        return None
    whys = sorted({(r.get("error") or r.get("skipped") or "?").splitlines()[0][:120] for r in rows})
    return ("nothing was measured: every rung was skipped or failed (" + "; ".join(whys) + ")" if rows
            else "nothing was measured: no rung ran")


def table_rows(doc: dict) -> list[list[str]]:
    """The ladder as strings, one list per row (COLUMNS)."""
    out = []
    for r in doc["rows"]:
        # a batch or long-prompt row skipped or failed before a rung was chosen names its study, not "?"
        name = r.get("variant") or {"batch": f"batch {r.get('batch')}", "long_prompt": f"prompt {r.get('prompt_len')}"
                                    }.get(r.get("study"), "?")
        if "ms_per_token" not in r:
            why = r.get("error") or r.get("skipped") or "?"
            out.append([name, _fmt(r.get("batch")), _fmt(r.get("prompt_len")), "failed" if "error" in r else "skipped",
                        why[:70]] + [""] * (len(COLUMNS) - 5))
            continue
        out.append([name, _fmt(r.get("batch")), _fmt(r.get("prompt_len")), _fmt(r["ms_per_token"], ".4g"),
                    _fmt(r.get("tokens_per_s"), ".4g"), _fmt(r.get("prefill_ms"), ".3g"), _fmt(r.get("weight_GBps"), ".4g"),
                    _fmt(r.get("pct_of_read_roof"), ".1f"), _fmt(r.get("speedup_over_V0"), ".2f"),
                    _fmt(r.get("kernels_per_token"), ".0f"), _fmt(r.get("host_syncs_per_token"), ".2f"),
                    _fmt(r.get("tokens_identical_to_V0")), _fmt(r.get("compile_s"), ".1f")])
    return out


def write_artifacts(doc: dict, out) -> list[Path]:
    """decode.json (through gpuspeed.results), decode_ladder.png and decode_bandwidth.png under `out`; returns their
    paths. The plots go first, so that a plot failure is among the notes decode.json holds (the numbers are written
    all the same, and the run still succeeds)."""
    from gpuspeed.results import write_results

    try:
        pics = plots(doc, out)
    except Exception as exc:  # no matplotlib, a broken backend, a full disk: the numbers must not be lost over a plot
        pics = []
        doc["notes"].append(f"plot failed: {one_line(exc)}; decode_ladder.png and decode_bandwidth.png were not "
                            "drawn (the numbers are in decode.json)")
    path = write_results(doc, out)  # first: a failed write keeps an earlier run's file and its plots together
    for stale in [*(Path(out) / f"decode_{kind}.png" for kind in ("ladder", "bandwidth")), *_stale_traces(doc, out)]:
        if stale not in pics:  # an earlier run's plot or trace beside this run's decode.json would be read as this run's
            try:
                stale.unlink(missing_ok=True)
            except OSError:  # a folder by that name, a read-only file: the results are written all the same
                pass
    return [path, *pics]


def _stale_traces(doc: dict, out) -> list[Path]:
    """Traces under out/traces of this run's models and dtypes (<label>_<Vn>.trace.json.gz) that its rows do not name:
    an earlier run's rungs that this one did not profile. Other files there are left alone."""
    named = {Path(r["trace"]).name for r in doc.get("rows", []) if r.get("trace")}
    labels = {n[:n.rindex("_V")] for n in named if "_V" in n}
    found = Path(out) / "traces"
    return [p for p in (found.glob("*.trace.json.gz") if found.is_dir() else [])
            if p.name not in named and "_V" in p.name and p.name[:p.name.rindex("_V")] in labels]


def plots(doc: dict, out) -> list[Path]:
    """decode_ladder.png (ms/token per variant, log scale, one panel per model and dtype) and
    decode_bandwidth.png (GB/s of weights per variant against the read ceiling)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)

    def panel(model, dtype, quant, tp) -> str:  # one per run: a tp2 or int8 bar beside a tp1 bf16 one hid it
        return f"{model} " + run_name("", dtype, quant, tp or 1)[1:].replace("_", " ")  # "int8-fp32 tp2"

    groups: dict = {}
    for r in doc["rows"]:
        if r.get("study") in ("ladder", "transformers") and "ms_per_token" in r:
            groups.setdefault(panel(r["model"], r["dtype"], r.get("quant"), r.get("tp")), []).append(r)
    if not groups:
        return []
    roofs = {}
    for run in doc["params"].get("runs", [doc["params"]]):
        key = panel(model_key(str(run.get("model"))), run.get("dtype"), run.get("quant"), run.get("tp"))
        roofs[key] = (run.get("read_ceiling") or {}).get("GBps")
    paths = []
    n = len(groups)
    for kind in ("ladder", "bandwidth"):
        fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), squeeze=False)
        for ax, (key, rows) in zip(axes[0], groups.items(), strict=True):
            names = [r["variant"] for r in rows]
            colors = ["tab:gray" if nm.startswith("HF") else "tab:blue" for nm in names]
            if kind == "ladder":
                ax.bar(names, [r["ms_per_token"] for r in rows], color=colors)
                ax.set_yscale("log")
                ax.set_ylabel("ms / token (log)")
            else:
                ax.bar(names, [r.get("weight_GBps") or 0 for r in rows], color=colors)
                if roofs.get(key):
                    ax.axhline(roofs[key], color="tab:red", linestyle="--", label=f"read roof {roofs[key]:.0f} GB/s")
                    ax.legend(fontsize=7)
                ax.set_ylabel("weight GB/s")
            ax.set_title(f"{key}, batch {rows[0].get('batch', '?')}, P={rows[0].get('prompt_len', '?')}", fontsize=9)
            ax.tick_params(axis="x", labelrotation=45, labelsize=7)
        dev = doc.get("device", {}).get("name", "?")
        fig.suptitle(f"decode ({'ms per token' if kind == 'ladder' else 'weight bytes per token / time'}), {dev}",
                     fontsize=10)
        p = out / f"decode_{kind}.png"
        tmp = p.with_name(f".{p.name}.tmp.png")
        try:
            fig.tight_layout()
            fig.savefig(tmp, dpi=110)
            tmp.replace(p)  # atomic: a failed save leaves no half-written plot
        finally:  # a failed save leaves neither an open figure nor the temporary file
            plt.close(fig)
            tmp.unlink(missing_ok=True)
        paths.append(p)
    return paths
