"""The workload file: load it as an ordinary module and validate what `gpuspeed optimize` needs from it.

A workload defines `original(*args)` (the code to speed up) and `inputs(rng)` (or `inputs(rng, scale)`)
returning the argument tuple; optionally TOLERANCE = dict(rtol=, atol=), BATCH_AXIS = {arg (index or name): axis} and
variants = {"name": callable}. `--input` specs can stand in for `inputs`. Every mistake is a one-line
UserError (exit 2) before anything is written. A variant that computes in float32 says so with
`fn.precision = "float32"`: it then runs as the float32-demoted candidates do (float64 inputs cast to float32
before the timing, outputs cast back and kept only within the tolerance, labelled float32 in the report).
"""

from __future__ import annotations

import contextlib
import inspect
import pickle
import signal
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from gpuspeed.errors import UserError
from gpuspeed.inputs import make_inputs, parse_specs
from gpuspeed.loading import load_module
from gpuspeed.optimize.backends.common import (aliased, host_tree, kind_of, leaves, overlapping_outputs, sharing,
                                               tree_map)
from gpuspeed.trees import is_torch_module

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"
DEFAULT_EXAMPLE = "black_scholes"
CPU_SCALE = 0.1  # without a GPU, workloads that take `scale` run at a tenth of their typical size


def bundled_examples() -> list[str]:
    """Names of the example workloads shipped inside the package (files defining `original`)."""
    return sorted(p.stem for p in EXAMPLES_DIR.glob("*.py")
                  if not p.stem.startswith("_") and "def original" in p.read_text())


def resolve_path(target: str | Path) -> Path:
    """A workload file, or the name of a bundled example ('black_scholes')."""
    p = Path(target)
    if p.is_file():
        return p
    if p.suffix == "" and (EXAMPLES_DIR / f"{p.name}.py").is_file() and p.name in bundled_examples():
        return EXAMPLES_DIR / f"{p.name}.py"
    file, colon, func = str(target).rpartition(":")
    if colon and func.isidentifier() and Path(file).is_file():  # FILE.py:NAME, the form kernel and profile take
        raise UserError(f"no such workload file: {p}: to speed up {func} of {file}, use {file} --func {func}")
    if not p.exists():
        names = ", ".join(bundled_examples())
        raise UserError(f"no such workload file: {p} (bundled examples: {names})")
    raise UserError(f"{p} is not a file")


def import_workload(path: str | Path, unique: bool = False):
    """Import the file as a module (its folder on sys.path); an exception at import is a UserError."""
    p = Path(path)
    name = f"gpuspeed_workload_{p.stem}" + (f"_{uuid.uuid4().hex[:8]}" if unique else "")
    try:
        return load_module(p, name=name)
    except UserError:
        raise
    except BaseException as exc:  # noqa: BLE001 - the user's module failed at import: say so in one line
        raise UserError(f"importing {p} raised {type(exc).__name__}: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _what(exc: BaseException) -> str:
    """`Type: first line` of what the user's code raised; sys.exit(...) as SystemExit(code)."""
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r}) (it called sys.exit)"
    return f"{type(exc).__name__}: {_first_line(exc)}"


@dataclass
class Workload:
    path: Path
    name: str
    func: str
    module: Any
    original: Callable
    make_args: Callable[[int], tuple]  # seed -> the argument tuple
    scale: float
    scale_used: bool
    rtol: float | None
    atol: float | None
    tolerance_source: str
    batch_axis: dict[int, int] = field(default_factory=dict)
    variants: dict[str, Callable] = field(default_factory=dict)
    input_specs: list[str] = field(default_factory=list)
    kind: str = "numpy"  # "numpy" or "torch": what the original computes with
    notes: list[str] = field(default_factory=list)
    in_place: list[int] | None = None  # set by the pipeline: the arguments the original writes into
    in_place_returns: bool = False  # ... and it returns a result too (checked with them), not None
    # ... and [[j, i], ...]: its result's leaf j is argument i itself, on every seed (`x *= 2; return x`)
    returns_args: list = field(default_factory=list)
    # the leaves of its result that lie in memory its caller already holds, on some seed: an argument or a view of one
    # (`return x[1:]`), or the array an earlier call returned (a buffer it reuses); a candidate may hand back such
    # memory only there (None: not known, a run resumed from an older gpuspeed)
    returns_views: list | None = None
    inputs_list: bool = False  # inputs() returned a list, splatted into the arguments
    # set by reference(): the original's output holds torch bfloat16 tensors, which reach NumPy (and the check) as
    # float32: without a stated rtol they are checked at bfloat16's, not float32's
    bf16_outputs: bool = False

    def describe_args(self, args: tuple) -> list[str]:
        return [_describe(a) for a in args]


