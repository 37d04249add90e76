"""profile(): run a function under torch.profiler (CPU + CUDA, shapes, Python stacks, NVTX) and read it.

Passes, each its own call of the function, so the tools never stack on one another:
  1. warm-up calls (compilation and allocation stay out of the trace);
  2. `steps` calls under torch.profiler, each inside a `gpuspeed.step<i>` range (also an NVTX range on
     a GPU, so an Nsight Systems capture of the same run shows the steps), written as a Chrome trace;
  3. one call under sys.setprofile to place trace events at the user's source lines;
  4. one call under cProfile and one under a line timer for the Python hotspots.
"""

from __future__ import annotations

import contextlib
import gzip
import numbers
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from gpuspeed import device as _device, trees
from gpuspeed.compat import quiet_profiler_start
from gpuspeed.errors import UserError, require_flag
from gpuspeed.profiling import advice, hotspots as _hotspots, sites as _sites
from gpuspeed.profiling.trace import STEP_PREFIX, TraceAnalysis


@dataclass
class ProfileResult:
    """Everything one profile() run found. `findings` and `hotspots` are plain JSON-able dicts."""

    name: str
    device: str
    steps: int
    trace_path: str | None
    findings: dict
    hotspots: dict | None
    recommendations: list
    notes: list = field(default_factory=list)
    params: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, "device": self.device, "steps": self.steps, "trace_path": self.trace_path,
                "findings": self.findings, "hotspots": self.hotspots, "recommendations": self.recommendations,
                "notes": self.notes, "params": self.params}

    def summary(self) -> dict:
        from gpuspeed.profiling.report import summary

        return summary(self)

    def markdown(self, level: int = 2) -> str:
        from gpuspeed.profiling.report import markdown

        return markdown(self, level=level)

    def __str__(self) -> str:
        """The report `gpuspeed profile` prints, as plain text: print(gpuspeed.profile(...)) dumped every dict."""
        import io

        from rich.console import Console

        from gpuspeed.profiling.report import print_report

        buf = io.StringIO()
        print_report(self, Console(file=buf, width=120, color_system=None, highlight=False, soft_wrap=False))
        return buf.getvalue().rstrip("\n")


def sync_events_config():
    """torch.profiler's experimental config with CUDA sync events, or None where this torch lacks it."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(enable_cuda_sync_events=True)
    except (ImportError, TypeError, AttributeError, RuntimeError):
        return None


def _sync(on_gpu: bool) -> None:
    if on_gpu:
        import torch

        torch.cuda.synchronize()


@contextlib.contextmanager
def quiet_profiler_log():
    """Hide the `USDT: ... profiler_start` / `profiler_stop` lines that the profiler's C++ side (kineto)
    writes straight to file descriptor 2, whatever KINETO_LOG_LEVEL says; anything else it writes is
    passed on to stderr."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except OSError:  # no fd 2 to redirect
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            rest = [ln for ln in held.read().decode(errors="replace").splitlines() if not ln.startswith("USDT:")]
            if rest:
                sys.stderr.write("\n".join(rest) + "\n")


def record_trace(fn: Callable, args, kwargs, *, steps: int, on_gpu: bool, path: Path | None) -> tuple[dict, list]:
    """Run fn `steps` times under torch.profiler and return the Chrome trace; also write it gzipped to
    `path` (.json.gz) when one is given."""
    import json

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    notes = []
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    extra = {}
    if on_gpu:
        cfg = sync_events_config()
        if cfg is not None:
            extra["experimental_config"] = cfg
        else:
            notes.append("this torch has no CUDA sync events in its profiler: syncs come from runtime calls")
    nvtx = torch.cuda.nvtx if on_gpu else None
    prof = profile(activities=activities, record_shapes=True, with_stack=True, **extra)
    with quiet_profiler_log(), quiet_profiler_start():
        prof.start()
    try:
        for i in range(steps):
            if nvtx:
                nvtx.range_push(f"{STEP_PREFIX}{i}")
            with record_function(f"{STEP_PREFIX}{i}"):
                fn(*args, **kwargs)
            if nvtx:
                nvtx.range_pop()
        _sync(on_gpu)  # inside the profiler, so the last kernels land in the trace
    finally:
        with quiet_profiler_log():
            prof.stop()
        if on_gpu:  # CUPTI stays attached after this session: bench() notes it on later host-bound timings
            from gpuspeed.timing import gpu as timing_gpu

            timing_gpu.mark_profiled()
    with tempfile.TemporaryDirectory(prefix="gpuspeed-profile-") as tmp_dir:
        tmp = Path(tmp_dir) / "trace.json"
        prof.export_chrome_trace(str(tmp))
        with open(tmp) as f:
            trace = json.load(f)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            part = path.with_name(path.name + ".part")
            try:
                with open(tmp, "rb") as src, gzip.open(part, "wb", compresslevel=5) as dst:
                    shutil.copyfileobj(src, dst)
                os.replace(part, path)  # never a half-written trace under the final name
            finally:
                part.unlink(missing_ok=True)
    return trace, notes


