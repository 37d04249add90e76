"""Hand-captured CUDA graphs (`capture()` -> `Graphed`) and the torch.compile graph-break finder (`explain()`).

capture() builds on gpuspeed.timing.record_graph: it warms the function up on a side stream, captures one
call into a private memory pool, and replays it. Inputs are static buffers: the first call with a given
signature (shapes, dtypes, non-tensor values) provides them; later calls with the very same tensors cost
nothing, other tensors are copied in. Outputs are the graph's static buffers (overwritten by the next
replay) unless clone=True. What cannot be captured (a host sync, a CPU tensor, a data-dependent shape)
fails with a CaptureError that names the op and the user's source line.

explain() wraps torch._dynamo.explain: graphs, each break with its reason and source line, the
recompiles seen over several calls with changing inputs, and whether fullgraph=True compiles.
"""

from __future__ import annotations

import contextlib
import linecache
import logging
import os
import sys
import warnings
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from gpuspeed import timing
from gpuspeed.errors import UserError

_TORCH_DIR = None
_HERE = os.path.abspath(__file__)


class CaptureError(UserError):
    """The function cannot be captured into a CUDA graph; the message names the op and the line."""

    def __init__(self, message: str, *, op: str | None = None, kind: str | None = None,
                 where: str | None = None):
        super().__init__(message)
        self.op, self.kind, self.where = op, kind, where


# ---------------------------------------------------------------------------------------------------
# Nested arguments: flatten to leaves, rebuild
# ---------------------------------------------------------------------------------------------------


def _is_tensor(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "data_ptr")


def _flatten(obj, out: list):
    """Leaves of nested tuples/lists/dicts, in order; returns a spec that _unflatten reads."""
    if isinstance(obj, (tuple, list)):
        return (type(obj), [_flatten(o, out) for o in obj])
    if isinstance(obj, dict):
        return (dict, [(k, _flatten(v, out)) for k, v in obj.items()])
    out.append(obj)
    return None


def _unflatten(spec, leaves: list, pos: list | None = None):
    pos = pos if pos is not None else [0]
    if spec is None:
        v = leaves[pos[0]]
        pos[0] += 1
        return v
    kind, items = spec
    if kind is dict:
        return {k: _unflatten(s, leaves, pos) for k, s in items}
    vals = [_unflatten(s, leaves, pos) for s in items]
    return tuple(vals) if kind is tuple else vals


def _leaf_key(x):
    if _is_tensor(x):
        return ("T", tuple(x.shape), str(x.dtype), str(x.device))
    try:
        hash(x)
        return ("C", type(x).__name__, x)
    except TypeError:
        return ("C", type(x).__name__, repr(x))


def signature(args: tuple):
    """The cache key of a call: shapes, dtypes and devices of tensors, values of everything else."""
    leaves: list = []
    spec = _flatten(args, leaves)
    return (repr(spec), tuple(_leaf_key(x) for x in leaves))


# ---------------------------------------------------------------------------------------------------
# Naming the op that broke a capture
# ---------------------------------------------------------------------------------------------------

_SYNC_OPS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "__repr__",
             "__str__", "__format__", "synchronize", "is_nonzero", "equal", "allclose"}
_DYNAMIC_SHAPE_OPS = {"nonzero", "masked_select", "unique", "unique_consecutive", "repeat_interleave",
                      "bincount", "argwhere", "nonzero_static"}
_HOST_COPY_OPS = {"cpu", "to", "cuda", "copy_", "tensor", "as_tensor", "from_numpy", "pin_memory"}


def _user_frame() -> str | None:
    """file:line  source of the innermost frame outside torch and gpuspeed.graphs."""
    global _TORCH_DIR
    if _TORCH_DIR is None:
        import torch

        _TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
    f = sys._getframe(1)
    while f is not None:
        name = os.path.abspath(f.f_code.co_filename)
        if not name.startswith(_TORCH_DIR) and name != _HERE and "contextlib" not in name:
            src = linecache.getline(name, f.f_lineno).strip()
            return f"{os.path.basename(name)}:{f.f_lineno}" + (f" `{src}`" if src else "")
        f = f.f_back
    return None


def _classify(op: str, args, kwargs) -> str:
    short = op.rsplit(".", 1)[-1]
    leaves: list = []
    _flatten((args, kwargs), leaves)
    cpu_tensor = any(_is_tensor(x) and x.device.type == "cpu" and x.dim() > 0 for x in leaves)
    if short == "__getitem__" and any(_is_tensor(x) and str(x.dtype) == "torch.bool" for x in leaves[1:]):
        return "a data-dependent shape (boolean-mask indexing)"
    if short in _DYNAMIC_SHAPE_OPS:
        return "a data-dependent shape"
    if cpu_tensor or short in _HOST_COPY_OPS:
        return "a CPU tensor (a host<->device copy)"
    if short in _SYNC_OPS:
        return "a host sync"
    return "an operation that cannot be captured"