def _describe(x) -> str:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"{kind_of(x)} {str(x.dtype).replace('torch.', '')}[{','.join(map(str, x.shape))}]"
    if is_torch_module(x):  # its repr is one line per layer: cut at 60 characters it broke the report's line
        return _describe_module(x)
    return f"{type(x).__name__} {x!r}".replace("\n", " ")[:60]


def _describe_module(m) -> str:
    """`MLP (nn.Module, 1,072 parameters, float32)`: its class, its size and its parameters' dtypes."""
    params = list(m.parameters())
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in params})
    return (f"{type(m).__name__} (nn.Module, {sum(p.numel() for p in params):,} parameters"
            + (f", {'/'.join(dtypes)})" if dtypes else ")"))


def _is_torch_generator(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Generator)


def _takes_scale(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "scale" in params


def load(target: str | Path, func: str = "original", input_specs=(), rtol: float | None = None,
         atol: float | None = None, scale: float | None = None, gpu: bool = True) -> Workload:
    """Load and check a workload file (no call of `original` yet: see reference())."""
    path = resolve_path(target)
    if path.suffix != ".py":
        raise UserError(f"{path} is not a .py file")
    module = import_workload(path)
    fn = getattr(module, func, None)
    if fn is None:
        raise UserError(f"{path.name} defines no function {func!r} (the code to speed up; --func picks another)")
    if not callable(fn):
        raise UserError(f"{path.name}: {func} is not a function")
    _refuse_required_keywords(path, fn, func)
    specs = parse_specs(list(input_specs))
    maker = getattr(module, "inputs", None)
    notes = []
    scale_used = False
    returned_list = [False]  # inputs() returned a list (its items are the arguments), not a tuple
    if specs:
        order = _spec_order(fn, [s.name for s in specs])
        kw_only = [n for n in order if n in _keyword_only(fn)]
        if kw_only:  # every candidate, and the emitted script, pass the arguments by position
            raise UserError(f"--input {kw_only[0]}: {func}'s parameter {kw_only[0]!r} is keyword-only, and optimize "
                            "passes its inputs by position: make it a positional parameter (or give it a default "
                            "and leave it out)")

        def make_args(seed: int) -> tuple:
            values = make_inputs(specs, seed=seed, backend="numpy")
            return tuple(values[n] for n in order)
        eff_scale = 1.0
    else:
        if maker is None:
            raise UserError(f"{path.name} defines no inputs(rng) and no --input was given: gpuspeed needs example "
                            "arguments")
        if not callable(maker):
            raise UserError(f"{path.name}: inputs is not a function")
        scale_used = _takes_scale(maker)
        eff_scale = (1.0 if gpu else CPU_SCALE) if scale is None else float(scale)
        if not 0 < eff_scale < float("inf"):  # NaN too
            raise UserError(f"--scale must be a positive finite number, got {scale}")
        if not scale_used and scale is not None and scale != 1.0:
            notes.append(f"inputs(rng) takes no `scale`: --scale {scale:g} ignored")
        if not scale_used:  # its inputs are their one size: no GPU's 0.1 recorded (nor a resume key that differs)
            eff_scale = 1.0
        if scale_used and scale is None and not gpu:
            notes.append(f"no GPU: inputs at scale {eff_scale:g} of their typical size (--scale 1 for full size)")

        def make_args(seed: int) -> tuple:
            rng = np.random.default_rng(seed)
            out = maker(rng, scale=eff_scale) if scale_used else maker(rng)
            returned_list[0] = isinstance(out, list)
            return out if isinstance(out, tuple) else tuple(out) if isinstance(out, list) else (out,)

    try:
        args = make_args(0)
    except UserError:
        raise
    except (Exception, SystemExit) as exc:  # sys.exit() in inputs() too: one line, not gpuspeed exiting with its code
        call = f"inputs(rng, scale={eff_scale:g})" if scale_used else "inputs(rng)"  # the call that failed, as made
        raise UserError(f"{path.name}: {call} raised {_what(exc)}") from exc
    _misspelled_settings(path, module)
    tol = getattr(module, "TOLERANCE", None)
    source = "dtype defaults (gpuspeed.verify)"
    t_rtol = t_atol = None
    if tol is not None:
        if not isinstance(tol, dict) or not set(tol) <= {"rtol", "atol"}:
            raise UserError(f"{path.name}: TOLERANCE must be dict(rtol=..., atol=...), got {tol!r}")
        t_rtol, t_atol = tol.get("rtol"), tol.get("atol")
        source = "the workload's TOLERANCE"
    from_tolerance = {"rtol": rtol is None and t_rtol is not None, "atol": atol is None and t_atol is not None}
    if rtol is not None or atol is not None:  # the flags given, and where the other one came from
        source = "--rtol/--atol" if rtol is not None and atol is not None else "--rtol" if rtol is not None else "--atol"
        kept = [k for k, v in from_tolerance.items() if v]
        source += f", and the workload's TOLERANCE for {kept[0]}" if kept else ""
    rtol = t_rtol if rtol is None else rtol
    atol = t_atol if atol is None else atol
    for label, v in (("rtol", rtol), ("atol", atol)):
        # a NumPy scalar too (np.finfo(np.float32).eps * 10): kept as a Python float
        if v is not None and (isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating))
                              or not 0 <= v < float("inf")):  # NaN and inf too
            # where the bad value was written: the workload's TOLERANCE or the command line
            where = f"{path.name}: TOLERANCE's {label}" if from_tolerance[label] else f"--{label}"
            raise UserError(f"{where} must be a number >= 0, got {v!r}")
    rtol, atol = (None if v is None else float(v) for v in (rtol, atol))
    batch_axis = _batch_axis(path, getattr(module, "BATCH_AXIS", None), args, fn)
    variants = getattr(module, "variants", None) or {}
    if not isinstance(variants, dict) or not all(isinstance(k, str) and callable(v) for k, v in variants.items()):
        raise UserError(f"{path.name}: variants must be a dict of name -> callable")
    for vname, fn_v in variants.items():  # a misspelt word would be ignored: the variant run as written, on NumPy
        precision = getattr(fn_v, "precision", "as-written")
        if precision not in ("float32", "as-written"):
            raise UserError(f"{path.name}: variants[{vname!r}].precision must be 'float32' (it computes in float32: "
                            f"its inputs are cast for it) or left unset, got {precision!r}")
        where = getattr(fn_v, "gpuspeed_inputs", "numpy")
        if where not in ("numpy", "torch", "cupy"):
            raise UserError(f"{path.name}: variants[{vname!r}].gpuspeed_inputs must be 'torch' or 'cupy' (its "
                            f"arguments moved to the GPU as those) or left unset, got {where!r}")
    kind = "torch" if any(kind_of(x) == "torch" for x in leaves(args)) else "numpy"
    return Workload(path=path.resolve(), name=path.stem, func=func, module=module, original=fn, make_args=make_args,
                    scale=eff_scale, scale_used=scale_used, rtol=rtol, atol=atol, tolerance_source=source,
                    batch_axis=batch_axis, variants=dict(variants), input_specs=[str(s) for s in specs], kind=kind,
                    notes=notes, inputs_list=returned_list[0])


