"""The torch.compile graph-break finder: explain(fn, *args) -> Explanation.

Wraps torch._dynamo.explain: the graphs, each break with its reason and the user's source line, the
recompiles seen over several calls with changing inputs, and whether fullgraph=True compiles. Uses
dynamo's "eager" backend, so it finds graphs and breaks without compiling kernels.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import re
import warnings
from dataclasses import asdict, dataclass, field
from typing import Callable

from gpuspeed import graphs, trees
from gpuspeed.errors import UserError, require_flag

@dataclass
class Break:
    reason: str
    file: str | None
    line: int | None
    source: str | None
    # file.py:line of the call in an outer function that this break split, where the break is inside the callee
    called_at: str | None = None

    def where(self) -> str:
        if self.file is None:
            return "?"
        return f"{os.path.basename(self.file)}:{self.line}"


@dataclass
class Explanation:
    function: str
    graph_count: int
    break_count: int
    breaks: list[Break]
    ops_per_graph: list[int]
    calls: int  # calls made with changing inputs to count recompiles
    recompiles: int
    recompile_reasons: list[str]
    fullgraph_ok: bool | None  # None: not checked (check_fullgraph=False)
    fullgraph_error: str | None
    notes: list[str] = field(default_factory=list)
    # of `recompiles`, those at an input's first new size or number: torch.compile's normal dynamic-shape recompile
    expected_recompiles: int = 0
    expected_reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        """The report, one screen: headline, breaks with their lines, recompiles, fullgraph."""
        verdict = "not checked" if self.fullgraph_ok is None else "compiles" if self.fullgraph_ok else "fails"
        out = [f"{self.function}: {self.graph_count} graph(s), {self.break_count} graph break(s); "
               f"fullgraph=True {verdict}"]
        for i, b in enumerate(self.breaks, 1):
            via = f", reached from the call at {b.called_at}" if b.called_at else ""
            out.append(f"  break {i} at {b.where()}{via}: {b.reason}")
            if b.source:
                out.append(f"      {b.source}")
        if self.break_count > len(self.breaks):  # dynamo counts a break more often than it gives it a reason
            out.append(f"  ({self.break_count - len(self.breaks)} more break(s) that torch counted without a reason "
                       "of their own)")
        out.append(f"  recompiles over {self.calls} calls with changing inputs: {self._recompile_count()}")
        for r in self.recompile_reasons[:4]:
            out.append(f"    - {r}" + ("  (expected: the input's first change)" if r in self.expected_reasons else ""))
        if len(self.recompile_reasons) > 4:
            out.append(f"    - and {len(self.recompile_reasons) - 4} more (all in recompile_reasons, --json)")
        if self.fullgraph_ok is False and self.fullgraph_error:
            out.append(f"  fullgraph error: {self.fullgraph_error}")
        if self.fullgraph_ok and self.break_count:  # both are true: the two modes trace these constructs differently
            out.append("  (the breaks are what torch.compile's default mode does; under fullgraph=True torch traced "
                       "this call as one graph instead)")
        out.extend(f"  note: {n}" for n in self.notes)
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _recompile_count(self) -> str:
        """The recompiles, the expected ones (an input's first new size) told apart from those that are a cost."""
        n, expected = self.recompiles, min(self.expected_recompiles, self.recompiles)
        if not expected:
            return str(n)
        why = "torch.compile recompiles once at an input's first new size or value, to make it dynamic"
        if expected == n:
            return f"{n}, as expected ({why})"
        return f"{n}: {expected} expected ({why}), {n - expected} more (each one a new compile)"


def _short_reason(text: str) -> str:
    """Dynamo's reason, first line plus its 'Explanation:' line, without hints."""
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    if not lines:
        return "?"
    head = lines[0]
    if head.startswith("generic_jump"):  # dynamo's words for a branch on a tensor's value, which say nothing to a user
        return (f"data-dependent branching: an if or while on a tensor's value needs that value on the host "
                f"(torch.where or torch.cond keeps the choice in the graph; dynamo: {head})")
    for ln in lines[1:]:
        if ln.startswith("Explanation:"):
            return f"{head} ({ln[len('Explanation:'):].strip()})"
    return head


def _user_stack_frame(stack, fn_file: str | None):
    """The frame of the user's code in a break's stack: the function's own file if seen, else last."""
    frames = list(stack or [])
    if not frames:
        return None
    if fn_file:
        mine = [f for f in frames if os.path.abspath(f.filename) == fn_file]
        if mine:
            return mine[-1]
    return frames[-1]


_LOGGED_BREAK = "Graph break in user code at "
_TB_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>.+)\n(?:    (?P<src>.*)\n)?', re.M)


