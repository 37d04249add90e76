"""Argument trees: nested tuples, lists, dicts and dataclass instances of arrays and plain values.

The one walker of gpuspeed's call arguments and results: `leaves` / `flatten` / `unflatten`, which
leaves are GPU arrays, and `clone_tree`, the copy bench's `rotate` and verify use. A clone keeps what
the timed code sees: each array's shape, strides, storage offset and memory order, and which arguments
alias each other (views of one buffer stay views of one new buffer).
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from typing import Any, Iterator

# Each cloned buffer starts at this byte alignment relative to the original's, so a clone is exactly as
# aligned as what it copies (vectorized kernels pick their path on it).
_ALIGN = 256


def module_of(x) -> str:
    """Top-level package of a value's type: "torch", "numpy", "cupy", "jax", "builtins", ..."""
    return type(x).__module__.split(".")[0]


def is_record(x) -> bool:
    """A dataclass instance (not the class itself): walked field by field, like a dict of its fields."""
    return dataclasses.is_dataclass(x) and not isinstance(x, type)


def record_fields(obj) -> list[str]:
    """The names of a dataclass instance's fields that hold a value (a field(init=False) never set holds none)."""
    return [f.name for f in dataclasses.fields(obj) if hasattr(obj, f.name)]


def leaves(obj) -> Iterator[Any]:
    """Every leaf of nested tuples/lists/dicts/dataclass instances, in order."""
    if isinstance(obj, (list, tuple)):
        for o in obj:
            yield from leaves(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from leaves(o)
    elif is_record(obj):
        for name in record_fields(obj):
            yield from leaves(getattr(obj, name))
    else:
        yield obj


NUMBER_TYPES = (bool, int, float, complex)


def _numpy_number(x) -> bool:
    """A NumPy scalar of a kind check() compares as float64 or complex128 (bool, int, float, complex; no longdouble)."""
    import numpy as np

    return isinstance(x, np.generic) and x.dtype.kind in ("b", "i", "u", "f", "c") and x.dtype.itemsize <= (
        16 if x.dtype.kind == "c" else 8)


def number_grid(obj) -> tuple[tuple[int, ...], list] | None:
    """(shape, the numbers in row-major order, as a list or tuple) when obj is a list or tuple of plain numbers
    (Python's bool, int, float, complex, or NumPy scalars; integers within +-2**53, which float64 holds exactly), or of
    equally long such lists nested alike, holding at least one number; else None."""
    import numbers

    if not isinstance(obj, (list, tuple)) or hasattr(obj, "_fields") or not obj:  # a namedtuple: walked by field
        return None
    if all(type(x) in NUMBER_TYPES or _numpy_number(x) for x in obj):
        if not all(-2**53 < x < 2**53 for x in obj if type(x) is not float and isinstance(x, numbers.Integral)):
            return None
        return (len(obj),), obj  # no copy: the comparison reads it a slice at a time
    rows = [number_grid(x) for x in obj]
    if any(r is None for r in rows) or len({r[0] for r in rows}) != 1:  # a ragged grid or a leaf that is no number
        return None
    return (len(obj), *rows[0][0]), [x for _, row in rows for x in row]


def one_pass_argument(args: tuple, kwargs: dict) -> str | None:
    """Which top-level argument is a one-pass iterator (a generator, map, zip, iter(list)...), in words, or
    None: a function called more than once on it (timing, a warm-up) sees it empty after the first call."""
    from collections.abc import Iterator

    for label, value in [*((f"argument {i + 1}", a) for i, a in enumerate(args)),
                         *((f"keyword argument {k!r}", v) for k, v in kwargs.items())]:
        if isinstance(value, Iterator) and type(value).__module__ in ("builtins", "itertools"):
            return f"{label} is a one-pass iterator ({type(value).__name__}): the first call uses it up"
    return None


def bad_keyword(kwargs) -> str | None:
    """Why `kwargs` cannot be passed as fn(**kwargs) (a key that is not a string: {1: x}), in words, or None."""
    odd = [k for k in kwargs if not isinstance(k, str)][:1]
    if not odd:
        return None
    return f"kwargs= keys are keyword names (strings), got the {type(odd[0]).__name__} key {odd[0]!r}"


def nbytes(obj) -> int:
    """Bytes held by the arrays of a tree (torch, NumPy, CuPy, JAX); scalars count nothing."""
    total = 0
    for x in leaves(obj):
        if hasattr(x, "nbytes"):
            total += int(x.nbytes)
        elif hasattr(x, "element_size") and hasattr(x, "numel"):
            total += int(x.element_size() * x.numel())
        elif is_torch_module(x):
            # an nn.Module argument: its weights are held on the device as much as any array (a shared one once)
            total += sum(int(t.element_size() * t.numel()) for t in {id(t): t for t in (*x.parameters(),
                                                                                         *x.buffers())}.values())
    return total


def is_torch_module(x) -> bool:
    """An nn.Module instance (torch not imported for it: a model means torch is loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.nn.Module)


def flatten(obj) -> tuple[list, Any]:
    """(leaves, spec): the leaves in order and a spec that `unflatten` rebuilds the structure from."""
    out: list = []
    return out, _spec(obj, out)


def _spec(obj, out: list):
    if isinstance(obj, (tuple, list)):
        return (type(obj), [_spec(o, out) for o in obj])
    if isinstance(obj, dict):
        return (type(obj), [(k, _spec(v, out)) for k, v in obj.items()])
    if is_record(obj):
        names = record_fields(obj)
        return (_Record(obj, names), [(n, _spec(getattr(obj, n), out)) for n in names])
    out.append(obj)
    return None


class _Record:
    """The spec of a dataclass instance: rebuilt as a shallow copy of it with its fields replaced (so fields
    outside __init__, frozen classes and attributes set after construction come through). Its repr names the
    class and fields only, never their values: graphs key their cache on a spec's repr."""

    __slots__ = ("template", "names")

    def __init__(self, template, names: list[str]):
        self.template, self.names = template, names

    def __repr__(self) -> str:
        kind = type(self.template)
        return f"{kind.__module__}.{kind.__qualname__}({', '.join(self.names)})"

    def build(self, items: list):
        new = copy.copy(self.template)
        for name, value in items:
            object.__setattr__(new, name, value)  # object's: a frozen dataclass refuses its own
        return new


def unflatten(spec, values: list):
    """The structure `spec` describes, with `values` as its leaves (in flatten's order)."""
    position = iter(values)
    return _build(spec, position)


def _build(spec, position):
    if spec is None:
        return next(position)
    kind, items = spec
    if isinstance(kind, _Record):
        return kind.build([(k, _build(s, position)) for k, s in items])
    if issubclass(kind, dict):
        built = [(k, _build(s, position)) for k, s in items]
        try:
            return kind(built)
        except TypeError:  # a dict subclass whose constructor wants more (defaultdict)
            return dict(built)
    built = [_build(s, position) for s in items]
    if issubclass(kind, tuple):
        return kind(*built) if hasattr(kind, "_fields") else kind(built)  # namedtuples take fields
    return kind(built) if kind is not list else built


def is_gpu_array(x) -> bool:
    mod = module_of(x)
    if mod == "torch":
        return bool(getattr(x, "is_cuda", False))
    if mod == "cupy":
        return hasattr(x, "shape")
    if mod in ("jax", "jaxlib"):
        try:
            return any(d.platform == "gpu" for d in x.devices())
        except Exception:
            return False
    return False


def has_gpu_data(obj) -> bool:
    return any(is_gpu_array(x) for x in leaves(obj))


def host_arrays(obj) -> list:
    """The leaves that are arrays in host memory (NumPy, CPU torch tensors, ...)."""
    return [x for x in leaves(obj) if hasattr(x, "shape") and not is_gpu_array(x)]


# ---------------------------------------------------------------------------------------------------
# Cloning
# ---------------------------------------------------------------------------------------------------


def clone_tree(obj):
    """A copy of every array in a nested structure (torch, NumPy, CuPy, JAX); other leaves kept as they are.

    Each clone has the original's shape, strides, offset and memory order, and arrays that share memory
    (views of one buffer, or one array passed twice) share memory in the same way in the copy. The bytes
    copied are the span the arguments use of each buffer, not the whole buffer they view.
    """
    values, spec = flatten(obj)
    clones: dict[int, Any] = {}  # id(original) -> its clone: one array passed twice stays one array
    groups: dict[tuple, list] = {}  # arrays over one buffer, cloned together so they keep aliasing
    for x in values:
        key = _buffer_key(x)
        if key is not None and id(x) not in clones:
            clones[id(x)] = None
            groups.setdefault(key, []).append(x)
    for key, members in groups.items():
        try:
            copies = _CLONERS[key[0]](members)
        except Exception:  # an array kind the span copy cannot view (a subclass, meta tensors): plain copies
            copies = [_plain_copy(x) for x in members]
        for x, c in zip(members, copies, strict=True):
            clones[id(x)] = c
    for x in values:
        if id(x) not in clones:
            clones[id(x)] = _plain_copy(x)
    return unflatten(spec, [clones[id(x)] for x in values])


def clone_copies(obj) -> list[tuple[Any, int]]:
    """(an array, bytes) for each copy clone_tree(obj) makes: the span of its buffer that the arrays viewing it use (a
    broadcast view's few bytes, not its shape's), or an array's own bytes where it is copied alone."""
    values, _ = flatten(obj)
    groups: dict[tuple, list] = {}
    alone: list = []
    seen: set[int] = set()
    for x in values:
        if id(x) in seen:  # one array passed twice is copied once
            continue
        seen.add(id(x))
        key = _buffer_key(x)
        if key is None:
            alone.append(x)
        else:
            groups.setdefault(key, []).append(x)
    copies = []
    for key, members in groups.items():
        try:
            size = _group_span(key[0], members)
        except Exception:  # what clone_tree copies plainly then
            size = sum(nbytes(x) for x in members)
        copies.append((members[0], size))
    return copies + [(x, nbytes(x)) for x in alone if nbytes(x)]


def _group_span(kind: str, members: list) -> int:
    """Bytes of the span that arrays over one buffer use: what _clone_torch / _clone_numpy / _clone_cupy copy."""
    if kind == "torch":
        spans = [_span(t.storage_offset() * t.element_size(), t.shape, [d * t.element_size() for d in t.stride()],
                       t.element_size()) for t in members]
    elif kind == "numpy":
        spans = [_span(x.__array_interface__["data"][0], x.shape, x.strides, x.itemsize) for x in members]
    else:
        spans = [_span(x.data.ptr, x.shape, x.strides, x.itemsize) for x in members]
    return max(h for _, h in spans) - min(lo for lo, _ in spans) + _ALIGN  # the copy starts aligned


def _buffer_key(x):
    """(library, identity of the buffer x views), or None for leaves cloned one by one (or not at all)."""
    mod = module_of(x)
    if mod == "torch" and type(x).__name__ in ("Tensor", "Parameter"):
        import torch

        if x.layout != torch.strided or x.numel() == 0 or x.device.type == "meta":
            return None
        return ("torch", str(x.device), x.untyped_storage().data_ptr())
    if mod == "numpy" and type(x).__name__ == "ndarray" and x.size > 0 and not x.dtype.hasobject:
        return ("numpy", id(_numpy_root(x)))
    if mod == "cupy" and type(x).__name__ == "ndarray" and x.size > 0:
        return ("cupy", x.device.id, x.data.mem.ptr)
    return None


def _plain_copy(x):
    mod = module_of(x)
    if mod == "torch" and hasattr(x, "clone"):
        return x.clone()
    if mod in ("numpy", "cupy") and hasattr(x, "copy"):
        return x.copy(order="K")
    if mod in ("jax", "jaxlib") and hasattr(x, "copy"):  # immutable: a copy is only a fresh buffer
        return x.copy()
    return x


def _span(start: int, shape, strides, itemsize: int) -> tuple[int, int]:
    """[low, high) byte range of a strided array whose first element sits at byte `start`."""
    low = start + sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s < 0)
    high = start + sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s > 0) + itemsize
    return low, high