def _keyword_only(fn) -> set[str]:
    try:
        return {n for n, p in inspect.signature(fn).parameters.items() if p.kind is p.KEYWORD_ONLY}
    except (TypeError, ValueError):
        return set()


def _refuse_required_keywords(path: Path, fn, func: str) -> None:
    """A keyword-only parameter without a default cannot be given: every call passes the arguments by position."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return
    needed = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if needed:
        plain = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        raise UserError(f"{path.name}: {func}'s parameter {needed[0]!r} is keyword-only with no default, and optimize "
                        f"passes the arguments by position (inputs(rng)'s tuple): make it positional (def "
                        f"{func}({', '.join(plain + needed)})) or give it a default")


def _spec_order(fn, names: list[str]) -> list[str]:
    """Spec names in the order of fn's parameters when they name them, else in the order given."""
    try:
        signature = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return names
    params = list(signature)
    if set(names) <= set(params):
        return [p for p in params if p in names]
    unknown = [n for n in names if n not in params]
    varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in signature.values())
    if len(unknown) < len(names) and not varargs:  # some names match: the others are a typo, not positional names
        raise UserError(f"--input {unknown[0]}: {getattr(fn, '__name__', 'the function')} has no parameter "
                        f"{unknown[0]!r} (its parameters: {', '.join(params) or 'none'})")
    return names