def _logged_breaks(messages: list[str], reasons, fn_file: str | None) -> list[Break]:
    """The breaks dynamo's graph-break log names that its explain() result leaves out: it keeps a reason only where
    a graph was made before the break, so a break ahead of any op (a print or a log call at the top of a function or
    a forward) was never reported. A logged break is new where its line is no frame of a break already known."""
    import traceback

    known = {(os.path.abspath(f.filename), f.lineno) for r in reasons for f in (getattr(r, "user_stack", None) or [])}
    out: list[Break] = []
    for message in messages:
        if not message.startswith(_LOGGED_BREAK):
            continue
        text, _, tb = message.partition("\nUser code traceback:\n")
        reason = text.partition("\nGraph Break Reason: ")[2]
        head, sep, rest = reason.partition("\n\n")
        if sep and head.startswith("Encountered graph break"):  # what dynamo was tracing, then the reason proper
            reason = rest
        frames = [traceback.FrameSummary(m["file"], int(m["line"]), m["name"].strip(), line=m["src"] or "")
                  for m in _TB_FRAME.finditer(tb + "\n")]
        fr = _user_stack_frame(frames, fn_file)
        if fr is None or any((os.path.abspath(f.filename), f.lineno) in known for f in frames[-1:]):
            continue
        known.add((os.path.abspath(fr.filename), fr.lineno))
        out.append(Break(reason=_short_reason(reason), file=fr.filename, line=fr.lineno,
                         source=(fr.line or "").strip() or None))
    return out


def _source_file(fn) -> str | None:
    """The file of the code a call of fn runs first: a function's own (through functools.wraps decorators and
    partial), an nn.Module's forward, a callable object's __call__. Breaks are placed at its lines."""
    import functools
    import inspect

    for _ in range(16):  # partial of a partial of ...
        if not isinstance(fn, functools.partial):
            break
        fn = fn.func
    try:
        fn = inspect.unwrap(fn)
    except ValueError:  # a __wrapped__ cycle
        pass
    code = getattr(fn, "__code__", None)
    if code is None and not isinstance(fn, type):
        for attr in ("forward", "__call__"):
            code = getattr(getattr(type(fn), attr, None), "__code__", None)
            if code is not None:
                break
    return os.path.abspath(code.co_filename) if code is not None else None