LINE_BACKENDS = ("auto", "line_profiler", "settrace")
MAX_STEPS = 10_000  # torch.profiler holds every profiled step's events in memory, then writes them all to the trace
MAX_WARMUP = 1_000_000


def profile(fn: Callable, *args, steps: int = 5, warmup: int = 1, kwargs: dict | None = None,
            device: str = "auto", name: str | None = None, trace_path: str | os.PathLike | None = None,
            hotspots: bool = True, line_backend: str = "auto") -> ProfileResult:
    """Profile `fn(*args, **kwargs)` over `steps` calls and return the findings.

    device: "auto" records CUDA activity when a GPU is present, "cpu" records host activity only.
    trace_path: where to keep the Chrome trace (.json.gz; open it in Perfetto); by default it is read and
        not kept (trace_path None in the result).
    hotspots: also run cProfile and a line timer for the Python side.
    line_backend: "auto" (line_profiler when installed), "line_profiler" or "settrace".
    """
    if not callable(fn):
        raise UserError(f"profile() needs a callable, got {type(fn).__name__}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise UserError(f"profile(): kwargs= takes a dict of keyword arguments for fn, got {type(kwargs).__name__}")
    kwargs = dict(kwargs or {})
    if line_backend not in LINE_BACKENDS:  # a typo ran the settrace timer without a word
        raise UserError(f"profile(): unknown line_backend {line_backend!r}: use {', '.join(LINE_BACKENDS)}")
    require_flag("profile(): hotspots", hotspots)  # hotspots="no" ran them all
    hotspots = bool(hotspots)
    _refuse_lazy(fn)
    whole = all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in (steps, warmup))  # np.int64 too
    if not whole or steps < 1 or warmup < 0:
        raise UserError(f"profile() needs whole numbers steps >= 1 and warmup >= 0, got steps={steps!r}, "
                        f"warmup={warmup!r}")
    steps, warmup = int(steps), int(warmup)
    if steps > MAX_STEPS or warmup > MAX_WARMUP:  # steps=10**12 ran for ever, every step's events held in memory
        raise UserError(f"profile() takes at most {MAX_STEPS} steps (the profiler holds every step's events) and "
                        f"{MAX_WARMUP} warm-up calls, got steps={steps}, warmup={warmup}")
    if (why := trees.one_pass_argument(args, kwargs)) is not None:  # the warm-up would use it up: steps see nothing
        raise UserError(f"profile(): {why}; profile() calls the function {calls_made(steps, warmup, hotspots)} "
                        "times, so the profiled calls would see it empty: pass a list or a tuple")
    where = _device.resolve_device(device)
    on_gpu = where == "cuda"
    name = name or trees.callable_name(fn)
    notes = []
    if not on_gpu:
        notes.append(f"{_device.why_cpu()}: host-side findings only (syncs are the calls that would block on a GPU "
                     "tensor); kernel, gap and transfer findings need a GPU")
    for _ in range(warmup):
        fn(*args, **kwargs)
    _sync(on_gpu)
    path = Path(trace_path) if trace_path else None
    if path is not None and path.is_dir():  # a folder: the trace goes inside it, named after the function
        path = path / f"{_file_stem(name)}.trace.json.gz"
    if path is not None and not path.parent.is_dir():
        raise UserError(f"trace_path {str(trace_path)!r}: its folder {str(path.parent)!r} does not exist")
    if path is not None and not path.name.endswith(".gz"):  # what is written is gzipped: the name says so
        path = path.with_name(path.name + ".gz")
        notes.append(f"the trace is gzipped: written to {path.name}")
    # the trace is written after the profiled steps, before the passes that place source lines and time the
    # Python side: it takes its name only once they all ran, so a run that fails later leaves no trace behind
    staged = path.with_name(f".{path.name}.unfinished.gz") if path is not None else None
    try:
        with _hotspots.threads_started() as threads:
            trace, more = record_trace(fn, args, kwargs, steps=steps, on_gpu=on_gpu, path=staged)
        notes += more
        if threads:  # 6 .item() calls in two threads read "0 host syncs", without a word
            notes.append(_threads_unseen_note(len(threads)))
        sites = _sites.record_sites(fn, args, kwargs)
        _sync(on_gpu)
        analysis = TraceAnalysis(trace, sites, steps=steps)
        findings = analysis.findings()
        hs = None
        if hotspots:
            hs = _hotspots.analyze(fn, args, kwargs, line_backend=line_backend)
            _sync(on_gpu)
            _hotspots.mark_array_loops(hs, analysis.op_lines())
            if hs["lines"].get("note"):
                notes.append(hs["lines"]["note"])
        if staged is not None and staged.exists():
            os.replace(staged, path)
    finally:
        if staged is not None:
            staged.unlink(missing_ok=True)
    recs = advice.recommend(findings, hs)
    return ProfileResult(name=name, device=where, steps=steps, trace_path=str(path) if path else None,
                         findings=findings, hotspots=hs, recommendations=recs, notes=notes,
                         params={"steps": steps, "warmup": warmup, "device": where, "hotspots": hotspots,
                                 "calls": calls_made(steps, warmup, hotspots)})