# the optional settings a workload defines, and the shape each has: a near-miss spelling of one is a mistake
_SETTINGS = {"TOLERANCE": "dict(rtol=..., atol=...)", "BATCH_AXIS": "{argument: axis}",
             "variants": '{"name": callable}'}


def _misspelled_settings(path: Path, module) -> None:
    """A one-line error for a setting under a near-miss name (TOLERANCES, tolerance, BATCH_AXES, VARIANTS): it
    would be silently ignored, and the run would go on under the defaults (float64's rtol 1e-12, no chunking
    axis, no variants). Only dicts count (a `tolerance = 1e-8` the original reads is the user's own), and only
    while the real name is not defined; a dict of rtol/atol under any other name is a TOLERANCE too."""
    import difflib

    for name, value in vars(module).items():
        if not isinstance(value, dict) or name.startswith("__") or name in _SETTINGS:
            continue
        for setting, shape in _SETTINGS.items():
            if hasattr(module, setting):
                continue
            like = difflib.SequenceMatcher(None, name.upper(), setting.upper()).ratio() >= 0.85 and bool(value)
            if setting == "TOLERANCE":
                like = like or bool(value) and all(isinstance(k, str) for k in value) and \
                    set(value) <= {"rtol", "atol"}
            elif setting == "BATCH_AXIS":
                like = like and all(isinstance(v, int) for v in value.values())
            else:
                like = like and all(callable(v) for v in value.values())
            if like:
                raise UserError(f"{path.name}: {name} is not a setting gpuspeed reads (it would be ignored): "
                                f"did you mean {setting} = {shape}?")


def _batch_axis(path: Path, value, args: tuple, fn=None) -> dict[int, int]:
    if value is None:
        return {}
    if isinstance(value, dict) and any(isinstance(k, str) for k in value):
        # {"x": 0}: a parameter's name stands for its position (the arguments are passed by position)
        try:
            params = [n for n, p in inspect.signature(fn).parameters.items()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):
            params = []
        unknown = [k for k in value if isinstance(k, str) and k not in params]
        if unknown:
            raise UserError(f"{path.name}: BATCH_AXIS names {unknown[0]!r}, which is not a positional parameter of "
                            f"the function ({', '.join(params) or 'none'})")
        value = {params.index(k) if isinstance(k, str) else k: v for k, v in value.items()}
    if not isinstance(value, dict) or not all(isinstance(k, int) and isinstance(v, int) for k, v in value.items()):
        raise UserError(f"{path.name}: BATCH_AXIS must be a dict {{argument (index or name): axis}}, got {value!r}")
    for i, ax in value.items():
        if not 0 <= i < len(args) or not hasattr(args[i], "shape"):
            raise UserError(f"{path.name}: BATCH_AXIS names argument {i}, which is not an array")
        if not -len(args[i].shape) <= ax < len(args[i].shape):
            raise UserError(f"{path.name}: BATCH_AXIS axis {ax} is out of range for argument {i} "
                            f"(shape {tuple(args[i].shape)})")
    sizes = {args[i].shape[ax] for i, ax in value.items()}
    if len(sizes) > 1:
        raise UserError(f"{path.name}: BATCH_AXIS axes have different lengths {sorted(sizes)}")
    return {i: ax % len(args[i].shape) for i, ax in value.items()}


def _snapshot(args):
    return tree_map(lambda x: x.copy() if isinstance(x, np.ndarray) else
                    (x.clone() if kind_of(x) == "torch" and hasattr(x, "clone") else x), args)