def _tracker():
    """A TorchFunctionMode that remembers the innermost torch call that raised, and where."""
    from torch.overrides import TorchFunctionMode, resolve_name

    class _Tracker(TorchFunctionMode):
        failed: tuple | None = None

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            try:
                return func(*args, **kwargs)
            except Exception:
                if self.failed is None:
                    name = resolve_name(func) or getattr(func, "__name__", repr(func))
                    self.failed = (name.replace("torch._C.TensorBase", "torch.Tensor"),
                                   _classify(name, args, kwargs), _user_frame())
                raise

    return _Tracker()


def _first_line(exc: BaseException) -> str:
    """The root cause's first line: capture_end's error hides the op's error in __context__."""
    seen = exc
    while seen.__context__ is not None and seen.__context__ is not seen:
        seen = seen.__context__
    text = str(seen).strip().splitlines()
    return f"{type(seen).__name__}: {text[0] if text else ''}"


# ---------------------------------------------------------------------------------------------------
# capture()
# ---------------------------------------------------------------------------------------------------


@dataclass
class _Entry:
    graph: Any
    static_args: tuple
    static_leaves: list
    outputs: Any
    pool: Any


class Graphed:
    """A function captured into CUDA graphs, one per input signature (a small LRU cache).

    g(*args): copy tensors that are not the static buffers in, replay, return the static outputs (views
    overwritten by the next replay) or clones with clone=True. g.replay(): replay on what is in the
    static buffers now. g.static_inputs / g.static_outputs: those of the latest signature called.
    Without a GPU, g(*args) calls fn eagerly (g.mode == "eager", g.note says why).
    """

    def __init__(self, fn: Callable, *, clone: bool = False, own_inputs: bool = False, warmup: int = 3,
                 max_cache: int = 8, mode: str = "graph", note: str = ""):
        if max_cache < 1:
            raise UserError("max_cache must be >= 1")
        self.fn, self.clone, self.own_inputs, self.warmup, self.max_cache = (
            fn, clone, own_inputs, warmup, max_cache)
        self.mode, self.note = mode, note
        self.captures = 0  # how many graphs were recorded (re-captures included)
        self._cache: OrderedDict = OrderedDict()
        self._last: _Entry | None = None

    # -- public -------------------------------------------------------------------------------------
    def __call__(self, *args):
        if self.mode == "eager":
            return self.fn(*args)
        key = signature(args)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._record(args)
            self._cache[key] = entry
            if len(self._cache) > self.max_cache:  # drop the least recently used graph and its pool
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
            self._copy_in(entry, args)
        self._last = entry
        entry.graph.replay()
        return timing.clone_tree(entry.outputs) if self.clone else entry.outputs

    def replay(self):
        """Replay the latest graph on whatever its static inputs hold now; returns its outputs."""
        if self.mode == "eager":
            raise UserError(f"replay() needs a captured graph: {self.note}")
        if self._last is None:
            raise UserError("nothing captured yet: call the Graphed function once first")
        self._last.graph.replay()
        return self._last.outputs

    @property
    def static_inputs(self) -> tuple:
        if self._last is None:
            raise UserError("nothing captured yet")
        return self._last.static_args

    @property
    def static_outputs(self):
        if self._last is None:
            raise UserError("nothing captured yet")
        return self._last.outputs

    def cache_info(self) -> dict:
        return {"graphs": len(self._cache), "captures": self.captures, "max_cache": self.max_cache,
                "mode": self.mode}

    def __repr__(self) -> str:
        name = getattr(self.fn, "__name__", "fn")
        return f"Graphed({name}, mode={self.mode}, graphs={len(self._cache)}, captures={self.captures})"

    # -- internals ----------------------------------------------------------------------------------
    def _copy_in(self, entry: _Entry, args) -> None:
        leaves: list = []
        _flatten(args, leaves)
        for dst, src in zip(entry.static_leaves, leaves, strict=True):
            if not _is_tensor(dst) or src is dst:
                continue
            if (src.data_ptr() == dst.data_ptr() and src.stride() == dst.stride()):
                continue  # the same memory passed in place: nothing to copy
            dst.copy_(src, non_blocking=True)

    def _record(self, args) -> _Entry:
        import torch

        leaves: list = []
        spec = _flatten(args, leaves)
        for i, x in enumerate(leaves):
            if _is_tensor(x) and x.device.type != "cuda":
                raise CaptureError(f"capture(): input leaf {i} is a {x.device.type} tensor; CUDA graphs "
                                   f"need CUDA inputs (move it with .cuda())", kind="a CPU tensor")
        static_leaves = [x.clone() if (self.own_inputs and _is_tensor(x)) else x for x in leaves]
        static_args = _unflatten(spec, static_leaves)
        pool = torch.cuda.graph_pool_handle()  # private pool: the graph's memory is its own

        def body():
            return self.fn(*static_args)

        stream = torch.cuda.current_stream()
        try:
            graph, out = timing.record_graph(body, warmup=self.warmup, pool=pool)
        except CaptureError:
            raise
        except Exception as exc:
            torch.cuda.set_stream(stream)  # a failed capture_end leaves the capture stream current
            raise self._diagnose(static_args, exc) from exc
        self.captures += 1
        return _Entry(graph=graph, static_args=static_args, static_leaves=static_leaves, outputs=out,
                      pool=pool)

    def _diagnose(self, static_args, exc: BaseException) -> CaptureError:
        """Capture again under a tracker to name the op that failed; one line for the user."""
        import torch

        cause = _first_line(exc)
        tracker = _tracker()

        def body():
            with tracker:
                return self.fn(*static_args)

        stream = torch.cuda.current_stream()
        try:
            timing.record_graph(body, warmup=0)
        except Exception:
            torch.cuda.set_stream(stream)
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
        name = getattr(self.fn, "__name__", "fn")
        if tracker.failed is None:
            return CaptureError(f"capture({name}) failed: {cause}")
        op, kind, where = tracker.failed
        at = f" at {where}" if where else ""
        return CaptureError(f"capture({name}) failed: {kind} in {op}{at} cannot be captured ({cause})",
                            op=op, kind=kind, where=where)


