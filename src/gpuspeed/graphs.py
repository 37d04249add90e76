"""Hand-captured CUDA graphs: `capture()` -> `Graphed`.

capture() builds on gpuspeed.timing.record_graph: it warms the function up on a side stream, captures one
call into a private memory pool, and replays it. Inputs are static buffers: the first call with a given
signature (shapes, dtypes, non-tensor values) provides them; later calls with the very same tensors cost
nothing, other tensors are copied in. Outputs are the graph's static buffers (overwritten by the next
replay) unless clone=True. What cannot be captured (a host sync, a CPU tensor, a data-dependent shape)
fails with a CaptureError that names the op and the user's source line.

The torch.compile graph-break finder, explain(), is gpuspeed.graph_breaks (also reachable here).
"""

from __future__ import annotations

import contextlib
import hashlib
import linecache
import numbers
import os
import sys
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from gpuspeed import timing, trees
from gpuspeed.errors import UserError, require_flag

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
    """Leaves of nested tuples/lists/dicts appended to `out`, in order; returns the spec _unflatten reads."""
    leaves, spec = trees.flatten(obj)
    out.extend(leaves)
    return spec


_unflatten = trees.unflatten


def _leaf_key(x):
    if _is_tensor(x):
        return ("T", tuple(x.shape), str(x.dtype), str(x.device))
    if isinstance(x, float):  # its exact bits: 0.0 == -0.0 would replay x / -0.0 as +inf, NaN != NaN re-captured
        return ("C", type(x).__name__, x.hex())
    if trees.module_of(x) == "numpy" and hasattr(x, "tobytes") and not getattr(x.dtype, "hasobject", True):
        # an array is baked in like any value: by its bytes, since its repr rounds (1.0000001 prints as 1.) and elides.
        # A C-contiguous one is hashed in place (tobytes() copied it whole on every call first, and blake2b took
        # twice SHA-1's time: a 100 MB array cost 170-260 ms a call on a 2-core host, now 55-80); every byte is
        # still read, since a graph keyed on less (id, a sample) could replay values the array no longer holds
        try:
            data = memoryview(x).cast("B") if x.flags.c_contiguous and x.dtype.isnative else x.tobytes()
        except (TypeError, ValueError, BufferError):  # a dtype the buffer protocol does not take (datetime64)
            data = x.tobytes()
        digest = hashlib.sha1(data, usedforsecurity=False).hexdigest()  # not a guard against forgery: the fastest
        return ("C", type(x).__name__, x.shape, str(x.dtype), digest)
    try:
        hash(x)
        return ("C", type(x).__name__, x)
    except TypeError:
        return ("C", type(x).__name__, repr(x))


def _call_tree(args: tuple, kwargs: dict | None):
    """What a call passes, as one tree: the positional arguments, or (args, keyword arguments by name) when
    there are keyword arguments (sorted: f(a=x, b=y) and f(b=y, a=x) are one call)."""
    return (tuple(args), dict(sorted(kwargs.items()))) if kwargs else tuple(args)


def signature(args: tuple, kwargs: dict | None = None):
    """The cache key of a call: shapes, dtypes and devices of tensors, values of everything else (keyword
    arguments' too), and which tensor arguments are one tensor (a graph captured with f(a, a) reads one
    static buffer for both)."""
    leaves: list = []
    spec = _flatten(_call_tree(args, kwargs), leaves)
    first: dict = {}  # id of a tensor -> the position of its first appearance
    same = tuple(first.setdefault(id(x), i) for i, x in enumerate(leaves) if _is_tensor(x))
    return (repr(spec), tuple(_leaf_key(x) for x in leaves), same, _overlaps(leaves))