def same_inputs(before, after) -> bool:
    """Did a call leave its arguments as they were (NaN equal to NaN)?"""
    from gpuspeed.optimize.backends.common import to_numpy

    before, after = leaves(before), leaves(after)
    if len(before) != len(after):  # a list argument that grew or shrank (append, pop)
        return False
    for a, b in zip(before, after, strict=True):
        if _is_torch_generator(a) or _is_torch_generator(b) or is_torch_module(a) or is_torch_module(b):
            # a generator the code draws from moves on, a model's running statistics move in train mode: no change to
            # the caller's data (a model is checked by what the call returns)
            continue
        a, b = to_numpy(a), to_numpy(b)
        # a NumPy scalar argument is saved as a 0-d array: compare it as one, not as a changed type
        a, b = (np.asarray(v) if isinstance(v, np.generic) else v for v in (a, b))
        if isinstance(a, np.ndarray):
            if not isinstance(b, np.ndarray) or a.shape != b.shape or not np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"):
                return False
        elif isinstance(a, (int, float, complex)):  # an element of a Python list (pure-Python code's `out[i] = ...`)
            if type(a) is not type(b) or not (a == b or (a != a and b != b)):
                return False
    return True


class _OutOfTime(BaseException):
    """Raised by the timer inside the original's reference call (a BaseException: the user's code may catch
    Exception)."""