def capture(fn: Callable, *example_args, clone: bool = False, own_inputs: bool = False, warmup: int = 3,
            max_cache: int = 8, device: str = "auto") -> Graphed:
    """Capture `fn(*example_args)` into a CUDA graph now; returns a Graphed that replays it.

    clone: return clones of the static outputs instead of the graph's own buffers.
    own_inputs: copy the example tensors into private static buffers (default: the example tensors
    themselves are the static inputs, so passing them again in place costs no copy).
    Python scalars are baked into the graph: a new value re-captures (pass changing scalars as tensors).
    max_cache: how many signatures keep a graph. Without a CUDA device fn runs eagerly and g.note says so.
    """
    from gpuspeed import device as _device

    if not callable(fn):
        raise UserError(f"capture() needs a callable, got {type(fn).__name__}")
    where = _device.resolve_device(device)
    if where != "cuda":
        note = ("no CUDA device: capture() runs the function eagerly" if not _device.cuda_available()
                else "device='cpu': capture() runs the function eagerly")
        warnings.warn(note, RuntimeWarning, stacklevel=2)
        return Graphed(fn, clone=clone, max_cache=max_cache, mode="eager", note=note)
    g = Graphed(fn, clone=clone, own_inputs=own_inputs, warmup=warmup, max_cache=max_cache)
    if example_args:
        key = signature(example_args)
        g._cache[key] = g._last = g._record(example_args)
    return g


# ---------------------------------------------------------------------------------------------------
# explain(): the graph-break finder
# ---------------------------------------------------------------------------------------------------


@dataclass
class Break:
    reason: str
    file: str | None
    line: int | None
    source: str | None

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
    fullgraph_ok: bool
    fullgraph_error: str | None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        """The report, one screen: headline, breaks with their lines, recompiles, fullgraph."""
        out = [f"{self.function}: {self.graph_count} graph(s), {self.break_count} graph break(s); "
               f"fullgraph=True {'compiles' if self.fullgraph_ok else 'fails'}"]
        for i, b in enumerate(self.breaks, 1):
            out.append(f"  break {i} at {b.where()}: {b.reason}")
            if b.source:
                out.append(f"      {b.source}")
        out.append(f"  recompiles over {self.calls} calls with changing inputs: {self.recompiles}")
        for r in self.recompile_reasons[:4]:
            out.append(f"    - {r}")
        if not self.fullgraph_ok and self.fullgraph_error:
            out.append(f"  fullgraph error: {self.fullgraph_error}")
        out.extend(f"  note: {n}" for n in self.notes)
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _short_reason(text: str) -> str:
    """Dynamo's reason, first line plus its 'Explanation:' line, without hints."""
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    if not lines:
        return "?"
    head = lines[0]
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

    torch._logging.set_logs(recompiles=True)
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
        yield catcher
    finally:
        for name, handlers in swapped.items():
            lg = logging.getLogger(name)
            lg.removeHandler(catcher)
            for h in handlers:
                lg.addHandler(h)
        torch._logging.set_logs()  # back to torch's defaults