def _aligned_low(lows: list[int], itemsizes: list[int], floor: int) -> int:
    """Where the copied span starts: the lowest byte used, rounded down to _ALIGN but not under `floor`
    (the buffer's own start), so each clone keeps its alignment; `floor` when a view's offset from the
    rounded start would not be a whole number of its elements."""
    low = max(floor, min(lows) // _ALIGN * _ALIGN)
    return low if all((lo - low) % size == 0 for lo, size in zip(lows, itemsizes, strict=True)) else floor


def _clone_torch(members: list) -> list:
    import torch

    storage = members[0].untyped_storage()
    starts = [t.storage_offset() * t.element_size() for t in members]
    spans = [_span(s, t.shape, [d * t.element_size() for d in t.stride()], t.element_size())
             for s, t in zip(starts, members, strict=True)]
    low = _aligned_low([s for s, _ in spans], [t.element_size() for t in members], floor=0)
    high = max(h for _, h in spans)
    with torch.no_grad():
        source = torch.empty(0, dtype=torch.uint8, device=members[0].device)
        source.set_(storage, low, (high - low,), (1,))
        copy = source.clone().untyped_storage()
        out = []
        for t, start in zip(members, starts, strict=True):
            c = torch.empty(0, dtype=t.dtype, device=t.device)
            c.set_(copy, (start - low) // t.element_size(), t.shape, t.stride())
            # the bytes are the unconjugated, unnegated ones: a lazy x.conj() or x.conj().imag view reads them
            # through its bit, which the clone must keep or it holds other values
            if t.is_conj():
                c = c.conj()
            if t.is_neg():
                c = torch._neg_view(c)
            if isinstance(t, torch.nn.Parameter):
                c = torch.nn.Parameter(c, requires_grad=t.requires_grad)
            elif t.requires_grad:
                c.requires_grad_(True)
            out.append(c)
    return out


def _numpy_root(x):
    """The ndarray that owns the memory x views (x itself when it owns it)."""
    import numpy as np

    while isinstance(x.base, np.ndarray):
        x = x.base
    return x


def _clone_numpy(members: list) -> list:
    import numpy as np
    from numpy.lib.stride_tricks import as_strided

    addr = [x.__array_interface__["data"][0] for x in members]
    spans = [_span(a, x.shape, x.strides, x.itemsize) for a, x in zip(addr, members, strict=True)]
    low, high = min(s for s, _ in spans), max(h for _, h in spans)
    source = np.asarray(_RawBytes(low, high - low))
    # start the copy at the original's alignment, so vector loads take the same path
    padded = np.empty(high - low + _ALIGN, dtype=np.uint8)
    shift = (low - padded.__array_interface__["data"][0]) % _ALIGN
    copy = padded[shift:shift + high - low]
    copy[:] = source
    out = []
    for a, x in zip(addr, members, strict=True):
        first = copy[a - low:a - low + x.itemsize].view(x.dtype)
        out.append(as_strided(first, x.shape, x.strides, writeable=x.flags.writeable))
    return out


class _RawBytes:
    """A read-only uint8 view of `size` bytes at address `ptr` (the span a group of NumPy views covers,
    which no single one of them exposes as one array)."""

    def __init__(self, ptr: int, size: int):
        self.__array_interface__ = {"data": (ptr, True), "shape": (size,), "typestr": "|u1", "version": 3}


def _clone_cupy(members: list) -> list:
    import cupy

    mem = members[0].data.mem
    addr = [x.data.ptr for x in members]
    spans = [_span(a, x.shape, x.strides, x.itemsize) for a, x in zip(addr, members, strict=True)]
    low = _aligned_low([s for s, _ in spans], [x.itemsize for x in members], floor=mem.ptr)
    high = max(h for _, h in spans)
    copy = cupy.cuda.alloc(high - low)
    copy.copy_from_device(cupy.cuda.MemoryPointer(mem, low - mem.ptr), high - low)
    return [cupy.ndarray(x.shape, x.dtype, memptr=copy + (a - low), strides=x.strides)
            for a, x in zip(addr, members, strict=True)]


_CLONERS = {"torch": _clone_torch, "numpy": _clone_numpy, "cupy": _clone_cupy}


def lazy_kind(fn) -> str | None:
    """'a generator function' or 'an async function' when a call to fn runs none of its body (it only makes a
    generator or coroutine object), else None."""
    import inspect

    target = inspect.unwrap(fn) if callable(fn) and not isinstance(fn, type) else fn
    if inspect.isgeneratorfunction(target):
        return "a generator function"
    if inspect.iscoroutinefunction(target) or inspect.isasyncgenfunction(target):
        return "an async function"
    return None


def callable_name(fn, default: str = "fn", qualified: bool = False) -> str:
    """A readable name for what a user passed: a function's (its __qualname__ when qualified), a functools.partial's
    function's, a module's or other callable object's class name."""
    import functools

    while isinstance(fn, functools.partial):
        fn = fn.func
    name = (getattr(fn, "__qualname__", None) if qualified else None) or getattr(fn, "__name__", None)
    if name is None and callable(fn):
        name = type(fn).__name__
    return name or default