@contextlib.contextmanager
def _time_limit(seconds: float | None):
    """Interrupt the code inside after `seconds` of wall time (SIGALRM: the main thread of a POSIX process only;
    elsewhere nothing is interrupted). Python code stops at once, a long C call when it returns."""
    usable = (seconds is not None and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def fire(signum, frame):
        raise _OutOfTime()

    old = signal.signal(signal.SIGALRM, fire)
    # past ~3 years the timer's time_t overflows (OverflowError, as if the user's code raised it): no limit then
    signal.setitimer(signal.ITIMER_REAL, min(max(seconds, 1e-3), 1e8))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def reference(wl: Workload, seeds: list[int], limit_s: float | None = None, why: str = "") -> tuple[dict, bool,
                                                                                                    list[int] | None]:
    """The original's outputs on each seed's inputs, on the host ({seed: output}); whether the original
    mutates its inputs; and the positions of the arguments it writes into (else None). For an original that
    returns None (`out=`-style, or a step that updates its state) their values after the call, as a tuple, are
    its output; for one that returns a result and also changes arguments, its output is (result, that tuple)
    (then wl.in_place_returns is set): what it did to the caller's arrays is checked too. An original that
    fails is a UserError, and so are calls that cannot all finish within `limit_s` seconds (`why` says where
    that limit comes from)."""
    import copy

    outs, afters, returned = {}, {}, {}
    changed: set[int] = set()
    bf16_result = False  # a torch bfloat16 tensor among the original's results
    views: set[int] = set()  # the result's leaves that lie in an argument's or an earlier result's memory
    out = None
    t0 = time.perf_counter()  # wall time against limit_s (not a benchmark)
    for n, seed in enumerate(seeds):
        args = wl.make_args(seed)
        if n == 0:
            first_inputs = [_digest((a,)) for a in args]
        before = _snapshot(args)
        previous = out  # alive through the call: memory the call returns again is its buffer, not a reused address
        left = None if limit_s is None else limit_s - (time.perf_counter() - t0)
        try:
            with _time_limit(left):
                out = wl.original(*args)
        except _OutOfTime:
            raise UserError(f"{wl.path.name}: {wl.func} did not finish its reference call {n + 1} of {len(seeds)} "
                            f"within {limit_s:.3g} s{why}: raise --time-budget, or give it smaller inputs") from None
        except (Exception, SystemExit) as exc:
            described = wl.describe_args(args)
            if len(described) > 6:  # a list from inputs() is the arguments: 1000 floats were 1000 of them
                described = described[:3] + [f"... {len(described)} arguments in all"]
            hint = ""
            if isinstance(exc, TypeError) and "positional argument" in str(exc) and wl.inputs_list:
                hint = " (inputs(rng) returned a list: its items are the arguments; return (the_list,) to pass one list)"
            elif _needs_missing_cuda(exc):
                hint = (" (it puts tensors on CUDA itself, `.cuda()` or device=\"cuda\", and this machine has no GPU: "
                        "write it for the CPU and optimize moves its tensors to the GPU where there is one)")
            elif not wl.input_specs and len(args) == 1:
                hint = _one_argument_hint(args[0])
            raise UserError(f"{wl.path.name}: {wl.func}({', '.join(described)}) raised {_what(exc)}{hint}") from exc
        per_call = (time.perf_counter() - t0) / (n + 1)
        if limit_s is not None and n + 1 < len(seeds) and per_call * len(seeds) > limit_s:
            raise UserError(f"{wl.path.name}: {wl.func} takes {per_call:.3g} s a call: its {len(seeds)} reference "
                            f"calls need ~{per_call * len(seeds):.3g} s, past {limit_s:.3g} s{why}: raise "
                            f"--time-budget (to ~{per_call * len(seeds) * 3.5:.0f} s or more), or give it smaller inputs")
        changed |= {i for i, (a, b) in enumerate(zip(before, args, strict=False)) if not same_inputs((a,), (b,))}
        if out is not None:
            _check_leaves(wl, out)  # before the copy: a generator, say, cannot be copied (nor checked)
        returned[seed] = aliased(out, args)  # the caller's own arrays handed back (written into, or not)
        views |= {j for j, _ in sharing(out, (*args, previous))}
        views |= {j for pair in overlapping_outputs(out) for j in pair}  # `return s, s`: its callers expect it so
        previous = None
        bf16_result = bf16_result or _has_bf16(out)
        # a copy: an original that returns a buffer it reuses would otherwise leave every seed the last one's values
        outs[seed] = copy.deepcopy(host_tree(out))
        afters[seed] = args
    again = None if wl.input_specs else wl.make_args(seeds[0])
    left = None if limit_s is None else limit_s - (time.perf_counter() - t0)
    try:
        other_inputs = again is not None and [_digest((a,)) for a in again] != first_inputs and not _scratch_only(
            wl, again, first_inputs, afters[seeds[0]], outs[seeds[0]], changed, left)
    except _OutOfTime:
        raise UserError(f"{wl.path.name}: {wl.func} did not finish a second call on seed {seeds[0]}'s inputs (its "
                        f"written arguments differed) within {limit_s:.3g} s{why}: raise --time-budget, or give it "
                        "smaller inputs") from None
    if other_inputs:
        # every worker makes its own inputs from the seed: the original would be called "not deterministic" and
        # every candidate wrong, for arguments that were never the same
        raise UserError(f"{wl.path.name}: inputs(rng) made other arguments for the same seed: draw them from the rng "
                        "it is given (np.random.*, random.* and torch.randn ignore it), and return fresh arrays, not "
                        "module-level ones that the original changes")
    del again  # a second set of inputs: not held while the outputs are gathered
    in_place = None
    wl.in_place_returns = False
    wl.returns_args = []
    wl.bf16_outputs = False
    wl.returns_views = sorted(views)
    if all(out is None for out in outs.values()):
        if not changed:
            raise UserError(f"{wl.path.name}: {wl.func} returned None and changed none of its arguments: nothing "
                            "to check (return its result, or write it into an argument)")
        in_place = sorted(changed)
        outs = {seed: host_tree(tuple(afters[seed][i] for i in in_place)) for seed in seeds}
    elif changed:  # a result and changed arguments: both are what the caller gets
        in_place, wl.in_place_returns = sorted(changed), True
        # the arguments it hands back, where every seed agrees (the optimized call must hand back the caller's own)
        wl.returns_args = returned[seeds[0]] if all(returned[s] == returned[seeds[0]] for s in seeds) else []
        outs = {seed: (outs[seed], copy.deepcopy(host_tree(tuple(afters[seed][i] for i in in_place))))
                for seed in seeds}
    for out in outs.values():
        if out is None or not leaves(out):
            raise UserError(f"{wl.path.name}: {wl.func} returned nothing to check (return its result)")
        _check_leaves(wl, out)
    arrays_in = [x for x in leaves(afters[seeds[0]]) if hasattr(x, "shape") and not isinstance(x, np.generic)]
    empty_in = bool(arrays_in) and all(0 in tuple(x.shape) for x in arrays_in)
    if all(isinstance(x, np.ndarray) and x.size == 0 or empty_in and not isinstance(x, np.ndarray)
           for out in outs.values() for x in leaves(out)):
        # every candidate would match an empty output (or a sum of nothing), and its time be the time of nothing
        where = f"inputs(rng, scale={wl.scale:g})" if wl.scale_used else "these inputs"
        more = ": raise --scale" if wl.scale_used else ": give it inputs with elements"
        what = "only empty arrays" if not empty_in else "only empty arrays or numbers of empty arrays"
        raise UserError(f"{wl.path.name}: {wl.func} returned {what} on {where}, so there is nothing to check a "
                        f"candidate against{more}")
    # a bfloat16 argument counts where it is written into (then it is the output)
    wl.bf16_outputs = bf16_result or any(_has_bf16(afters[seeds[0]][i]) for i in in_place or [])
    return outs, bool(changed), in_place


def _scratch_only(wl, again, first_inputs, after, out, changed, limit_s) -> bool:
    """The arguments that differ on a second make_args of the same seed are only ones the original writes into, and
    it gives the same answer on them: an `np.empty` out= buffer, whose garbage differs call to call and is never
    read. (A module-level array the original changes is the same object again, and its answer moves: not one.)"""
    moved = [i for i, a in enumerate(again) if i >= len(first_inputs) or _digest((a,)) != first_inputs[i]]
    if len(again) != len(first_inputs) or not set(moved) <= changed or any(again[i] is after[i] for i in moved):
        return False
    try:
        with _time_limit(limit_s):  # past the reference calls' limit: _OutOfTime, said by the caller
            out_again = wl.original(*again)
    except (Exception, SystemExit):
        return False
    return (out is None) == (out_again is None) and same_inputs(host_tree(again), host_tree(after)) and \
        (out is None or same_inputs(host_tree(out_again), out))


def _has_bf16(tree) -> bool:
    """A torch bfloat16 tensor among the leaves (NumPy has no bfloat16: host_tree makes them float32)."""
    return any(kind_of(x) == "torch" and str(getattr(x, "dtype", "")) == "torch.bfloat16" for x in leaves(tree))


def _needs_missing_cuda(exc: BaseException) -> bool:
    """The user's PyTorch code asked for CUDA on a machine without it ("Torch not compiled with CUDA enabled", "Found
    no NVIDIA driver", "No CUDA GPUs are available")."""
    torch = sys.modules.get("torch")
    return torch is not None and "cuda" in str(exc).lower() and not torch.cuda.is_available()


def _one_argument_hint(arg) -> str:
    """Why the original got one odd argument from inputs(): its return statement was missing, or it returned a
    dict or a generator, each passed whole as the only argument (only a tuple or a list is the arguments)."""
    import types

    if arg is None:
        return " (inputs(rng) returned None: is its `return` missing? return the arguments as a tuple)"
    if isinstance(arg, dict):
        return (" (inputs(rng) returned a dict: it is passed whole as the only argument, not as keyword arguments; "
                "return a tuple of the arguments in the function's order)")
    if isinstance(arg, (types.GeneratorType, map, filter, zip)):
        return (f" (inputs(rng) returned a {type(arg).__name__}: it is passed whole as the only argument; "
                "return a tuple of the arguments)")
    return ""


# long double where it is wider than a double (x86-64's 80-bit extended precision, padded to 16 bytes)
_PADDED = {np.dtype(t) for t in (np.longdouble, np.clongdouble)} if np.dtype(np.longdouble).itemsize > 8 else set()


def _digest(args) -> bytes:
    """A fingerprint of the arguments' values (arrays' bytes, numbers, strings): equal for equal inputs."""
    import hashlib

    from gpuspeed.optimize.backends.common import to_numpy

    h = hashlib.blake2b(digest_size=16)
    for leaf in leaves(args):
        if is_torch_module(leaf):  # a model by its class and weights: built from the same seed, the same model
            h.update(type(leaf).__qualname__.encode())
            h.update(_digest(tuple(leaf.state_dict().values())))
            continue
        # a torch.Generator by its state: seeded alike, the same inputs
        x = leaf.get_state().numpy() if _is_torch_generator(leaf) else to_numpy(leaf)
        if isinstance(x, (np.ndarray, np.generic)) and not x.dtype.hasobject:
            x = np.ascontiguousarray(x)
            h.update(f"{x.dtype}{x.shape}".encode())
            if x.dtype in _PADDED:
                # long double: 10 bytes of value in 16 (x86-64), the padding uninitialized: equal inputs read unequal
                h.update(repr(x.tolist()).encode())
                continue
            try:
                h.update(x.view(np.uint8).reshape(-1))  # no copy
            except (TypeError, ValueError):
                h.update(x.tobytes())
        elif isinstance(x, (int, float, complex, str, bytes, type(None))):
            h.update(repr(x).encode())
        else:  # another object: its type only (a repr may hold its address)
            h.update(type(x).__qualname__.encode())
    return h.digest()


def _check_leaves(wl, out) -> None:
    """A one-line error unless every leaf of the original's output is an array or a number."""
    for leaf in leaves(host_tree(out)):
        if not isinstance(leaf, (np.ndarray, np.generic, int, float, complex, bool)):
            raise UserError(f"{wl.path.name}: {wl.func} returned a {type(leaf).__name__}; return arrays or "
                            "numbers (or tuples, lists and dicts of them)")
        if isinstance(leaf, (np.ndarray, np.generic)) and leaf.dtype.kind in "USVMm":  # gpuspeed.check compares numbers
            raise UserError(f"{wl.path.name}: {wl.func} returned a {leaf.dtype} array; return numbers (strings, "
                            "records and dates cannot be checked against a tolerance)")


def param_names(wl, positions: list[int]) -> str:
    """`out` (argument 2), ...: the parameters at these positions, by name where the signature has one."""
    try:
        params = list(inspect.signature(wl.original).parameters)
    except (TypeError, ValueError):
        params = []
    return ", ".join(f"`{params[i]}` (argument {i})" if i < len(params) else f"argument {i}" for i in positions)


def out_dtypes(ref) -> list:
    """The dtype name of each output leaf (None for Python scalars)."""
    return [str(np.asarray(x).dtype) if isinstance(x, (np.ndarray, np.generic)) else
            ("float64" if isinstance(x, float) else None) for x in leaves(ref)]


_REFS_MAGIC = b"gpuspeed-refs-1\n"  # the file's last bytes, after the index's offset


def save_refs(path: Path, refs: dict) -> None:
    """Each seed's outputs pickled apart, then an index of where each starts: a reader loads one seed at a time."""
    import struct

    tmp = path.with_suffix(".tmp")
    index = {}
    with open(tmp, "wb") as f:
        for seed, out in refs.items():
            index[seed] = f.tell()
            pickle.dump(out, f, protocol=pickle.HIGHEST_PROTOCOL)
        at = f.tell()
        pickle.dump(index, f, protocol=pickle.HIGHEST_PROTOCOL)
        f.write(struct.pack("<Q", at) + _REFS_MAGIC)
    tmp.replace(path)


class SavedRefs(Mapping):
    """The outputs in a refs.pkl by seed, each read from the file when asked for (none held here)."""

    def __init__(self, path: Path):
        import struct

        self.path = Path(path)
        tail = 8 + len(_REFS_MAGIC)
        with open(self.path, "rb") as f:
            f.seek(0, 2)
            if f.tell() < tail:
                raise ValueError("too short to be a refs file")
            f.seek(-tail, 2)
            end = f.read(tail)
            if not end.endswith(_REFS_MAGIC):
                raise ValueError("not a refs file written by this gpuspeed")
            f.seek(struct.unpack("<Q", end[:8])[0])
            self._index = pickle.load(f)
        if not isinstance(self._index, dict):
            raise ValueError("its index is not a dict")

    def __getitem__(self, seed):
        with open(self.path, "rb") as f:
            f.seek(self._index[seed])
            return pickle.load(f)

    def __iter__(self):
        return iter(self._index)

    def __len__(self):
        return len(self._index)


def load_refs(path: Path) -> SavedRefs:
    return SavedRefs(path)