def _recompile_reason(message: str) -> str:
    """'f at file.py:8: tensor 'x' size mismatch ...' from dynamo's multi-line recompile record."""
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
    return f"{where}: {text}" + (f"  ({src})" if src else "")


def default_variants(args: tuple, n: int = 3) -> list[tuple]:
    """Calls with changing inputs: fresh values, then every tensor's first dim x2, x3; ints +1."""
    import torch

    def vary(x, scale: int, bump: int):
        if _is_tensor(x):
            shape = list(x.shape)
            if shape and scale > 1:
                shape[0] *= scale
            if x.is_floating_point():
                return torch.randn(shape, dtype=x.dtype, device=x.device)
            if x.dtype == torch.bool:
                return torch.rand(shape, device=x.device) > 0.5
            return torch.randint(0, 8, shape, dtype=x.dtype, device=x.device)
        if isinstance(x, bool):
            return x
        if isinstance(x, int):
            return x + bump
        return x

    out = []
    for i in range(n):
        leaves: list = []
        spec = _flatten(args, leaves)
        out.append(_unflatten(spec, [vary(x, 1 if i == 0 else i + 1, i) for x in leaves]))
    return out


def explain(fn: Callable, *args, variants: list[tuple] | None = None, check_fullgraph: bool = True,
            **kwargs) -> Explanation:
    """Graph breaks, recompiles and fullgraph-ability of `fn(*args, **kwargs)` under torch.compile.

    variants: argument tuples for the extra calls that count recompiles (default: default_variants(args)).
    Uses dynamo's "eager" backend throughout: it finds graphs and breaks without compiling kernels.
    """
    import torch
    import torch._dynamo as dynamo

    if not callable(fn):
        raise UserError(f"explain() needs a callable, got {type(fn).__name__}")
    name = getattr(fn, "__qualname__", getattr(fn, "__name__", "fn"))
    code = getattr(fn, "__code__", None)
    fn_file = os.path.abspath(code.co_filename) if code else None
    notes: list[str] = []

    with _quiet_dynamo() as log:
        dynamo.reset()
        out = dynamo.explain(fn)(*args, **kwargs)
        breaks = []
        for r in out.break_reasons:
            fr = _user_stack_frame(getattr(r, "user_stack", None), fn_file)
            breaks.append(Break(reason=_short_reason(r.reason), file=fr.filename if fr else None,
                                line=fr.lineno if fr else None, source=(fr.line or "").strip() if fr else None))

        # Recompiles: a counting backend over calls with changing inputs (each compile calls it once).
        compiles = [0]

        def counting(gm, example_inputs):
            compiles[0] += 1
            return gm.forward

        dynamo.reset()
        log.messages.clear()
        compiled = torch.compile(fn, backend=counting)
        calls = [tuple(args)] + list(variants if variants is not None else default_variants(tuple(args)))
        first = None
        made = 0
        for i, a in enumerate(calls):
            try:
                compiled(*a, **kwargs)
                made += 1
            except Exception as exc:  # a variant the function does not accept: say so, go on
                notes.append(f"call {i} with changed inputs failed: {_first_line(exc)}")
            if i == 0:
                first = compiles[0]
        recompile_msgs = [m for m in log.messages if m.startswith("Recompiling")]
        reasons = []
        for m in recompile_msgs:
            reason = _recompile_reason(m)
            if reason not in reasons:
                reasons.append(reason)
        recompiles = len(recompile_msgs) if recompile_msgs else max(0, compiles[0] - (first or 0))

        fullgraph_ok, fullgraph_error = True, None
        if check_fullgraph:
            dynamo.reset()
            try:
                torch.compile(fn, fullgraph=True, backend="eager")(*args, **kwargs)
            except Exception as exc:
                fullgraph_ok, fullgraph_error = False, _short_reason(_first_line(exc))
        dynamo.reset()

    # every break reason dynamo reports counts: its graph_break_count skips breaks whose resumed code
    # held no ops (a data-dependent branch that took the empty side), which depends on the input values
    return Explanation(function=name, graph_count=int(out.graph_count),
                       break_count=max(len(breaks), int(out.graph_break_count)),
                       breaks=breaks, ops_per_graph=[len(o) for o in (out.ops_per_graph or [])],
                       calls=made, recompiles=int(recompiles), recompile_reasons=reasons,
                       fullgraph_ok=fullgraph_ok, fullgraph_error=fullgraph_error, notes=notes)