def _span(x) -> tuple | None:
    """(device index, lowest byte address, one past the highest) of a tensor's elements; None without an address."""
    try:
        n = x.numel()
        if not n:
            return None
        size, ptr = x.element_size(), x.data_ptr()
        if x.is_contiguous():  # the common case, without the per-dimension sums (signature runs on every call)
            return x.get_device(), ptr, ptr + n * size
        low = ptr - sum((k - 1) * -st for k, st in zip(x.shape, x.stride(), strict=True) if st < 0) * size
        high = low + sum((k - 1) * abs(st) for k, st in zip(x.shape, x.stride(), strict=True)) * size + size
        return x.get_device(), low, high
    except (RuntimeError, TypeError, ValueError, AttributeError, NotImplementedError):  # sparse, meta: no address
        return None


def _self_overlapping(x) -> bool:
    """Whether some elements of a tensor are one memory location (a stride 0 over a dimension of 2 or more)."""
    try:
        import torch

        return torch._debug_has_internal_overlap(x) != 0  # 1: it overlaps; 2: too hard to tell (treated as yes)
    except (AttributeError, RuntimeError, TypeError):
        return any(st == 0 and n > 1 for n, st in zip(x.shape, x.stride(), strict=True))


def _copy_pairs(todo: list) -> None:
    """dst.copy_(src) for each pair, right when a source shares memory with a buffer written before it is read
    (g(b, a) on a graph captured as g(a, b), the swap of a double buffer: a's buffer took b's values, then b's
    buffer read them back): such a source is cloned first."""
    if todo:
        written = [_span(dst) for dst, _ in todo]
        for k, (dst, src) in enumerate(todo):
            sp = _span(src)
            if sp is not None and any(w is not None and w[0] == sp[0] and sp[1] < w[2] and w[1] < sp[2]
                                      for w in written):
                todo[k] = (dst, src.clone())
    for dst, src in todo:
        dst.copy_(src, non_blocking=True)


def _overlaps(leaves: list) -> tuple:
    """How distinct tensor arguments overlap in memory: for each tensor whose bytes overlap an earlier-placed one
    (f(x[:-1], x[1:])), its position, the first position of its group, its byte offset from that one and its
    strides. Static buffers that overlap cannot take independent tensors copied in (the second copy overwrites
    part of the first): a call whose tensors overlap otherwise is another graph. Empty when nothing overlaps."""
    tensors = [(i, x) for i, x in enumerate(leaves) if _is_tensor(x)]
    if len(tensors) < 2:
        return ()
    spans = sorted((sp, i) for i, x in tensors if (sp := _span(x)) is not None)
    out, group, reach = [], None, None  # group: (device, position, low) of the cluster's first tensor
    for (where, low, high), i in spans:
        if group is not None and where == group[0] and low < reach:
            out.append((i, group[1], low - group[2], tuple(leaves[i].stride())))
            reach = max(reach, high)
        else:
            group, reach = (where, i, low), high
    if not out:
        return ()
    firsts = {g for _, g, _, _ in out}
    return tuple(sorted(out + [(g, g, 0, tuple(leaves[g].stride())) for g in firsts]))


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
    static_kwargs: dict
    static_leaves: list
    outputs: Any
    pool: Any


