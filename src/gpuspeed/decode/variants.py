"""The ladder: V0 naive -> V1 KV cache -> V2 static cache -> V3 compiled -> V4 graphed -> V5 fast.

Each variant is an Engine bound to one model, batch and maximum length: prefill(prompt) -> first token
(device), decode(first, steps) -> the next `steps` tokens (host). decode() always restarts from the state
prefill left (position P), so it can be timed over and over. From V2 on, the state a step needs (token,
position, output index, done flags) lives in device buffers that the step updates in place: the loop is
one call per token (V2 eager, V3 compiled), one graph replay per token (V4) or per K tokens (V5), and the
host reads only the finished tokens, plus one `done` flag every `check_every` steps when EOS ids are set.
"""

from __future__ import annotations

import dataclasses
import numbers
import time
import warnings

import torch

from gpuspeed.decode.cache import DynamicCache, StaticCache
from gpuspeed.decode.generate import GREEDY, Sampling, eos_tensor, logit_error, mark_done, sample
from gpuspeed.decode.model import PLAIN, Options, Transformer
from gpuspeed.decode.model import attention as sdpa_attention
from gpuspeed.errors import UserError, one_line

VARIANTS = {
    "V0": "naive: no cache, the whole prefix every step, argmax and concatenation on the host",
    "V1": "KV cache: a growing cache, one token per step (host-driven)",
    "V2": "static cache: preallocated K/V, state on the device, no host sync in the loop",
    "V3": "compiled: the V2 step under torch.compile(fullgraph=True)",
    "V4": "graphed: the V2 step (eager insides) captured once, one replay per token",
    "V4c": "graphed: the V3 step (compiled insides) captured once, one replay per token",
    "V5": "fast: fused QKV and gate/up, K steps per graph replay, faster GEMV/attention where measured, compiled or "
          "eager insides with programmatic dependent launch (the faster replay kept)",
}
ORDER = list(VARIANTS)
# the order a capped run measures them in: the fast rungs first (seconds each), then the eager ones the summary's
# ratios need (V2, V0: every row's tokens are compared with V0's once all have run), so a time cap skips the
# least informative ones
PRIORITY = ["V5", "V4", "V2", "V0", "V3", "V4c", "V1"]
STEPS_PER_REPLAY = 4  # V5's K


def parse_variants(text: str | None) -> list[str]:
    if text is None or text.strip().lower() == "all":
        return list(ORDER)
    out = []
    for v in (t.strip() for t in text.split(",")):
        if not v:
            continue
        match = next((k for k in ORDER if k.lower() == v.lower()), None)
        if v.lower() == "all":  # beside other names it was "unknown variant 'all': use ... or all"
            raise UserError(f"--variants {text.strip()}: 'all' is every rung: give it alone, or list the rungs "
                            f"({', '.join(ORDER)})")
        if match is None:
            raise UserError(f"unknown variant {v!r}: use {', '.join(ORDER)} or all")
        if match not in out:
            out.append(match)
    if not out:
        raise UserError("--variants names no variant")
    return out


def max_len_for(prompt_len: int, new_tokens: int) -> int:
    """Cache length: prompt + new tokens + room for a capture's warm-up steps, rounded up to 16."""
    n = prompt_len + new_tokens + 4 * STEPS_PER_REPLAY + 8
    return (n + 15) // 16 * 16