class _LogCatcher(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _quiet_dynamo():
    """Collect torch's log records (recompile reasons, graph-break warnings) instead of printing them."""
    import torch

    # the user's own settings (set_logs(graph_breaks=True) ...) come back after; under TORCH_LOGS torch ignores
    # set_logs, with a warning each call, so it is left alone
    from_env = "TORCH_LOGS" in os.environ
    internal = getattr(torch._logging, "_internal", None)
    saved = copy.deepcopy(internal.log_state) if internal is not None and hasattr(internal, "log_state") else None
    if not from_env:
        torch._logging.set_logs(recompiles=True, graph_breaks=True)
    catcher = _LogCatcher()
    # torch attaches its handlers to several loggers under "torch" (artifact loggers do not propagate)
    swapped = {}
    for name, lg in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(lg, logging.Logger) and (name == "torch" or name.startswith("torch.")) and lg.handlers:
            swapped[name] = list(lg.handlers)
            for h in swapped[name]:
                lg.removeHandler(h)
            lg.addHandler(catcher)
    try:
        with warnings.catch_warnings():
            # dynamo's warnings about what it cannot trace (a builtin it skips) repeat a break's reason, which the
            # report gives: printed, they broke into it on the screen
            warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\._dynamo(\.|$)")
            yield catcher
    finally:
        for name, handlers in swapped.items():
            lg = logging.getLogger(name)
            lg.removeHandler(catcher)
            for h in handlers:
                lg.addHandler(h)
        if not from_env and saved is not None and hasattr(internal, "_set_log_state") and hasattr(internal, "_init_logs"):
            internal._set_log_state(saved)
            internal._init_logs()
        elif not from_env:
            torch._logging.set_logs()  # back to torch's defaults (torch without the private state to restore)


def _recompile_reason(message: str, name: str | None = None) -> str:
    """'f at file.py:8: tensor 'x' size mismatch ...' from dynamo's multi-line recompile record. A frame of torch's own
    (the wrapper torch.compile runs a module, a partial or a callable object through: "inner at external_utils.py")
    is named as the user's callable, `name`."""
    lines = message.splitlines()
    head = lines[0].replace("Recompiling function ", "").strip()
    fn_name, _, loc = head.partition(" in ")
    guards = [ln.strip()[2:] for ln in lines[1:] if ln.strip().startswith("- ") and "/" in ln.split(":")[0]]
    if not guards:
        return head
    guard = guards[0].split(": ", 1)[-1]
    text, _, comment = guard.partition("#")
    text = text.strip()
    src = comment.strip().split("  #")[0].strip()
    where = f"{fn_name.strip()} at {os.path.basename(loc)}" if loc else fn_name.strip()
    if name and loc and _in_torch(loc.rpartition(":")[0]):  # its source line is torch's too: left out
        where, src = f"{name} (torch.compile's wrapper of it)", ""
    return f"{where}: {text}" + (f"  ({src})" if src else "")


def _in_torch(path: str) -> bool:
    """Whether a file is part of the torch package."""
    import torch

    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    return os.path.abspath(path).startswith(torch_dir + os.sep)


_DYNAMIC_GUARD = (re.compile(r"^tensor '(?P<name>[^']+)' (?:size|stride) mismatch"),
                  re.compile(r"^(?:L\[')?(?P<name>[A-Za-z_]\w*)(?:'\])? == -?[\d.]+(?:e[-+]?\d+)?$"))


def _dynamic_input(message: str) -> str | None:
    """The input whose size, stride or number changed where that is what a recompile record's first failed guard
    says (torch.compile then makes it dynamic, so only its first change is expected to recompile); None otherwise."""
    guards = [ln.strip()[2:] for ln in message.splitlines()[1:]
              if ln.strip().startswith("- ") and "/" in ln.split(":")[0]]
    if not guards:
        return None
    text = guards[0].split(": ", 1)[-1].partition("#")[0].strip()
    for pattern in _DYNAMIC_GUARD:
        if m := pattern.match(text):
            return m["name"]
    return None


def _compiled_before() -> list[str]:
    """'name at file.py:line' of each function torch.compile has compiled code for in this process (its cache
    holds entries): the dynamo.reset() that explain() needs drops them, and each recompiles at its next call."""
    import torch

    try:
        from torch._dynamo import convert_frame

        entries = torch._C._dynamo.eval_frame._debug_get_cache_entry_list
        codes = [ref() for ref in list(convert_frame.input_codes.seen)]
    except (ImportError, AttributeError, TypeError):  # another torch's internals: nothing to tell
        return []
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    out = []
    for code in codes:
        if code is None or code.co_name.startswith("torch_dynamo_resume_in_"):  # a resume is part of its function
            continue
        if os.path.abspath(code.co_filename).startswith(torch_dir + os.sep):
            continue
        try:
            if not entries(code):
                continue
        except (RuntimeError, TypeError):
            continue
        where = f"{code.co_name} at {os.path.basename(code.co_filename)}:{code.co_firstlineno}"
        if where not in out:
            out.append(where)
    return out


def _reset_note(compiled: list[str]) -> str:
    n = len(compiled)
    names = ", ".join(compiled[:3]) + (f" and {n - 3} more" if n > 3 else "")
    return (f"explain() reset torch._dynamo's caches (torch._dynamo.explain does too): the {n} function(s) compiled "
            f"earlier in this process ({names}) compile again at their next call")


def _batch_size(args: tuple, kwargs: dict | None = None) -> int | None:
    """The batch size the changed-input calls scale: the first dim of the first positional tensor (of at least
    one dim), else of the keyword tensor with the most dims (the first such in the order given); None: no tensor."""
    def tensors(obj):
        return [x for x in trees.flatten(obj)[0] if trees.module_of(x) == "torch" and getattr(x, "ndim", 0) >= 1]

    if first := tensors(args):
        return int(first[0].shape[0])
    if by_name := tensors(kwargs or {}):
        return int(max(by_name, key=lambda x: x.ndim).shape[0])
    return None


def default_variants(args: tuple, n: int = 3, *, batch: int | None = None) -> list[tuple]:
    """Calls with changing inputs: fresh values, then the batch x2, x3; ints +1.

    The batch is `batch` (default: the first dim of the first tensor of args): every tensor whose first dim is
    that size has it scaled; the others (a broadcast bias, a weight) keep their shape, with fresh values."""
    import torch

    if batch is None:
        batch = _batch_size(args)

    def fresh(x, shape: list):
        # the input's layout kept (a strided or transposed view's strides at the same shape, its stride order when
        # resized), so a same-shape call is not a recompile that only these inputs cause
        if shape == list(x.shape):
            stride = list(x.stride())
        else:
            stride, step = [0] * len(shape), 1
            for d in sorted(range(len(shape)), key=lambda d: x.stride(d)):
                stride[d], step = step, step * max(shape[d], 1)
        t = torch.empty_strided(shape, stride, dtype=x.dtype, device=x.device)
        n = t.untyped_storage().nbytes() // t.element_size()
        flat = t.as_strided((n,), (1,), 0)  # the whole storage: views sharing memory (a broadcast) stay shared
        if x.is_floating_point() or x.is_complex():
            flat.copy_(torch.randn(n, dtype=x.dtype, device=x.device))
        elif x.dtype == torch.bool:
            flat.copy_(torch.rand(n, device=x.device) > 0.5)
        else:
            flat.copy_(torch.randint(0, 8, (n,), device=x.device).to(x.dtype))
        return t

    def vary(x, scale: int, bump: int):
        if trees.module_of(x) == "torch" and hasattr(x, "data_ptr"):
            shape = list(x.shape)
            if shape and scale > 1 and shape[0] == batch:  # a bias (8,) beside x (4, 8) keeps its shape
                shape[0] *= scale
            try:
                return fresh(x, shape)
            except (RuntimeError, TypeError):  # a sparse or otherwise unusual layout: a plain dense tensor
                if x.is_floating_point() or x.is_complex():
                    return torch.randn(shape, dtype=x.dtype, device=x.device)
                if x.dtype == torch.bool:
                    return torch.rand(shape, device=x.device) > 0.5
                return torch.randint(0, 8, shape, dtype=x.dtype, device=x.device)
        if isinstance(x, bool):
            return x
        if isinstance(x, int):
            return x + bump
        return x

    leaves, spec = trees.flatten(args)
    return [trees.unflatten(spec, [vary(x, 1 if i == 0 else i + 1, i) for x in leaves]) for i in range(n)]


def _default_calls(args: tuple, kwargs: dict) -> list[tuple[tuple, dict]]:
    """default_variants' calls as (args, kwargs): the keyword arguments' tensors change as the positional ones do
    (those of the batch's size scale with it); their other values (dim=, an int option) are kept, since a changed
    option is another call, not new inputs."""
    k_leaves, k_spec = trees.flatten(kwargs)
    out = []
    for a, k in default_variants((args, kwargs), batch=_batch_size(args, kwargs)):
        changed, _ = trees.flatten(k)
        keep = [new if trees.module_of(old) == "torch" else old for old, new in zip(k_leaves, changed, strict=True)]
        out.append((tuple(a), trees.unflatten(k_spec, keep)))
    return out


def _modules_of(fn, leaves: list) -> list:
    """The nn.Modules a call of fn runs: fn itself (or the module a torch.compile wrapper holds), the module of a bound
    method, and modules passed as arguments."""
    import torch

    found = [getattr(fn, "_orig_mod", fn), getattr(fn, "__self__", None)] + list(leaves)
    return [m for m in found if isinstance(m, torch.nn.Module)]


@contextlib.contextmanager
def _traced_uncompiled(modules: list):
    """The modules with their nn.Module.compile() switched off while explain() runs, and back on after: a call of a
    module compiled in place goes to its inductor-compiled _call_impl, which dynamo does not trace into (0 graphs,
    and fullgraph=True "compiled" a forward that breaks)."""
    switched = [(m, m._compiled_call_impl) for top in modules for m in top.modules()
                if getattr(m, "_compiled_call_impl", None) is not None]
    for m, _ in switched:
        m._compiled_call_impl = None
    try:
        yield
    finally:
        for m, impl in switched:
            m._compiled_call_impl = impl


def _same_values(a, b) -> bool:
    """Whether two tensors hold the same values, NaN where the other has NaN."""
    import torch

    if torch.equal(a, b):
        return True
    return (a.is_floating_point() or a.is_complex()) and bool(torch.isclose(a, b, rtol=0, atol=0, equal_nan=True).all())


class _KeptInputs:
    """Copies of the tensors a call may update in place (its tensor arguments, its modules' buffers), put back after
    each of explain()'s passes: each pass calls the function, so x.add_(1) or a BatchNorm's running statistics came
    back updated once per pass. Told by their values: batch_norm updates its running statistics without a version
    bump. Parameters are not copied (a model's weights twice over); state the function reaches otherwise (globals, an
    optimizer it closes over) is not either."""

    def __init__(self, tensors: list):
        import torch

        self.kept: list = []  # (name, tensor, its copy)
        self.restored: list[str] = []  # names of the tensors put back, for the note
        self.uncopied = 0  # tensors that could not be copied (no memory for them)
        seen: set = set()
        for name, t in tensors:
            if id(t) in seen or t.layout != torch.strided or t.is_meta:  # sparse, meta: nothing to copy back
                continue
            seen.add(id(t))
            try:
                self.kept.append((name, t, t.detach().clone()))
            except RuntimeError:  # out of memory: this one keeps what the calls do to it
                self.uncopied += 1

    def restore(self) -> None:
        """Put back each tensor whose values changed."""
        import torch

        for name, t, kept in self.kept:
            with torch.no_grad(), (torch.inference_mode() if t.is_inference() else contextlib.nullcontext()):
                if not _same_values(t, kept):
                    t.copy_(kept)
                    if name not in self.restored:
                        self.restored.append(name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.restore()  # a pass that raised may have written too

    def note(self) -> str | None:
        said = lost = ""
        if self.restored:
            names = ", ".join(self.restored[:3]) + (f" and {len(self.restored) - 3} more" if len(self.restored) > 3
                                                    else "")
            them, are = ("it", "it is") if len(self.restored) == 1 else ("them", "they are")
            said = (f"the function updates {names} in place: explain() put {them} back after each of its calls, so "
                    f"{are} as the call found {them}")
        if self.uncopied:
            lost = f"{self.uncopied} tensor(s) could not be copied (memory) and keep the updates of explain()'s calls"
        return "; ".join(w for w in (said, lost) if w) or None


def _argument_names(fn, n: int) -> list[str]:
    """Names of the first n positional arguments of fn from its signature (xs[0], xs[1] for *xs), "argument i" where
    it has none."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature
        params = []
    names: list[str] = []
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind == p.VAR_POSITIONAL:
            names += [f"{p.name}[{j}]" for j in range(max(0, n - len(names)))]
            break
        else:
            break
    return names[:n] + [f"argument {i}" for i in range(len(names), n)]


def _tensors_to_keep(fn, args: tuple, kwargs: dict, variants) -> list[tuple[str, object]]:
    """(name, tensor) of the tensors in the arguments (the variants' too), each named by its argument, and of the
    buffers of the modules a call runs."""
    named = list(zip(_argument_names(fn, len(args)), args, strict=True))
    named += list(kwargs.items()) + [(f"variants[{i}]", v) for i, v in enumerate(variants or ())]
    out = [(name, x) for name, obj in named for x in trees.flatten(obj)[0] if graphs._is_tensor(x)]
    for m in _modules_of(fn, trees.flatten((tuple(args), kwargs))[0]):
        out += [(f"{type(m).__name__}.{name}", b) for name, b in m.named_buffers()]
    return out


def _raise_if_eager_fails(fn: Callable, args: tuple, kwargs: dict) -> None:
    """Raise the function's own error where it fails without torch.compile too: dynamo's wrapper of it ("RuntimeError
    when making fake tensor call") hid what was wrong with the inputs (a reshape to a size they do not have)."""
    fn(*args, **kwargs)


def _ops_per_graph(out) -> list[int]:
    """The ops of each graph dynamo made: its own ops_per_graph lists call_function nodes only, so x.sin() (a
    call_method) and self.linear(x) (a call_module) were left out and a graph of them read as empty."""
    graphs_made = getattr(out, "graphs", None) or []
    if len(graphs_made) != int(out.graph_count):  # no graph modules to read: dynamo's count, as it gives it
        return [len(o) for o in (out.ops_per_graph or [])]
    ops = ("call_function", "call_method", "call_module")
    return [sum(1 for node in g.graph.nodes if node.op in ops) for g in graphs_made]


def explain(fn: Callable, *args, variants: list[tuple] | None = None, check_fullgraph: bool = True,
            **kwargs) -> Explanation:
    """Graph breaks, recompiles and fullgraph-ability of `fn(*args, **kwargs)` under torch.compile.

    variants: argument tuples for the extra calls that count recompiles, each called with `kwargs` (default:
        default_variants of the arguments and keyword arguments together: fresh values, then the batch x2 and
        x3, in every tensor of the batch's size, keyword tensors too; a broadcast bias or a weight keeps its shape).
    Uses dynamo's "eager" backend throughout: it finds graphs and breaks without compiling kernels.
    Each pass starts from torch._dynamo.reset() (as torch._dynamo.explain itself does), so its counts do not
    depend on what this process compiled before: every function compiled earlier (a torch.compile'd model, with
    its reduce-overhead CUDA graphs) compiles again at its next call. The report's notes name them.
    """
    import torch
    import torch._dynamo as dynamo

    if not callable(fn):
        raise UserError(f"explain() needs a callable, got {type(fn).__name__}")
    from gpuspeed.timing import lazy_result

    if (why := lazy_result(fn, trees.callable_name(fn), "explain() would trace")) is not None:
        raise UserError(why)
    if (why := trees.one_pass_argument(args, kwargs)) is not None:
        raise UserError(why + "; explain() calls the function several times, so the later calls would see it empty: "
                        "pass a list or a tuple")
    require_flag("explain(): check_fullgraph", check_fullgraph)  # "no" was truthy: checked anyway
    if variants is not None:
        try:
            variants = list(variants)
        except TypeError:
            raise UserError(f"variants is a list of argument tuples, got {type(variants).__name__}") from None
        for i, v in enumerate(variants):
            if not isinstance(v, (tuple, list)):
                raise UserError(f"variants[{i}] is a {type(v).__name__}, not a tuple of arguments: write "
                                "variants=[(x,), ...] for a function of one argument")
    name = trees.callable_name(getattr(fn, "_orig_mod", fn), qualified=True)  # the module torch.compile wraps
    fn_file = _source_file(fn)
    notes: list[str] = []

    compiled_before = _compiled_before()
    if compiled_before:
        notes.append(_reset_note(compiled_before))
    modules = _modules_of(fn, trees.flatten((tuple(args), kwargs))[0])
    with _quiet_dynamo() as log, _traced_uncompiled(modules), \
            _KeptInputs(_tensors_to_keep(fn, args, kwargs, variants)) as kept:
        dynamo.reset()
        try:
            out = dynamo.explain(fn)(*args, **kwargs)
        except Exception:
            kept.restore()
            _raise_if_eager_fails(fn, args, kwargs)
            raise
        kept.restore()  # each pass starts from the inputs as they were
        breaks = []
        for r in out.break_reasons:
            fr = _user_stack_frame(getattr(r, "user_stack", None), fn_file)
            stack = list(getattr(r, "user_stack", None) or [])
            outer = stack[0] if fr is not None and stack and stack[0] is not fr else None
            breaks.append(Break(reason=_short_reason(r.reason), file=fr.filename if fr else None,
                                line=fr.lineno if fr else None, source=(fr.line or "").strip() if fr else None,
                                called_at=f"{os.path.basename(outer.filename)}:{outer.lineno}" if outer else None))
        missed = _logged_breaks(log.messages, out.break_reasons, fn_file)
        if missed:  # in source order with the others
            breaks = sorted(breaks + missed, key=lambda b: (b.file is None, b.file or "", b.line or 0))

        # Recompiles: a counting backend over calls with changing inputs (each compile calls it once).
        compiles = [0]

        def counting(gm, example_inputs):
            compiles[0] += 1
            return gm.forward

        dynamo.reset()
        log.messages.clear()
        compiled = torch.compile(fn, backend=counting)
        if variants is None and not trees.flatten((tuple(args), kwargs))[0]:
            variants = []  # no inputs to change: the one call is all there is
            notes.append("no inputs to change: recompiles are not counted")
        # (args, kwargs) per call: the default variants change keyword tensors too (a tensor passed by keyword was
        # passed unchanged to every call, and its shape's recompiles never showed); the caller's keep kwargs
        calls = [(tuple(args), kwargs)] + ([(tuple(v), kwargs) for v in variants] if variants is not None else
                                           _default_calls(tuple(args), kwargs))
        made = 0
        recompile_msgs: list[str] = []
        counted = 0  # compiles after the first call, from the calls that ran (when dynamo logs no recompiles)
        for i, (a, kw) in enumerate(calls):
            seen, before = len(log.messages), compiles[0]
            try:
                compiled(*a, **kw)
                made += 1
            except Exception as exc:  # a variant the function does not accept: say so, go on
                notes.append(f"call {i} with changed inputs failed: {graphs._first_line(exc)}")
                continue  # its recompile is of inputs the function refuses: not counted
            finally:
                kept.restore()
            if i > 0:
                recompile_msgs += [m for m in log.messages[seen:] if m.startswith("Recompiling")]
                counted += compiles[0] - before
        reasons, expected_reasons, changed = [], [], set()
        for m in recompile_msgs:
            reason = _recompile_reason(m, name)
            if reason not in reasons:
                reasons.append(reason)
            # an input's first change is dynamo's automatic-dynamic recompile; its next is a real one. Per frame: the
            # code resumed after a break holds its own guards on the same input, and recompiles once for it too
            if (changed_input := _dynamic_input(m)) is not None \
                    and (key := (m.splitlines()[0], changed_input)) not in changed:
                changed.add(key)
                expected_reasons.append(reason)
        logged = any(m.startswith("Recompiling") for m in log.messages)
        recompiles = len(recompile_msgs) if logged else counted

        fullgraph_ok, fullgraph_error = (True if check_fullgraph else None), None
        if check_fullgraph:
            dynamo.reset()
            try:
                torch.compile(fn, fullgraph=True, backend="eager")(*args, **kwargs)
            except Exception as exc:
                fullgraph_ok, fullgraph_error = False, _short_reason(graphs._first_line(exc))
        dynamo.reset()
    if (said := kept.note()) is not None:  # restored on leaving the block above, after the fullgraph pass
        notes.append(said)

    # every break reason dynamo reports counts: its graph_break_count skips breaks whose resumed code
    # held no ops (a data-dependent branch that took the empty side), which depends on the input values
    return Explanation(function=name, graph_count=int(out.graph_count),
                       break_count=max(len(breaks), int(out.graph_break_count)),
                       breaks=breaks, ops_per_graph=_ops_per_graph(out),
                       calls=made, recompiles=int(recompiles), recompile_reasons=reasons,
                       fullgraph_ok=fullgraph_ok, fullgraph_error=fullgraph_error, notes=notes,
                       expected_recompiles=len(expected_reasons), expected_reasons=expected_reasons)