class Graphed:
    """A function captured into CUDA graphs, one per input signature (a small LRU cache).

    g(*args, **kwargs): copy tensors that are not the static buffers in, replay, return the static outputs
    (views overwritten by the next replay) or clones with clone=True. g.replay(): replay on what is in the
    static buffers now. g.static_inputs / g.static_kwargs / g.static_outputs: those of the latest signature
    called (keyword arguments are keyed and copied in like positional ones).
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
    def __call__(self, *args, **kwargs):
        if self.mode == "eager":  # clone=True holds here too: nothing returned aliases an input or earlier output
            out = self.fn(*args, **kwargs)
            return timing.clone_tree(out) if self.clone else out
        key = signature(args, kwargs)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._record(args, kwargs)
            self._cache[key] = entry
            if len(self._cache) > self.max_cache:  # drop the least recently used graph and its pool
                self._cache.popitem(last=False)
            # private static buffers (own_inputs, an expand()ed tensor's dense copy) went through the warm-up calls:
            # the caller's tensors are copied in again, so a function that updates its inputs in place replays once
            # on them, as the call after capture(fn, x) does (it replayed on the warm-ups' state: x + 4 for x.add_(1))
            self._copy_in(entry, _call_tree(args, kwargs))
        else:
            self._cache.move_to_end(key)
            self._copy_in(entry, _call_tree(args, kwargs))
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

    def _need_graph(self) -> _Entry:
        if self.mode == "eager":
            raise UserError(f"no static buffers: {self.note}")
        if self._last is None:
            raise UserError("nothing captured yet")
        return self._last

    @property
    def static_inputs(self) -> tuple:
        return self._need_graph().static_args

    @property
    def static_kwargs(self) -> dict:
        return self._need_graph().static_kwargs

    @property
    def static_outputs(self):
        return self._need_graph().outputs

    def cache_info(self) -> dict:
        return {"graphs": len(self._cache), "captures": self.captures, "max_cache": self.max_cache,
                "mode": self.mode}

    def __repr__(self) -> str:
        name = trees.callable_name(self.fn)
        return f"Graphed({name}, mode={self.mode}, graphs={len(self._cache)}, captures={self.captures})"

    # -- internals ----------------------------------------------------------------------------------
    def _copy_in(self, entry: _Entry, tree) -> None:
        leaves: list = []
        _flatten(tree, leaves)
        todo = []
        for dst, src in zip(entry.static_leaves, leaves, strict=True):
            if not _is_tensor(dst) or src is dst:
                continue
            if (src.data_ptr() == dst.data_ptr() and src.stride() == dst.stride()):
                continue  # the same memory passed in place: nothing to copy
            todo.append((dst, src))
        _copy_pairs(todo)

    def _record(self, args, kwargs: dict | None = None) -> _Entry:
        import torch

        leaves: list = []
        spec = _flatten(_call_tree(args, kwargs), leaves)
        for i, x in enumerate(leaves):
            if _is_tensor(x) and x.device.type != "cuda":
                raise CaptureError(f"capture(): input leaf {i} is a {x.device.type} tensor; CUDA graphs "
                                   f"need CUDA inputs (move it with .cuda())", kind="a CPU tensor")
        clones: dict = {}  # one tensor passed twice stays one static buffer, as the signature says
        for x in leaves:
            # a tensor whose elements share memory (an expand()ed one) cannot take another tensor copied in: its
            # static buffer is a dense copy of it
            if _is_tensor(x) and id(x) not in clones and (self.own_inputs or _self_overlapping(x)):
                clones[id(x)] = x.clone()  # preserve_format: an overlapping one comes out contiguous
        static_leaves = [clones.get(id(x), x) for x in leaves]
        static_args, static_kwargs = (_unflatten(spec, static_leaves) if kwargs else
                                      (_unflatten(spec, static_leaves), {}))
        pool = torch.cuda.graph_pool_handle()  # private pool: the graph's memory is its own

        def body():
            return self.fn(*static_args, **static_kwargs)

        stream = torch.cuda.current_stream()
        try:
            graph, out = timing.record_graph(body, warmup=self.warmup, pool=pool)
        except CaptureError:
            raise
        except timing.EmptyGraph as exc:  # a closure over CPU tensors: nothing to replay, and no op to name
            raise CaptureError(f"capture({trees.callable_name(self.fn)}): {exc} (pass device='cpu' to run it "
                               "eagerly)", kind="no GPU work") from exc
        except Exception as exc:
            torch.cuda.set_stream(stream)  # a failed capture_end leaves the capture stream current
            raise self._diagnose(static_args, static_kwargs, exc) from exc
        self.captures += 1
        return _Entry(graph=graph, static_args=tuple(static_args), static_kwargs=static_kwargs,
                      static_leaves=static_leaves, outputs=out, pool=pool)

    def _diagnose(self, static_args, static_kwargs: dict, exc: BaseException) -> CaptureError:
        """Capture again under a tracker to name the op that failed; one line for the user."""
        import torch

        cause = _first_line(exc)
        tracker = _tracker()

        def body():
            with tracker:
                return self.fn(*static_args, **static_kwargs)

        stream = torch.cuda.current_stream()
        try:
            timing.record_graph(body, warmup=0)
        except Exception:
            torch.cuda.set_stream(stream)
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
        name = trees.callable_name(self.fn)
        if tracker.failed is None:
            return CaptureError(f"capture({name}) failed: {cause}")
        op, kind, where = tracker.failed
        at = f" at {where}" if where else ""
        return CaptureError(f"capture({name}) failed: {kind} in {op}{at} cannot be captured ({cause})",
                            op=op, kind=kind, where=where)


def capture(fn: Callable, *example_args, kwargs: dict | None = None, clone: bool = False, own_inputs: bool = False,
            warmup: int = 3, max_cache: int = 8, device: str = "auto") -> Graphed:
    """Capture `fn(*example_args, **kwargs)` into a CUDA graph now; returns a Graphed that replays it.

    kwargs: the example call's keyword arguments (as bench() takes them); later calls pass theirs as usual,
    g(x, scale=2.0), keyed and copied in like positional arguments.
    clone: return clones of the static outputs instead of the graph's own buffers.
    own_inputs: copy the example tensors into private static buffers (default: the example tensors
    themselves are the static inputs, so passing them again in place costs no copy; an expand()ed one, whose
    elements share memory, gets a dense buffer of its own). Tensors that overlap in memory, f(x[:-1], x[1:]),
    are keyed by how they overlap: independent tensors passed later get a graph of their own.
    Python scalars are baked into the graph: a new value re-captures (pass changing scalars as tensors).
    max_cache: how many signatures keep a graph. Without a CUDA device fn runs eagerly and g.note says so.
    Each capture (here, and for every new signature) runs fn `warmup` times on the static inputs before it
    records (recording runs nothing): a function that updates its inputs in place (x.add_(1), a cache write, an
    optimizer step on state it closes over) has applied that update `warmup` times before the first replay. With
    the default static inputs (the tensors passed) capture(f, x) leaves x at x + warmup, and the first g(x) returns
    x + warmup + 1 where f(x) gives x + 1: capture on scratch copies, or with own_inputs=True, whose private buffers
    take the tensors passed at every call (the first one included): g(x) then returns what f(x) would, in
    g.static_inputs, and x itself is never updated. State outside the arguments is not restored either way.
    """
    from gpuspeed import device as _device

    if not callable(fn):
        raise UserError(f"capture() needs a callable, got {type(fn).__name__}")
    name = trees.callable_name(fn)
    if (why := timing.lazy_result(fn, name, "capture() would record")) is not None:
        raise UserError(why)
    for label, value, least in (("warmup", warmup, 0), ("max_cache", max_cache, 1)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
            raise UserError(f"capture(): {label} must be a whole number >= {least}, got {value!r}")
    warmup, max_cache = int(warmup), int(max_cache)
    for label, value in (("clone", clone), ("own_inputs", own_inputs)):
        require_flag(f"capture(): {label}", value)  # clone="no" returned clones as True does
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise UserError(f"capture(): kwargs= takes a dict of keyword arguments for fn, got {type(kwargs).__name__}")
    kwargs = dict(kwargs or {})
    where = _device.resolve_device(device)
    if where != "cuda":
        note = ("no CUDA device: capture() runs the function eagerly" if not _device.cuda_available()
                else "device='cpu': capture() runs the function eagerly")
        warnings.warn(note, RuntimeWarning, stacklevel=2)
        return Graphed(fn, clone=clone, max_cache=max_cache, mode="eager", note=note)
    g = Graphed(fn, clone=clone, own_inputs=own_inputs, warmup=warmup, max_cache=max_cache)
    if example_args or kwargs:
        key = signature(example_args, kwargs)
        g._cache[key] = g._last = g._record(example_args, kwargs)
    return g


def __getattr__(name: str):
    """explain() and its types live in gpuspeed.graph_breaks; `gpuspeed.graphs.explain` still works."""
    if name in ("explain", "Explanation", "Break", "default_variants"):
        from gpuspeed import graph_breaks

        return getattr(graph_breaks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