class Engine:
    name = "?"
    eager = False  # one Python-driven forward per token (V0, V1, V2): slow enough that the study times fewer steps
    logits_change_path = False  # asking for every step's logits runs other code (graphed rungs: one step a replay)

    def __init__(self, model: Transformer, batch: int, max_len: int, *, sampling: Sampling = GREEDY,
                 eos_ids=None, check_every: int = 16, compile_backend: str = "inductor", reference=None):
        self.model, self.batch, self.max_len = model, batch, max_len
        # (tokens [B, 1 + T], per-step logits from the prefill on) of a higher-precision run on the same prompt:
        # V5 judges its insides candidates against it (insides_acceptable)
        self.reference = reference
        self.sampling, self.check_every, self.compile_backend = sampling, max(1, check_every), compile_backend
        self.device = model.device
        self.eos = eos_tensor(eos_ids, self.device)
        self.info: dict = {"notes": []}  # compile_s, capture_s, explain, ... (what the results record)
        self.prompt_len = 0
        self.gen = None
        self._gen_state = None  # the generator as prefill left it: every decode() draws from there
        model.setup_rope(max_len)

    def _choose(self, logits: torch.Tensor) -> torch.Tensor:
        return sample(logits, self.sampling, self.gen)

    def _start(self, prompt: torch.Tensor) -> None:
        if prompt.dim() != 2 or prompt.shape[0] != self.batch:
            raise UserError(f"prompt must be [batch={self.batch}, length], got {tuple(prompt.shape)}")
        if prompt.shape[1] + 1 > self.max_len:
            raise UserError(f"prompt of {prompt.shape[1]} tokens does not fit the cache of {self.max_len}")
        self.prompt_len = prompt.shape[1]
        self.gen = None if self.sampling.greedy else self.sampling.generator(self.device)
        self._gen_state = None

    def _check_room(self, steps: int) -> None:
        """A one-line UserError for more decode steps than max_len holds after the prompt: V0/V1 ran past it into the
        RoPE table (an IndexError on the CPU, a device-side assert that ends the CUDA context on a GPU)."""
        if self.prompt_len + steps + 1 > self.max_len:
            raise UserError(f"{steps} steps after a prompt of {self.prompt_len} exceed the cache of {self.max_len}")

    def _save_gen(self) -> None:
        """After prefill's draw: decode() restarts from the state prefill left, the generator's included, so a
        timed decode draws the warm generation's tokens (and stops at the same EOS). The state is host-side."""
        self._gen_state = self.gen.get_state() if self.gen is not None else None

    def _restore_gen(self) -> None:
        if self.gen is not None and self._gen_state is not None:
            self.gen.set_state(self._gen_state)

    def prefill(self, prompt, on_logits=None) -> torch.Tensor:
        raise NotImplementedError

    def decode(self, first, steps: int, on_logits=None, forced=None, stop_at_eos: bool = True) -> torch.Tensor:
        """The next `steps` tokens after `first` [B]. forced [B, >= steps - 1] (teacher forcing): step i + 1
        consumes forced[:, i] instead of the token step i chose; the tokens returned are still the chosen ones.
        stop_at_eos False runs all `steps` past an EOS (a finished row keeps emitting EOS): a timed decode's work."""
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------------
# V0, V1: host-driven
# ---------------------------------------------------------------------------------------------------


class _HostLoop(Engine):
    """V0 / V1: each next token goes through the host (tolist), as a first implementation does."""

    eager = True

    def _host_next(self, logits, done: list[bool]) -> list[int]:
        if self.sampling.greedy:  # the logits go to the host and the argmax is taken there, as a first loop does
            ids = logits.float().cpu().argmax(-1).tolist()
        else:
            ids = self._choose(logits).tolist()  # the host sync this rung has on purpose
        if self.eos is not None:
            eos = self.eos.tolist()
            ids = [eos[0] if d else t for t, d in zip(ids, done, strict=True)]
            for b, t in enumerate(ids):
                done[b] = done[b] or t in eos
        return ids

    def _forward(self, tokens, start: int):
        raise NotImplementedError

    def prefill(self, prompt, on_logits=None):
        self._start(prompt)
        self.prompt = prompt
        self._prefill_state(prompt)
        logits = self._forward(prompt, 0)[:, -1]
        if on_logits:
            on_logits(logits)
        self.first_done = [False] * self.batch
        first = torch.tensor(self._host_next(logits, self.first_done), device=self.device)
        self._save_gen()
        return first

    def _prefill_state(self, prompt):
        pass

    def decode(self, first, steps, on_logits=None, forced=None, stop_at_eos=True):
        self._check_room(steps)
        self._restore_gen()
        done = list(self.first_done)
        seq = torch.cat([self.prompt, first[:, None]], dim=1)
        out: list[list[int]] = []
        for i in range(steps):
            logits = self._step(seq)
            if on_logits:
                on_logits(logits)
            ids = self._host_next(logits, done)
            out.append(ids)
            nxt = torch.tensor(ids, device=self.device) if forced is None else forced[:, i].to(self.device)
            seq = torch.cat([seq, nxt[:, None]], dim=1)
            if self.eos is not None and all(done) and forced is None and stop_at_eos:
                break
        return torch.tensor(out, dtype=torch.long).T.reshape(self.batch, len(out))