def check_inputs_fit(fn: Callable, names, name: str, specs=()) -> None:
    """A one-line UserError where arguments of these names (--input's) cannot call `fn` (one missing, or one it has
    no parameter for): gpuspeed makes that call, so the error is the command line's, not a TypeError fn raised."""
    import inspect

    kwargs = dict.fromkeys(names)

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: the call itself will say
        return
    try:
        inspect.signature(fn).bind(**kwargs)
    except TypeError:
        pass
    else:
        return
    only_positional = [n for n in kwargs if n in params and params[n].kind is params[n].POSITIONAL_ONLY]
    if only_positional:
        raise UserError(f"{name} takes {only_positional[0]} by position only (before a '/'), and --input passes "
                        "each argument by its name: profile a wrapper that takes it by name")
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    extra = [k for k in kwargs if k not in named] if not takes_any else []
    if extra:
        spec = next((s for s in specs if str(s).split("=", 1)[0].strip() == extra[0]), f"{extra[0]}=...")
        raise UserError(f"{name} has no argument {extra[0]}: --input {spec} names none of {name}'s arguments "
                        f"({', '.join(named) or 'it takes none'})")
    missing = [n for n, p in params.items() if p.default is p.empty and n not in kwargs
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if missing:
        m = missing[0]
        raise UserError(f"{name}: no --input for its argument {m} (--input {m}=float32[1024] for an array, "
                        f"--input {m}=int:8 for a number)")
    raise UserError(f"{name} cannot be called with these --input arguments: its signature is {inspect.signature(fn)}")


def _file_stem(name: str) -> str:
    """A function's name as a file name: letters, digits, '.', '_' and '-' kept, the rest '_'."""
    stem = "".join(c if c.isalnum() or c in "._-" else "_" for c in name).strip(".")  # no hidden file
    return stem or "profile"


def _refuse_lazy(fn) -> None:
    """A call to an async or generator function runs none of its body: profiling it would time making a
    coroutine or generator object and call that the function's profile."""
    what, name = trees.lazy_kind(fn), trees.callable_name(fn)
    if what == "an async function":
        raise UserError(f"{name} is an async function: a call only makes a coroutine, so nothing of it would be "
                        f"profiled; profile a plain function that runs it (asyncio.run({name}(...)))")
    if what == "a generator function":
        raise UserError(f"{name} is a generator function: a call runs none of its body, so nothing of it would be "
                        f"profiled; profile a plain function that consumes it (list({name}(...)))")


def _threads_unseen_note(n_threads: int) -> str:
    """torch.profiler records the ATen ops and Python frames of the thread that started it only, and the findings
    keep the device work launched inside the profiled steps, which live on that thread."""
    return (f"the profiled steps started {n_threads} thread(s): torch.profiler records the ops of the calling thread "
            "only, so what those threads ran (ops, host syncs, kernels) is missing from the findings")


def calls_made(steps: int, warmup: int, hotspots: bool) -> int:
    """How many times profile() calls the function: warm-up, profiled steps, one call to place source
    lines, and two more (cProfile, line times) with hotspots."""
    return warmup + steps + 1 + (2 if hotspots else 0)