class Naive(_HostLoop):
    name = "V0"

    def _forward(self, tokens, start):
        pos = torch.arange(start, start + tokens.shape[1], device=self.device)
        return self.model(tokens, pos)

    def _step(self, seq):
        return self._forward(seq, 0)[:, -1]  # no cache: the whole prefix again


class KVCache(_HostLoop):
    name = "V1"

    def _prefill_state(self, prompt):
        self.cache = DynamicCache(self.model.args.n_layers)

    def _forward(self, tokens, start):
        pos = torch.arange(start, start + tokens.shape[1], device=self.device)
        return self.model(tokens, pos, self.cache, last_only=True)

    def decode(self, first, steps, on_logits=None, forced=None, stop_at_eos=True):
        self.cache.truncate(self.prompt_len)  # back to the state prefill left
        return super().decode(first, steps, on_logits, forced, stop_at_eos)

    def _step(self, seq):
        return self._forward(seq[:, -1:], seq.shape[1] - 1)[:, -1]


# ---------------------------------------------------------------------------------------------------
# V2+: device-resident state
# ---------------------------------------------------------------------------------------------------


class Static(Engine):
    """V2: static cache; the step updates token, position, output and done buffers in place."""

    name = "V2"
    opts: Options = PLAIN
    eager = True

    def __init__(self, model, batch, max_len, **kw):
        super().__init__(model, batch, max_len, **kw)
        a, dev = model.args, self.device
        self.cache = StaticCache(a.n_layers, batch, a.n_kv_heads, max_len, a.head_dim, device=dev, dtype=model.dtype)
        self.tok = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.idx = torch.zeros(1, dtype=torch.long, device=dev)
        self.out = torch.zeros(batch, max_len, dtype=torch.long, device=dev)
        self.done = torch.zeros(batch, dtype=torch.bool, device=dev)
        self.opts = self.make_opts()
        self.step = self.build_step()

    def make_opts(self) -> Options:
        return PLAIN

    def _advance(self, nxt: torch.Tensor) -> None:
        if self.eos is not None:
            nxt = mark_done(nxt, self.done, self.eos)
        self.out.index_copy_(1, self.idx, nxt[:, None])
        self.tok.copy_(nxt[:, None])
        self.idx.add_(1)

    def body(self) -> torch.Tensor:
        """One decode step on the device buffers; returns the step's logits [B, V]."""
        logits = self.model(self.tok, self.pos, self.cache, self.opts)[:, -1]
        self.pos.add_(1)
        if self.sampling.greedy:
            self._advance(logits.argmax(-1))
        return logits

    def build_step(self):
        return self.body

    def _after_step(self, logits) -> None:
        if not self.sampling.greedy:  # the draw uses a host generator object: outside compile and graphs
            self._advance(self._choose(logits))

    def prefill(self, prompt, on_logits=None):
        self._start(prompt)
        pos = torch.arange(prompt.shape[1], device=self.device)
        logits = self.model(prompt, pos, self.cache, self.opts, last_only=True)[:, -1]
        if on_logits:
            on_logits(logits)
        first = self._choose(logits)
        self._save_gen()
        self.first_done = None
        if self.eos is not None:
            self.first_done = (first[:, None] == self.eos[None, :]).any(-1)
        return first

    def _reset(self, first) -> None:
        self.tok.copy_(first[:, None])
        self.pos.fill_(self.prompt_len)
        self.idx.zero_()
        self._restore_gen()
        if self.eos is not None:
            self.done.copy_(self.first_done)

    def decode(self, first, steps, on_logits=None, forced=None, stop_at_eos=True):
        self._check_room(steps)
        self._reset(first)
        if forced is not None:
            forced = forced.to(self.device)
        done_at = steps
        for i in range(steps):
            logits = self.step()
            self._after_step(logits)
            if on_logits:
                on_logits(logits)
            if forced is not None:
                if i + 1 < steps:
                    self.tok.copy_(forced[:, i:i + 1])  # the next step reads its token from this buffer
                continue
            if stop_at_eos and self.eos is not None and (i + 1) % self.check_every == 0 and bool(self.done.all()):
                done_at = i + 1  # one host read every check_every steps, never per token
                break
        return self.out[:, :done_at].to("cpu", copy=True)  # not the buffer itself (.cpu() on the CPU)


def _compile(fn, backend: str):
    import torch._dynamo.config as dcfg

    # every engine compiles the same Static.body code for its own buffers (V3, V4c, V5, each batch size and
    # prompt length): each is one cache entry of that code object, past dynamo's default limit of 8
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dcfg, name):
            setattr(dcfg, name, max(getattr(dcfg, name), 64))
    _quiet_mutation_analysis()
    return torch.compile(fn, fullgraph=True, dynamic=False, backend=backend)


def _drop_mutation_analysis_fallback(record) -> bool:
    # torch 2.11 names it identify_mutated_tensors, later ones identify_accessed_tensors
    msg = str(record.msg)
    return not (msg.startswith("Encountered an exception in identify_") and "assuming every input is mutated" in msg)


def _quiet_mutation_analysis() -> None:
    """Inductor cannot analyze our Triton kernels' inline PTX (tt.elementwise_inline_asm) and falls back to assuming
    every input is mutated, the safe answer: it logged that with a full traceback per kernel and trace, about 300
    lines of a V5 run (notebook 02's output on an H100). Only that record is dropped, on the logger the module
    writes it to (torch 2.11-2.13: "torch._dynamo", not the module's own name)."""
    import logging

    try:
        from torch._higher_order_ops.triton_kernel_wrap import log
    except ImportError:  # a torch without the module: the logger it wrote to
        log = logging.getLogger("torch._dynamo")
    if _drop_mutation_analysis_fallback not in log.filters:
        log.addFilter(_drop_mutation_analysis_fallback)


class Compiled(Static):
    """V3: the V2 step compiled with fullgraph=True (breaks and recompiles checked by explain())."""

    name = "V3"
    eager = False

    def build_step(self):
        from gpuspeed.graphs import explain

        t0 = time.perf_counter()
        # breaks over one traced step, recompiles over two more steps (new positions, same buffers); the
        # compile below is fullgraph=True itself, so explain's own fullgraph pass would trace a third time
        exp = explain(self.body, variants=[(), ()], check_fullgraph=False)
        self.info["explain_s"] = time.perf_counter() - t0
        self.info["graph_breaks"] = exp.break_count
        self.info["recompiles"] = exp.recompiles
        if exp.break_count:
            where = "; ".join(f"{b.where()}: {b.reason}" for b in exp.breaks[:2])
            raise RuntimeError(f"the decode step has {exp.break_count} graph break(s): {where}")
        compiled = _compile(self.body, self.compile_backend)
        self.info["compiled"] = False

        def step():
            if not self.info["compiled"]:  # the first call compiles: timed apart from decoding
                t = time.perf_counter()
                out = compiled()  # fullgraph=True: a break would raise here
                _sync(self.device)
                self.info["compile_s"] = time.perf_counter() - t
                self.info["compiled"] = self.info["fullgraph_ok"] = True
                return out
            return compiled()
        return step


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


class Graphed(Static):
    """V4: the step (eager insides; compiled with compiled=True) captured once and replayed per token."""

    name = "V4"
    compiled = False
    eager = False
    logits_change_path = True
    k = 1  # steps per replay

    def build_step(self):
        inner = self.body
        if self.compiled:
            inner = _compile(self.body, self.compile_backend)
        self._inner = inner
        self._graphs: dict[int, object] = {}
        return self._replay_one

    def _graph(self, k: int):
        """The graph of k consecutive steps (captured at first use; capture time recorded)."""
        if k in self._graphs:
            return self._graphs[k]
        from gpuspeed.graphs import capture

        inner = self._inner

        def steps_k():
            out = None
            for _ in range(k):
                out = inner()
            return out

        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if self.compiled and "compile_s" not in self.info:
                inner()  # compile first, outside the capture's warm-up
                _sync(self.device)
                self.info["compile_s"] = time.perf_counter() - t0
                t0 = time.perf_counter()
            # a CPU model on a machine with a GPU runs eagerly (a CUDA graph of its steps would record nothing)
            g = capture(steps_k, device="cuda" if self.device.type == "cuda" else "cpu")
            g()  # captured at the first call
        _sync(self.device)
        self.info[f"capture_s_k{k}"] = time.perf_counter() - t0
        for w in caught:
            note = str(w.message)
            if issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning, FutureWarning)):
                continue  # a library's API notice raised while compiling (torch.jit.script_method...), not this run's
            if note not in self.info["notes"]:
                self.info["notes"].append(note)
        self.info["graph_mode"] = g.mode
        run = g.replay if g.mode == "graph" else g
        self._graphs[k] = run
        return run

    def prepare(self, steps: int) -> None:
        """Compile and capture now: warm-up and capture run steps on the buffers, so decode resets after."""
        for k in [1] + ([self.k] if self.k > 1 and steps >= self.k else []):
            if k not in self._graphs:
                self._reset(torch.zeros(self.batch, dtype=torch.long, device=self.device))
                self._graph(k)

    def _replay_one(self):
        return self._graph(1)()

    def decode(self, first, steps, on_logits=None, forced=None, stop_at_eos=True):
        one_by_one = on_logits is not None or forced is not None or not self.sampling.greedy or self.k == 1
        self.prepare(1 if one_by_one else steps)
        if one_by_one:  # one step per replay: every step's logits seen, a forced token written between replays
            return super().decode(first, steps, on_logits, forced, stop_at_eos)
        self._check_room(steps)
        self._reset(first)
        many, one = (self._graph(self.k) if steps >= self.k else None), self._graph(1)
        done_steps = 0
        checks_every = max(1, self.check_every // self.k)
        n = 0
        while done_steps + self.k <= steps:
            many()
            done_steps += self.k
            n += 1
            if stop_at_eos and self.eos is not None and n % checks_every == 0 and bool(self.done.all()):
                return self.out[:, :done_steps].to("cpu", copy=True)
        while done_steps < steps:
            one()
            done_steps += 1
        return self.out[:, :steps].to("cpu", copy=True)


class GraphedCompiled(Graphed):
    name = "V4c"
    compiled = True


# A faster insides candidate is kept if, fed the reference's tokens, its logits lie no farther from the reference's
# than INSIDES_MAX_ERR_RATIO x the compiled graph's (relative max error). Without a reference: if its free-running
# greedy tokens agree with the compiled graph's INSIDES_MIN_AGREEMENT of the time. The token rule alone rejected the
# 1B's all-Triton insides (tokens agree 0.41: random bf16 weights leave the top logits nearly tied, and the compiled
# graph itself parts from fp32 at step 15), which were 13 % faster and as close to fp32. Under this rule the H200 run
# at 2d128f4 (results/nvidia-h200/decode.json, decode-notes round 11) kept them: a 4-step replay 3014 us against
# 3481, relative error 0.0326 against the compiled graph's 0.0308; V5 0.769 ms/token against 0.888
INSIDES_MIN_AGREEMENT = 0.9
INSIDES_MAX_ERR_RATIO = 1.25


def insides_acceptable(agreement: float, err: float | None, base_err: float | None) -> bool:
    """Whether a faster insides candidate may replace the compiled graph (the rule above)."""
    if err is not None and base_err is not None:
        return err <= INSIDES_MAX_ERR_RATIO * base_err
    return agreement >= INSIDES_MIN_AGREEMENT


class Fast(Graphed):
    """V5: fused projections, compiled, K steps per replay, and the GEMV / attention kernels that won."""

    name = "V5"
    compiled = True
    k = STEPS_PER_REPLAY

    def make_opts(self) -> Options:
        from gpuspeed.decode.kernels import choose

        t0 = time.perf_counter()
        try:
            fields, notes = choose(self.model, self.batch, self.max_len)
        except Exception as exc:  # measuring the candidates failed: torch's ops, said in the notes
            fields, notes = {}, [f"kernel choice failed ({one_line(exc, 160)}); torch's ops"]
        self.info["kernel_choice_s"] = time.perf_counter() - t0  # measuring the candidates, apart from decoding
        if self.device.type == "cuda":
            from gpuspeed.decode.kernels import choices

            self.info["kernel_choices"] = choices()  # per shape: cuBLAS and each Triton config, us and GB/s
        self.info["notes"] += notes
        self.info["triton_gemv_shapes"] = [f"{n}x{k}" for n, k in fields.get("gemv", {})]
        self.info["attention"] = getattr(fields.get("attention", sdpa_attention), "__name__", "?")
        self.info["fused_step_attention"] = "step_attention" in fields  # RoPE + cache write + attention, one kernel
        return Options(fused_qkv=True, fused_gate_up=True, **fields)

    def prepare(self, steps: int) -> None:
        """As Graphed, but a failure to compile or capture with the Triton kernels falls back to torch's ops
        (recorded in the notes) instead of losing the rung; then the eager-insides graph with programmatic
        dependent launch is measured against the compiled one and the faster kept (choose_insides)."""
        self._prepare_compiled(steps)
        self.choose_insides(steps)

    def _prepare_compiled(self, steps: int) -> None:
        try:
            super().prepare(steps)
        except Exception as exc:
            if not self.opts.gemv and self.opts.attention is sdpa_attention and self.opts.step_attention is None:
                raise
            self.info["notes"].append(f"the Triton kernels failed inside compile/capture ({one_line(exc, 160)}); "
                                      "V5 uses torch's ops")
            self.info["triton_gemv_shapes"], self.info["attention"] = [], "attention"
            self.info["fused_step_attention"] = False
            self.opts = Options(fused_qkv=True, fused_gate_up=True)
            self.info.pop("compile_s", None)
            self.step = self.build_step()
            super().prepare(steps)

    def _replay_us(self, k: int, replays: int) -> float:
        """GPU time of `replays` replays of the k-step graph from the prefill state (reset in the timed call, a
        few tiny copies, the same for both insides), through gpuspeed.bench, in us per replay."""
        from gpuspeed import bench

        run = self._graphs[k]
        zeros = torch.zeros(self.batch, dtype=torch.long, device=self.device)

        def replays_from_start():
            self._reset(zeros)
            for _ in range(replays):
                run()

        m = bench(replays_from_start, mode="events", flush=False, budget_s=0.6, min_samples=5, max_samples=40)
        return m.median * 1e6 / replays

    def _tokens_after(self, k: int, replays: int) -> torch.Tensor:
        self._reset(torch.zeros(self.batch, dtype=torch.long, device=self.device))
        for _ in range(replays):
            self._graphs[k]()
        return self.out[:, :replays * k].clone()

    def _reference_steps(self, wanted: int) -> int:
        """Decode steps the reference can judge (0: none): same batch, greedy, tokens and logits for each step."""
        ref = self.reference
        if ref is None or not self.sampling.greedy or self.model.tp is not None:
            return 0
        tokens, logits = ref
        if tokens.shape[0] != self.batch:
            return 0
        return max(0, min(wanted, tokens.shape[1] - 1, len(logits) - 1, self.max_len - self.prompt_len - 2))

    def _reference_error(self, steps: int) -> float:
        """The current insides fed the reference's tokens from the prefill state (one step a replay): max |logit -
        reference logit| / max |reference logit| over `steps` steps (the study's teacher_forced_rel_logit_err)."""
        tokens, logits = self.reference
        got: list = []
        self.decode(tokens[:, 0].to(self.device), steps, on_logits=lambda x: got.append(x.detach().float().cpu()),
                    forced=tokens[:, 1:steps + 1])
        return logit_error(got, logits[1:steps + 1])[1]

    def choose_insides(self, steps: int) -> None:
        """The step's kernels launched eagerly with programmatic dependent launch (each Triton GEMV lets the next
        launch and load its weights before the previous one ends; torch.compile cannot pass that launch option)
        against the compiled insides, all captured the same way: the fastest per replay is kept if it is as
        accurate (`insides_acceptable`: fed the fp32 reference's tokens, within INSIDES_MAX_ERR_RATIO of the
        compiled graph's relative logit error; with no reference, greedy tokens agreeing with the compiled graph's
        at least INSIDES_MIN_AGREEMENT of the time). Two PDL candidates: the GEMV table as chosen, and every shape
        on Triton (where cuBLAS won alone, its checked Triton runner-up: inside a PDL chain it prefetches its
        weights and fuses the norm the cuBLAS path runs as eager ops). Recorded: insides, each time, the
        agreement, and each error against the reference where there is one."""
        from gpuspeed.decode.kernels import all_triton
        from gpuspeed.decode.kernels.gemv import pdl_supported

        if "insides" in self.info or self.device.type != "cuda" or not (self.opts.gemv or self.opts.step_attention):
            return
        self.info["insides"] = "compiled"
        why = pdl_supported()
        if why:
            self.info["notes"].append(f"programmatic dependent launch not tried: {why}")
            return
        candidates = {"eager+PDL": dataclasses.replace(self.opts, pdl=True)}
        every = all_triton(self.model, self.opts.gemv) if self.model.tp is None and self.batch == 1 else self.opts.gemv
        if every != self.opts.gemv:
            candidates["eager+PDL, all Triton"] = dataclasses.replace(self.opts, pdl=True, gemv=every)
        for name in list(candidates):  # an int8 shape off the table would dequantize its whole weight every call
            why = _eager_dequantize(self.model, candidates[name].gemv)
            if why:
                self.info["notes"].append(f"{name} insides not tried: {why}")
                del candidates[name]
        if not candidates:
            return
        k = self.k if steps >= self.k and self.k in self._graphs else 1
        replays = max(1, min(8, (self.max_len - self.prompt_len - 1) // k))
        compiled = (self.opts, self._inner, dict(self._graphs), self.compiled)
        captures = {key: v for key, v in self.info.items() if key.startswith("capture_s_k")}
        t_compiled = self._replay_us(k, replays)
        want = self._tokens_after(k, replays)
        judge, base_err, errs = self._reference_steps(replays * k), None, {}
        if judge:
            try:
                base_err = self._reference_error(judge)
            except Exception as exc:  # the token rule decides instead
                self.info["notes"].append(f"insides judged by tokens: the reference comparison failed ({one_line(exc, 160)})")
                judge = 0
        best, best_t, times, agreements = None, t_compiled, {}, {}
        for name, opts in candidates.items():
            try:
                self.opts = opts
                self._inner, self._graphs, self.compiled = self.body, {}, False
                t0 = time.perf_counter()
                for kk in sorted({1, k}):
                    self._reset(torch.zeros(self.batch, dtype=torch.long, device=self.device))
                    self._graph(kk)
                capture_s = time.perf_counter() - t0
                times[name] = self._replay_us(k, replays)
                agreements[name] = float((self._tokens_after(k, replays) == want).float().mean())
                if judge:
                    errs[name] = self._reference_error(judge)
            except Exception as exc:
                self.info["notes"].append(f"{name} insides failed ({one_line(exc, 160)})")
                continue
            if times[name] < best_t and insides_acceptable(agreements[name], errs.get(name), base_err):
                best, best_t = (name, opts, self._graphs, capture_s), times[name]
        self.opts, self._inner, self._graphs, self.compiled = compiled
        self.info.update(captures)  # capture_s_k*: the compiled graphs'; a PDL winner's is pdl_capture_s
        if best is not None:  # the winner's graphs and options back in place
            name, self.opts, self._graphs, self.info["pdl_capture_s"] = best
            self._inner = self.body
            self.info["insides"] = name
        self.info.update(compiled_replay_us=t_compiled, insides_replay_steps=k,
                         insides_replay_us=dict(times, compiled=t_compiled), insides_token_agreement=agreements)
        if judge:  # each insides' teacher-forced relative logit error against the reference, the rule's inputs
            self.info.update(insides_rel_logit_err_vs_reference=dict(errs, compiled=base_err),
                             insides_reference_steps=judge)
        if "eager+PDL" in times:  # the plain PDL candidate's figures under their own names
            self.info.update(pdl_replay_us=times["eager+PDL"], pdl_token_agreement=agreements["eager+PDL"])
        rule = (f"kept if within {INSIDES_MAX_ERR_RATIO:g}x the compiled graph's error against the reference "
                f"({base_err:.4f})" if judge else f"kept if tokens agree >= {INSIDES_MIN_AGREEMENT:g}")
        self.info["notes"].append(
            f"insides of the {k}-step graph, us a replay: compiled {t_compiled:.1f}, "
            + ", ".join(f"{n} {t:.1f} (tokens agree {agreements[n]:.2f}"
                        + (f", error vs reference {errs[n]:.4f}" if n in errs else "") + ")" for n, t in times.items())
            + f"; {rule}: {self.info['insides']} kept")


def _eager_dequantize(model: Transformer, table: dict) -> str | None:
    """Why eager insides would lose on an int8 model whose GEMV table leaves shapes to the compiled dequant-matmul:
    run eagerly, those cast their whole weight to the activations' dtype on every call (the H200's int8 8B at
    dd6d009: 38.8 ms a 4-step replay against the compiled graph's 12.6)."""
    from gpuspeed.decode.quant import int8_weights

    left = sorted({tuple(w.shape) for w in int8_weights(model) if tuple(w.shape) not in table})
    if left:
        return ("int8 weights without a Triton GEMV (" + ", ".join(f"{n}x{k}" for n, k in left)
                + ") would dequantize whole in eager insides")
    return None


ENGINES = {"V0": Naive, "V1": KVCache, "V2": Static, "V3": Compiled, "V4": Graphed, "V4c": GraphedCompiled,
           "V5": Fast}


def make_engine(name: str, model: Transformer, batch: int, max_len: int, **kw) -> Engine:
    if name not in ENGINES:
        raise UserError(f"unknown variant {name!r}: use {', '.join(ORDER)}")
    # a negative batch or a float length failed in torch.zeros; max_len holds the prompt and at least one token
    for key, value, least in (("batch", batch, 1), ("max_len", max_len, 2)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
            raise UserError(f"{key} must be an integer >= {least}, got {type(value).__name__} {value!r}")
    if isinstance(kw.get("sampling"), dict):  # as Spec and a results file's params take it
        kw["sampling"] = Sampling.from_fields(kw["sampling"])
    return ENGINES[name](model, int(batch), int(max_len), **kw)
