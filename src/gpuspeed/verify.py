"""check(): is an output right? Compared in float64 on the host, against a (higher-precision) reference.

The rule, for each float leaf (README's check() section says the same):
- every element: |out - ref| <= atol + rtol * |ref|;
- no NaN or Inf that the reference does not hold (NaN never passes unless equal_nan=True);
- and, only when atol is left to its default, the relative L2 error ||out - ref|| / ||ref|| <= rtol, which
  catches an error spread over every element just inside its own bound. An explicit atol makes the rule
  purely elementwise (numpy.allclose's), so a stated TOLERANCE=dict(rtol=..., atol=...) means that and
  nothing more.
rtol defaults by dtype (TOLERANCES; the less precise of out and ref, or `dtype=`), atol to rtol x RMS(ref),
so elements far smaller than the output's typical magnitude are judged on that scale, not their own.
A Python float carries no record of the precision it was computed in (`x.sum().item()` of a float32
tensor is one), so it is held to float32's tolerance; pass dtype="float64" or rtol= to hold it tighter.
Integer and bool outputs compare exactly (within an atol you pass: |out - ref| <= atol; an rtol is not applied to
them), and so does a float output against an integer or bool reference (past 2**53 too, where float64 would round the
integer). datetime64 and timedelta64 compare exactly, as counts of the finer
of the two units; NaT is their NaN. An object array of whole numbers compares exactly; of other numbers, as floats
held to a Python float's tolerance.
Quantized torch tensors (qint8, quint8, ...) are compared by their dequantized values, at the rtol and atol
you pass: they have no default tolerance, since their scale, not their dtype, sets their error.
A list or tuple of plain numbers (Python's or NumPy scalars, nested lists of equal length too) is compared as one
array, each number held to the rule it would meet alone (its own magnitude sets its atol), in one pass.
NumPy masked arrays (numpy.ma): the masks must match exactly (a plain array is one with nothing masked), and
only the unmasked elements are compared -- what a masked element holds, NaN included, is never looked at.
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Callable, Iterable

import numpy as np

from gpuspeed.errors import UserError, require_flag
from gpuspeed.trees import number_grid, record_fields

# rtol by dtype name. fp64 leaves room for reordered sums; fp32 for reordered sums in single precision;
# tf32 is a compute mode, not a dtype: pass dtype="tf32" (or rtol=3e-4) for float32 matmuls on tensor
# cores; fp16 and bf16 are about twice their unit roundoff (2^-11, 2^-8); fp8 likewise.
TOLERANCES: dict[str, float] = {
    "float64": 1e-12,
    "complex128": 1e-12,
    # np.longdouble (x86's 80-bit extended, named float128; float96 on 32-bit): a reference more precise
    # than float64 -- compared in float64, so held to float64's tolerance
    "float128": 1e-12,
    "float96": 1e-12,
    "complex256": 1e-12,
    "complex192": 1e-12,
    "float32": 1e-5,
    "complex64": 1e-5,
    "tf32": 3e-4,
    "float16": 1e-3,
    "complex32": 1e-3,  # torch's complex half: two float16
    "bfloat16": 1e-2,
    "float8_e4m3fn": 1.25e-1,
    "float8_e4m3fnuz": 1.25e-1,
    "float8_e5m2": 2.5e-1,
    "float8_e5m2fnuz": 2.5e-1,
}
EXACT = 0.0  # integers and bools
# A Python scalar does not say what precision made it; float32's is the common case on a GPU.
PYTHON_SCALARS = {"python float": "float32", "python complex": "complex64"}
# the short names the rest of gpuspeed uses (--dtype fp32|bf16|fp16, roofline units) read as their dtype
SHORT_NAMES = {"fp64": "float64", "fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def default_rtol(dtype_name: str) -> float:
    """rtol for a dtype name ('float32', 'torch.bfloat16', 'int64', 'python float', ...); 0 for exact kinds."""
    if type(dtype_name) is str and dtype_name in TOLERANCES:  # the common case, twice a leaf: no renaming to do
        return TOLERANCES[dtype_name]
    if isinstance(dtype_name, type) or type(dtype_name).__module__.startswith("numpy"):
        try:  # np.float32 (a type), np.dtype("float32"): NumPy's own name for it
            dtype_name = np.dtype(dtype_name).name
        except TypeError:
            pass
    name = str(dtype_name).replace("torch.", "").replace("jnp.", "")
    name = PYTHON_SCALARS.get(name, name)
    name = SHORT_NAMES.get(name, name)
    if name in TOLERANCES:
        return TOLERANCES[name]
    if name.startswith(("int", "uint", "bool")):
        return EXACT
    try:  # a NumPy dtype string: '>f8', a big-endian float64 read from a file, is a float64
        numpy_name = np.dtype(name).name
    except (TypeError, ValueError, SyntaxError):
        numpy_name = name
    if numpy_name != name and (numpy_name in TOLERANCES or numpy_name.startswith(("int", "uint", "bool"))):
        return default_rtol(numpy_name)
    if name.startswith(("qint", "quint")):  # torch.quantize_per_tensor's: an error set by the scale, not the type
        raise UserError(f"no default tolerance for the quantized dtype {dtype_name!r}: check() compares its "
                        "dequantized values, whose error its scale sets; pass rtol= and atol= (e.g. atol=the scale)")
    raise UserError(f"no default tolerance for dtype {dtype_name!r}; pass rtol= and atol=")


# ---------------------------------------------------------------------------------------------------
# Conversion to host float64
# ---------------------------------------------------------------------------------------------------


_DTYPE_NAMES: dict[np.dtype, str] = {}


def _dtype_name(dtype: np.dtype) -> str:
    """str(dtype), remembered for the numeric dtypes: str() of a dtype took ~2.5 us, twice a leaf."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = str(dtype)
        if dtype.kind in "biufc" and len(_DTYPE_NAMES) < 256:
            _DTYPE_NAMES[dtype] = name
    return name


def _to_host(x) -> tuple[np.ndarray, str]:
    """(NumPy array on the host, original dtype name) for any supported array or scalar."""
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        import torch

        name = str(x.dtype).replace("torch.", "")
        t = x.detach() if x.requires_grad else x  # each step is skipped where it does nothing: ~1 us apiece
        if not t.is_cpu:
            if t.device.type == "meta":
                raise UserError("check() cannot compare a meta tensor: it holds no data")
            t = t.cpu()  # before any conversion: a float32 copy of a bf16 tensor on a full GPU ran out of memory there
        if t.layout != torch.strided:  # sparse (torch.sparse.mm's result): its values, densely
            t = t.to_dense()
        if t.is_quantized:  # qint8 & co.: the real values it stands for (float32, exactly)
            t = t.dequantize()
        if t.is_floating_point() and t.element_size() <= 2 or str(t.dtype).startswith("torch.float8"):
            t = t.float()  # numpy has no bfloat16 or fp8; float32 holds them exactly
        if name == "complex32":
            t = t.to(torch.complex64)  # numpy has no complex32; complex64 holds it exactly
        # a lazily conjugated or negated view (x.conj(), x.conj().imag) is made real before NumPy sees it
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        try:
            return t.numpy(), name
        except TypeError:  # a dtype NumPy has no counterpart for (torch.bits8, ...): "Got unsupported ScalarType"
            raise UserError(f"check() cannot compare torch.{name} tensors: NumPy has no such dtype; compare "
                            "a view of their bytes (t.view(torch.uint8)) or their values in a dtype it has") from None
    if mod == "cupy":
        return x.get(), str(x.dtype)
    if mod in ("jax", "jaxlib"):
        name = str(x.dtype)
        arr = np.asarray(x.astype("float32") if name in ("bfloat16",) or name.startswith("float8") else x)
        return arr, name
    if isinstance(x, (np.ndarray, np.generic)):  # before float: np.float64 is a float subclass
        return np.asarray(x), _dtype_name(x.dtype)
    if isinstance(x, bool):
        return np.asarray(x), "bool"
    if isinstance(x, int):
        if not -2**63 <= x < 2**63:  # past int64: compared exactly as Python integers
            return np.asarray(x, dtype=object), "int (arbitrary precision)"
        return np.asarray(x, dtype=np.int64), "int64"
    if isinstance(x, float):
        return np.asarray(x, dtype=np.float64), "python float"
    if isinstance(x, complex):
        return np.asarray(x, dtype=np.complex128), "python complex"
    if callable(x):  # check(out, np.sum): the reference function where its result belongs
        raise UserError(f"check() compares results, got a function ({getattr(x, '__name__', type(x).__name__)}): pass "
                        "its result, or call both with gpuspeed.verify.verify_function(fn, reference, make_inputs)")
    if isinstance(x, Iterator):  # a function that yields its result: what it yields is read once, then gone
        raise UserError(f"check() cannot compare a {type(x).__name__}: it gives its items once, as it is read; pass "
                        "list(...) of it (and of the reference's)")
    kind = type(x).__name__
    if not isinstance(x, (str, bytes, bytearray)) and _numeric_buffer(x):  # array.array, memoryview
        kind = f"{type(x).__module__}.{kind}" if type(x).__module__ != "builtins" else kind
        raise UserError(f"check() cannot compare {kind} values: pass np.asarray(...) of it (and of the reference)")
    raise UserError(f"check() cannot compare {kind} values")


def _numeric_buffer(x) -> bool:
    """Whether x exposes a buffer of numbers NumPy reads as an array (array.array, a memoryview of one)."""
    try:
        return np.asarray(memoryview(x)).dtype.kind in "biufc"
    except (TypeError, ValueError, NotImplementedError):
        return False


# ---------------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------------


@dataclass
class LeafCheck:
    path: str
    passed: bool
    shape: tuple | None = None
    ref_shape: tuple | None = None
    dtype: str | None = None
    ref_dtype: str | None = None
    rtol: float = 0.0
    atol: float = 0.0
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    rel_l2_err: float = 0.0
    nan_count: int = 0
    inf_count: int = 0
    n_over_tol: int = 0
    n_elements: int = 0
    worst_index: tuple | None = None
    message: str = ""


@dataclass
class CheckResult:
    passed: bool
    summary: str
    leaves: list[LeafCheck] = field(default_factory=list)

    # Headline numbers: the worst over all leaves.
    @property
    def max_abs_err(self) -> float:
        return max((lf.max_abs_err for lf in self.leaves), default=0.0)

    @property
    def max_rel_err(self) -> float:
        return max((lf.max_rel_err for lf in self.leaves), default=0.0)

    @property
    def rel_l2_err(self) -> float:
        return max((lf.rel_l2_err for lf in self.leaves), default=0.0)

    @property
    def nan_count(self) -> int:
        return sum(lf.nan_count for lf in self.leaves)

    @property
    def inf_count(self) -> int:
        return sum(lf.inf_count for lf in self.leaves)

    @property
    def n_over_tol(self) -> int:
        return sum(lf.n_over_tol for lf in self.leaves)

    @property
    def worst_index(self):
        bad = [lf for lf in self.leaves if not lf.passed] or self.leaves
        return bad[0].worst_index if bad else None

    def __bool__(self) -> bool:
        return self.passed

    def to_dict(self) -> dict:
        return {"passed": self.passed, "summary": self.summary, "max_abs_err": self.max_abs_err,
                "max_rel_err": self.max_rel_err, "rel_l2_err": self.rel_l2_err, "nan_count": self.nan_count,
                "inf_count": self.inf_count, "n_over_tol": self.n_over_tol,
                "leaves": [asdict(lf) for lf in self.leaves]}


# ---------------------------------------------------------------------------------------------------
# check()
# ---------------------------------------------------------------------------------------------------


def _is_record(x) -> bool:
    """A dataclass instance (not the class itself)."""
    return is_dataclass(x) and not isinstance(x, type)


def _pairs(out, ref, path="out"):
    """Walk two nested structures together, yielding (path, out_leaf, ref_leaf) or a structure error."""
    if isinstance(ref, dict) or isinstance(out, dict):
        if not (isinstance(ref, dict) and isinstance(out, dict)):
            yield path, None, None, f"structure differs: output {type(out).__name__}, reference {type(ref).__name__}"
            return
        if set(out) != set(ref):
            missing, extra = set(ref) - set(out), set(out) - set(ref)  # repr: key 1 and key '1' read apart
            parts = ([f"missing {', '.join(sorted(map(repr, missing)))}"] if missing else []) + (
                [f"unexpected {', '.join(sorted(map(repr, extra)))}"] if extra else [])
            yield path, None, None, "keys differ: " + "; ".join(parts)
            return
        for k in ref:
            yield from _pairs(out[k], ref[k], f"{path}[{k!r}]")
    elif isinstance(ref, (list, tuple)) or isinstance(out, (list, tuple)):
        if not (isinstance(ref, (list, tuple)) and isinstance(out, (list, tuple))):
            hint = ""
            if hasattr(out, "shape") or hasattr(ref, "shape"):  # a list-returning version of an array function
                hint = ": a list is compared with a list, an array with an array (np.asarray(...) the list)"
            yield path, None, None, (f"structure differs: output {type(out).__name__}, reference "
                                     f"{type(ref).__name__}{hint}")
            return
        if hasattr(out, "_fields") and hasattr(ref, "_fields"):  # two namedtuples: by field name, as dataclasses
            names, ref_names = list(out._fields), list(ref._fields)
            if sorted(names) != sorted(ref_names):
                yield path, None, None, (f"fields differ: {type(out).__name__}{tuple(names)} vs "
                                         f"{type(ref).__name__}{tuple(ref_names)}")
                return
            for name in ref_names:
                yield from _pairs(getattr(out, name), getattr(ref, name), f"{path}.{name}")
            return
        if len(out) != len(ref):
            yield path, None, None, f"length differs: output has {len(out)} items, reference {len(ref)}"
            return
        grids = number_grid(out), number_grid(ref)
        if None not in grids and grids[0][0] == grids[1][0]:  # numbers: one array, not a leaf a number
            yield path, _Numbers(*grids[0]), _Numbers(*grids[1]), None
            return
        for i, (o, r) in enumerate(zip(out, ref, strict=True)):
            yield from _pairs(o, r, f"{path}[{i}]")
    elif _is_record(ref) or _is_record(out):  # a dataclass instance: its fields, by name
        if not (_is_record(ref) and _is_record(out)):
            yield path, None, None, f"structure differs: output {type(out).__name__}, reference {type(ref).__name__}"
            return
        names, ref_names = record_fields(out), record_fields(ref)
        if names != ref_names:
            yield path, None, None, f"fields differ: {type(out).__name__}{tuple(names)} vs {type(ref).__name__}{tuple(ref_names)}"
            return
        for name in ref_names:
            yield from _pairs(getattr(out, name), getattr(ref, name), f"{path}.{name}")
    elif out is None or ref is None:  # a function that returned None where a value was expected, or the reverse
        if out is not ref:
            yield path, None, None, f"structure differs: output {type(out).__name__}, reference {type(ref).__name__}"
    else:
        yield path, out, ref, None


CHUNK = 1 << 16  # elements compared at a time: float64 temporaries of a whole leaf took ~86 bytes an element


def _chunks(n: int):
    """Slices that cover n elements, CHUNK at a time."""
    return (slice(i, min(i + CHUNK, n)) for i in range(0, n, CHUNK))


class _NormSum:
    """The Euclidean norm of non-negative values given a chunk at a time, each scaled by the largest so far: squaring
    values past ~1e154 would overflow to inf (and below ~1e-162 underflow to 0), which made the tolerance infinite."""

    def __init__(self):
        self.scale, self.sum_sq = 0.0, 0.0  # the norm is scale * sqrt(sum_sq)

    def add(self, x: np.ndarray, top: float | None = None) -> None:
        if top is None:  # a caller that took x.max() already passes it
            top = float(x.max()) if x.size else 0.0  # the method: np.max's wrapper cost more than the work
        if math.isnan(top) or math.isnan(self.scale):  # a NaN makes the norm NaN, then an inf makes it inf
            self.scale = math.nan
            return
        if top == math.inf or self.scale == math.inf:
            self.scale = math.inf
            return
        if top == 0:
            return
        if top > self.scale:
            self.sum_sq *= (self.scale / top) ** 2
            self.scale = top
        self.sum_sq += float(((x / self.scale) ** 2).sum())

    def value(self) -> float:
        return self.scale * math.sqrt(self.sum_sq) if 0 < self.scale < math.inf else self.scale


class _Tally:
    """What check() reports of a leaf, gathered a chunk at a time: the elements over tolerance, the largest absolute and
    relative errors, the worst element (the first of those furthest past their bound) and the norm of the differences."""

    def __init__(self, exact: bool, atol: float, rtol: float):
        self.exact, self.atol, self.rtol = exact, atol, rtol
        self.n_bad, self.max_abs, self.max_rel = 0, 0.0, 0.0
        self.worst, self.worst_score = 0, None
        self.diff_norm, self.ref_norm = _NormSum(), _NormSum()
        self.all_finite = True

    def add(self, start: int, diff: np.ndarray, bad: np.ndarray, ref_abs: np.ndarray) -> None:
        self.n_bad += int(bad.sum())
        fin = np.isfinite(diff)
        self.all_finite = self.all_finite and bool(fin.all())
        self.diff_norm.add(diff if self.exact else np.where(fin, diff, 0.0))
        if self.exact:
            self.ref_norm.add(ref_abs)
        if not diff.size:
            return
        finite_diff = np.where(fin, diff, np.inf)
        self.max_abs = max(self.max_abs, float(np.max(finite_diff)))
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(ref_abs > 0, finite_diff / np.where(ref_abs > 0, ref_abs, 1),
                           np.where(finite_diff > 0, np.inf, 0))
        self.max_rel = max(self.max_rel, float(np.max(rel)))
        # how far past its bound: an integer off by 1000 is worse than one off by 1 (every mismatch scored inf named
        # the first of them); a bad element always scores > 0, a NaN's score is read as inf below
        with np.errstate(invalid="ignore"):  # an infinite tolerance: inf - inf
            score = finite_diff - (self.atol + self.rtol * ref_abs)
        score = np.where(np.isnan(score), np.inf, score)
        i = int(np.argmax(score))
        if self.worst_score is None or score[i] > self.worst_score:
            self.worst, self.worst_score = start + i, float(score[i])


def _object_numbers(arr: np.ndarray, name: str, which: str, path: str) -> tuple[np.ndarray, str]:
    """An object array as numbers, and its dtype name: whole numbers (Python ints past int64) stay objects,
    compared exactly; any other numbers become float64 (complex128) and are held to a Python float's
    tolerance (an object array of floats was held to exactness, rtol 0); anything else (the lists of a ragged
    array, None, text) is a one-line error, not a TypeError from subtracting them."""
    if arr.dtype.kind != "O":
        return arr, name
    values = arr.reshape(-1).tolist()
    if all(isinstance(v, numbers.Integral) for v in values):
        return arr, name
    odd = [v for v in values if not isinstance(v, numbers.Number)][:1]
    if not odd:
        cplx = any(not isinstance(v, numbers.Real) for v in values)
        try:
            return arr.astype(np.complex128 if cplx else np.float64), "python complex" if cplx else "python float"
        except (TypeError, ValueError, OverflowError):
            odd = [v for v in values if not isinstance(v, numbers.Integral)][:1]
    raise UserError(f"check() compares numbers: the {which} at {path} is an object array holding "
                    f"{type(odd[0]).__name__} {_short(odd[0])}; compare arrays of numbers (a ragged list of lists "
                    "as nested lists, not np.array(..., dtype=object))")


def _short(x) -> str:
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."


def _integer_distance(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| of two integer arrays, exactly: int64's own difference wraps past 2**63 (2**62 - -2**62 read as
    -2**63, under any atol, so the two passed as equal); taken in uint64, high minus low, it is the true distance."""
    if got.dtype == object or want.dtype == object:
        return np.abs(got - want)  # Python integers: exact, whatever the size
    high, low = np.maximum(got, want), np.minimum(got, want)
    return high.view(np.uint64) - low.view(np.uint64)  # modulo 2**64, which the distance (< 2**64) never reaches


def _exact_integer_diff(got: np.ndarray, ref: np.ndarray, diff: np.ndarray) -> np.ndarray:
    """`diff` (|got - float64(ref)|) made exact where an integer reference is past 2**53: float64 rounds such an
    integer, so a float output that is that rounding read as equal to it (2.0**62 against 2**62 + 1). Python
    compares a float with an int exactly; where they differ yet read equal, the difference is taken in ints."""
    with np.errstate(invalid="ignore"):
        far = np.abs(ref.astype(np.float64)) >= 2.0**53
    if not far.any():
        return diff
    idx = np.flatnonzero(far & (diff.reshape(far.shape) == 0))
    if not idx.size:
        return diff
    diff = np.array(diff, dtype=np.float64)  # a 0-d result of np.where is an array too
    flat_got, flat_ref, flat_diff = got.reshape(-1), ref.reshape(-1), diff.reshape(-1)
    for i in idx:
        o, r = float(flat_got[i]), flat_ref[i]
        # o is finite (diff 0) and, past 2**53, a whole number: int(o) is exact
        if isinstance(r, numbers.Integral) and o != int(r):
            flat_diff[i] = float(abs(int(o) - int(r)))
    return diff


def _elements(x) -> int:
    """How many elements an array or scalar holds, without copying it anywhere."""
    count = getattr(x, "numel", None)  # torch
    if callable(count):
        return int(count())
    size = getattr(x, "size", None)  # NumPy, CuPy, JAX
    return int(size) if isinstance(size, (int, np.integer)) else 1


def _host_bytes(x) -> tuple[int, int]:
    """(bytes of host copies check() keeps of x while it compares, a chunk at a time; bytes more it holds only while
    making them). None for a NumPy array or a torch CPU tensor that NumPy reads in place; a torch tensor's copies are
    counted step by step as _to_host makes them (a bf16 CUDA tensor: its bf16 copy, then the float32 one, 6 bytes an
    element at once); and a strided array (transposed, sliced, broadcast) adds one more of the last, flattened."""
    contiguous = getattr(x, "is_contiguous", None)  # torch
    flags = getattr(x, "flags", None)  # NumPy, CuPy
    strided = (not contiguous() if callable(contiguous) else
               not getattr(flags, "c_contiguous", True) if flags is not None and not isinstance(flags, int) else False)
    if type(x).__module__.split(".")[0] == "torch":
        steps = _torch_host_steps(x)
        itemsize = steps[-1] if steps else x.element_size()
        held = max((a + b for a, b in zip(steps, steps[1:], strict=False)), default=0)  # a copy lives till the next
        kept = steps[-1] if steps else 0
        return _elements(x) * (kept + (itemsize if strided else 0)), _elements(x) * max(0, held - kept)
    itemsize = _host_itemsize(x)
    return _elements(x) * ((0 if _read_in_place(x) else itemsize) + (itemsize if strided else 0)), 0


def _torch_host_steps(t) -> list[int]:
    """Bytes an element of each host copy _to_host makes of a torch tensor, in order (none: NumPy reads it in place)."""
    import torch

    size, steps = t.element_size(), []
    if t.device.type != "cpu":
        steps.append(size)
    if t.layout != torch.strided:
        steps.append(size)
    if t.is_quantized or t.is_floating_point() and size <= 2 or str(t.dtype).startswith("torch.float8"):
        steps.append(4)  # float32
    elif t.dtype == torch.complex32:
        steps.append(8)  # complex64
    if t.is_conj() or t.is_neg():
        steps.append(steps[-1] if steps else size)
    return steps


def _host_itemsize(x) -> int:
    element_size = getattr(x, "element_size", None)  # torch
    itemsize = element_size() if callable(element_size) else getattr(getattr(x, "dtype", None), "itemsize", 8)
    return max(4, int(itemsize))


def _read_in_place(x) -> bool:
    """Whether _to_host hands NumPy x's own memory (no copy): a plain NumPy array."""
    return type(x) is np.ndarray


def _check_fits_host(path: str, out, ref) -> None:
    """A one-line UserError where the host copies of a leaf's output and reference cannot fit in the host's free
    memory (the float64 work runs a chunk at a time, on top of them): it took every byte and the OOM killer ended the
    process without a word (or NumPy raised a bare MemoryError)."""
    if _elements(out) <= CHUNK and _elements(ref) <= CHUNK:  # at most 16 bytes an element, a few copies: < 1 GiB
        return
    (out_kept, out_held), (ref_kept, ref_held) = _host_bytes(out), _host_bytes(ref)
    need = out_kept + ref_kept + max(out_held, ref_held)  # one side is converted at a time
    if need < 2**30:  # small: not worth reading /proc for
        return
    from gpuspeed.inputs import host_available_bytes

    free = host_available_bytes()
    if free is not None and need > free:
        n = max(_elements(out), _elements(ref))
        raise UserError(f"check() compares on the host: {path} has {n:,} elements, ~{need / 2**30:.1f} GiB of host "
                        f"copies, {free / 2**30:.1f} GiB of host memory is free: compare it in slices "
                        "(check(out[i:j], ref[i:j]))")


def _uint64(dtype: np.dtype) -> bool:
    """A uint64 in either byte order ('>u8' is not np.uint64's dtype): past int64, so compared as Python ints."""
    return dtype.kind == "u" and dtype.itemsize == 8


def _compare_chunked(leaf: LeafCheck, out_flat: np.ndarray, ref_flat: np.ndarray, exact: bool, rtol: float, atol,
                     equal_nan: bool, nat) -> tuple[_Tally, _NormSum | None, int]:
    """(the tally, the reference's norm (None for exact kinds), NaN in the reference) of two flat arrays, a chunk at a
    time; sets leaf's rtol, atol and NaN and Inf counts."""
    if exact:
        big = {out_flat.dtype.kind, ref_flat.dtype.kind} & {"O"} or _uint64(out_flat.dtype) or _uint64(ref_flat.dtype)
        wide = object if big else np.int64  # object: exact, whatever the size
        # an atol passed is honoured (a uint8 image off by a level); an rtol is not: relative room on a count or an
        # index lets a large one drift
        leaf.rtol, leaf.atol = 0.0, float(atol) if atol is not None else 0.0
        ref_norm = None
    else:
        cplx = out_flat.dtype.kind == "c" or ref_flat.dtype.kind == "c"
        wide = np.complex128 if cplx else np.float64
        ref_norm = _NormSum()  # ||ref|| over its finite elements: the default atol's scale and rel L2's denominator
        for part in _chunks(ref_flat.size):
            want = ref_flat[part].astype(wide)
            ref_norm.add(np.abs(np.where(np.isfinite(want), want, 0)))
        if atol is None:
            rms = ref_norm.value() / math.sqrt(ref_flat.size) if ref_flat.size else 0.0
            atol = rtol * rms if rms else 0.0  # rtol x RMS(ref); no scale, no room (rtol=inf x 0 was NaN: 0 failed 0)
        leaf.rtol, leaf.atol = float(rtol), float(atol)
    tally = _Tally(exact, leaf.atol, leaf.rtol)
    ref_nan = 0
    for part in _chunks(out_flat.size):
        got, want = out_flat[part].astype(wide), ref_flat[part].astype(wide)
        if exact:
            diff = np.asarray(_integer_distance(got, want), dtype=np.float64)
            bad = ~(diff <= leaf.atol)
            ref_abs = np.abs(np.asarray(want, dtype=np.float64))  # in float: abs(int64 min) is itself, negative
        else:
            leaf.nan_count += int(np.isnan(got).sum())
            leaf.inf_count += int(np.isinf(got).sum())
            finite_ref = np.isfinite(want)
            ref_nan += int(np.isnan(want).sum())
            ref_abs = np.abs(np.where(finite_ref, want, 0))
            with np.errstate(invalid="ignore"):
                diff = np.abs(got - want)
            same_special = (got == want) & ~finite_ref  # matching +-inf
            if equal_nan:
                same_special |= np.isnan(got) & np.isnan(want)
            diff = np.where(same_special, 0.0, diff)
            if not cplx and ref_flat.dtype.kind in "iuO":
                diff = _exact_integer_diff(got, ref_flat[part], diff)
            # NaN compares False, so NaN is always bad; an Inf or NaN where the reference is finite is bad whatever the
            # tolerance (an infinite atol would otherwise take it), and so is anything but the same Inf where the
            # reference holds one (-inf for +inf, or a finite value, passed an infinite atol: inf <= inf)
            with np.errstate(invalid="ignore"):  # an infinite rtol x a zero |ref|: no relative room there, not NaN
                tol = leaf.atol + np.where(ref_abs > 0, leaf.rtol * ref_abs, 0.0)
            bad = ~(diff <= tol) | (~np.isfinite(got) & finite_ref) | (~finite_ref & ~same_special)
        if nat is not None:  # NaT is the NaN of times: it never matches, unless equal_nan=True and both hold it
            either = nat[0].reshape(-1)[part] | nat[1].reshape(-1)[part]
            matched = nat[0].reshape(-1)[part] & nat[1].reshape(-1)[part] & bool(equal_nan)
            bad = (bad & ~either) | (either & ~matched)
            diff = np.where(either, np.where(matched, 0.0, np.inf), diff)
        tally.add(part.start, diff, bad, ref_abs)
    if nat is not None:
        leaf.nan_count, ref_nan = int(nat[0].sum()), int(nat[1].sum())
    return tally, ref_norm, ref_nan


SMALL_LEAF = CHUNK  # leaves up to this many elements are compared in one pass (_compare_in_one_pass)


def _compare_in_one_pass(leaf: LeafCheck, out_flat: np.ndarray, ref_flat: np.ndarray, exact: bool, rtol: float, atol,
                         equal_nan: bool, nat) -> tuple[_Tally, _NormSum | None, int]:
    """_compare_chunked's result, bit for bit, for a leaf of one chunk in about a third of its NumPy calls (~40 calls of
    ~1 us each made a 100-element leaf cost ~90 us): each shortcut is taken only where it gives the same numbers."""
    if exact:
        got, want = out_flat.astype(np.int64), ref_flat.astype(np.int64)
        leaf.rtol, leaf.atol = 0.0, float(atol) if atol is not None else 0.0
        tally = _Tally(True, leaf.atol, leaf.rtol)
        if not (got == want).all():  # equal: a fresh tally is already right (nothing off, worst at 0, rel L2 0)
            diff = np.asarray(_integer_distance(got, want), dtype=np.float64)
            tally.add(0, diff, ~(diff <= leaf.atol), np.abs(want.astype(np.float64)))
        return tally, None, 0
    wide = np.complex128 if "c" in (out_flat.dtype.kind, ref_flat.dtype.kind) else np.float64
    got = out_flat if out_flat.dtype == wide else out_flat.astype(wide)
    want = ref_flat if ref_flat.dtype == wide else ref_flat.astype(wide)
    ref_abs = np.abs(want)
    ref_top = float(ref_abs.max())
    diff = np.abs(got - want)
    if wide is np.float64 and ref_flat.dtype.kind in "iu":
        diff = _exact_integer_diff(got, ref_flat, diff)
    diff_top, ref_nan = float(diff.max()), 0
    # both maxima finite: no NaN or Inf in the reference, nor in the output (it would make diff's), and no
    # difference past float64 -- every special case of the chunked path is then a no-op
    all_finite = math.isfinite(ref_top) and math.isfinite(diff_top)
    if not all_finite:
        finite_got, finite_ref = np.isfinite(got), np.isfinite(want)
        leaf.nan_count, leaf.inf_count = int(np.count_nonzero(np.isnan(got))), int(np.count_nonzero(np.isinf(got)))
        ref_nan = int(np.count_nonzero(np.isnan(want)))
        ref_abs = np.abs(np.where(finite_ref, want, 0))
        ref_top = float(ref_abs.max())
        same_special = (got == want) & ~finite_ref  # matching +-inf
        if equal_nan:
            same_special |= np.isnan(got) & np.isnan(want)
        diff = np.where(same_special, 0.0, diff)
    ref_norm = _NormSum()
    ref_norm.add(ref_abs, ref_top)
    if atol is None:
        rms = ref_norm.value() / math.sqrt(ref_flat.size)
        atol = rtol * rms if rms else 0.0
    leaf.rtol, leaf.atol = float(rtol), float(atol)
    tally = _Tally(False, leaf.atol, leaf.rtol)
    tol = leaf.atol + leaf.rtol * ref_abs  # _Tally.add's own; the verdict's differs only in the sign of a zero
    if not math.isfinite(leaf.rtol):  # inf x a zero |ref| is NaN: no relative room there
        tol_verdict = leaf.atol + np.where(ref_abs > 0, leaf.rtol * ref_abs, 0.0)
    else:
        tol_verdict = tol
    if all_finite:  # neither diff nor tol can hold a NaN: > is "not <="
        bad = diff > tol_verdict
        finite_diff = diff
        tally.diff_norm.add(diff, diff_top)
    else:
        bad = ~(diff <= tol_verdict) | (~finite_got & finite_ref) | (~finite_ref & ~same_special)
        fin = np.isfinite(diff)
        tally.all_finite = bool(fin.all())
        tally.diff_norm.add(np.where(fin, diff, 0.0))
        finite_diff = np.where(fin, diff, np.inf)
        diff_top = float(finite_diff.max())
    tally.n_bad = int(np.count_nonzero(bad))
    tally.max_abs = max(tally.max_abs, diff_top)
    rel = finite_diff / ref_abs  # the chunked path's where a |ref| is 0 too, but for 0 / 0 (NaN there, 0 there)
    top_rel = float(rel.max())
    if math.isnan(top_rel):
        rel = np.where(ref_abs > 0, finite_diff / np.where(ref_abs > 0, ref_abs, 1),
                       np.where(finite_diff > 0, np.inf, 0))
        top_rel = float(rel.max())
    tally.max_rel = max(tally.max_rel, top_rel)
    score = finite_diff - tol
    worst = int(score.argmax())
    if math.isnan(score[worst]):  # argmax stops at the first NaN; _Tally.add reads a NaN score as inf
        score = np.where(np.isnan(score), np.inf, score)
        worst = int(score.argmax())
    tally.worst, tally.worst_score = worst, float(score[worst])
    return tally, ref_norm, ref_nan


def _uncompared(leaf: LeafCheck, message: str) -> LeafCheck:
    """A failed leaf whose values could not be compared (structure, shape, mask): its errors are unknown, so infinite,
    not 0 -- check(np.ones(3), np.ones(4)).rel_l2_err read 0.0, and `rel_l2_err < 1e-6` passed it."""
    leaf.message, leaf.max_abs_err, leaf.max_rel_err, leaf.rel_l2_err = message, math.inf, math.inf, math.inf
    return leaf


# where integers fail a check given rtol=: its value was dropped (they compare exactly), which read as check() losing it
UNUSED_RTOL = "rtol= is not applied to integers and bools, which compare exactly: pass atol= for room"


def _check_leaf(path, out, ref, rtol, atol, equal_nan, dtype) -> LeafCheck:
    _check_fits_host(path, out, ref)
    rtol_given = rtol is not None and rtol > 0
    out_host, out_dtype = _to_host(out)
    ref_host, ref_dtype_name = _to_host(ref)
    for arr, which in ((out_host, "output"), (ref_host, "reference")):
        if arr.dtype.kind not in "biufcOmM":  # strings, bytes, records: no numeric difference to take
            raise UserError(f"check() compares numbers: the {which} at {path} is an array of {arr.dtype}")
    out_host, out_dtype = _object_numbers(out_host, out_dtype, "output", path)
    ref_host, ref_dtype_name = _object_numbers(ref_host, ref_dtype_name, "reference", path)
    leaf = LeafCheck(path=path, passed=False, shape=tuple(out_host.shape), ref_shape=tuple(ref_host.shape),
                     dtype=out_dtype, ref_dtype=ref_dtype_name, n_elements=int(out_host.size))
    if out_host.shape != ref_host.shape:
        return _uncompared(leaf, f"shape {tuple(out_host.shape)} != reference {tuple(ref_host.shape)}")
    shape, kept = out_host.shape, None  # kept: the flat positions compared, where a mask leaves some out
    if isinstance(out, np.ma.MaskedArray) or isinstance(ref, np.ma.MaskedArray):
        out_mask, ref_mask = np.ma.getmaskarray(out), np.ma.getmaskarray(ref)
        if not np.array_equal(out_mask, ref_mask):
            apart = out_mask != ref_mask
            first = tuple(int(i) for i in np.unravel_index(int(np.argmax(apart)), shape)) if apart.ndim else ()
            return _uncompared(leaf, f"masks differ: {int(apart.sum())}/{apart.size} elements masked in one and not "
                                     f"the other (first at {first}; output masked there: {bool(out_mask[first])})")
        kept = np.flatnonzero(~ref_mask)
        out_host, ref_host = out_host.reshape(-1)[kept], ref_host.reshape(-1)[kept]  # the unmasked values alone
        leaf.n_elements = int(kept.size)
    nat = None  # datetime64 / timedelta64: (NaT in the output, NaT in the reference)
    if {out_host.dtype.kind, ref_host.dtype.kind} & {"m", "M"}:
        if out_host.dtype.kind != ref_host.dtype.kind:
            return _uncompared(leaf, f"dtype {out_dtype} vs reference {ref_dtype_name}: a datetime64 compares only "
                                     "with a datetime64, a timedelta64 with a timedelta64 (convert both to the same kind)")
        # the same instants counted in ns and in s compare equal: both in the finer unit, then as integer counts,
        # exactly (as floats, 1e-12 of ~1.8e18 ns since 1970 let 1.8 ms through)
        common = np.promote_types(out_host.dtype, ref_host.dtype)
        out_host, ref_host = out_host.astype(common), ref_host.astype(common)
        nat = np.isnat(out_host), np.isnat(ref_host)
        out_host, ref_host = out_host.view(np.int64), ref_host.view(np.int64)
    notes = [] if out_dtype == ref_dtype_name else [f"dtype {out_dtype} vs reference {ref_dtype_name}"]
    exact = out_host.dtype.kind in "biuO" and ref_host.dtype.kind in "biuO"  # O: Python ints past int64
    l2_rule = atol is None  # an explicit atol makes the rule purely elementwise
    # an integer or bool reference (a count, an index, a mask) is matched exactly, even by a float output
    exact_ref = exact or ref_host.dtype.kind in "biuO" and out_host.dtype.kind == "f"
    if rtol is None:
        rtol = default_rtol(dtype) if dtype else (
            EXACT if exact_ref else max(default_rtol(out_dtype) if out_host.dtype.kind in "fc" else 0.0,
                                    default_rtol(ref_dtype_name) if ref_host.dtype.kind in "fc" else 0.0) or 1e-12)
    out_flat, ref_flat = out_host.reshape(-1), ref_host.reshape(-1)
    one_pass = 0 < out_flat.size <= SMALL_LEAF and nat is None and "O" not in (out_flat.dtype.kind, ref_flat.dtype.kind) and (
        not exact or not (_uint64(out_flat.dtype) or _uint64(ref_flat.dtype)))  # those compare as Python ints
    compare = _compare_in_one_pass if one_pass else _compare_chunked
    with np.errstate(all="ignore"):  # an overflow to inf (1e308 - -1e308) is judged, not warned about
        tally, ref_norm, ref_nan = compare(leaf, out_flat, ref_flat, exact, rtol, atol, equal_nan, nat)
    leaf.n_over_tol = tally.n_bad
    if exact:
        num, den = tally.diff_norm.value(), tally.ref_norm.value()
        leaf.rel_l2_err = num / den if den > 0 else (0.0 if num == 0 else math.inf)  # reported; exactness decides
    else:
        num, den = tally.diff_norm.value(), ref_norm.value()
        leaf.rel_l2_err = (num / den if den > 0 else (0.0 if num == 0 else math.inf)) if tally.all_finite else math.inf
    if out_flat.size:
        leaf.max_abs_err, leaf.max_rel_err = tally.max_abs, tally.max_rel
        worst = tally.worst
        if kept is not None:  # a position among the unmasked values: where it sits in the array
            worst = int(kept[worst])
        leaf.worst_index = ((worst,) if len(shape) == 1 else
                            tuple(int(i) for i in np.unravel_index(worst, shape)) if len(shape) else ())
    l2_ok = exact or not l2_rule or leaf.rel_l2_err <= rtol or leaf.rel_l2_err == 0.0
    ok = leaf.n_over_tol == 0 and l2_ok
    leaf.passed = bool(ok)
    if not ok:
        where = f" worst at {leaf.worst_index}" if leaf.worst_index is not None else ""
        # an element just past atol alone (rtol=0) read 'max abs 1e-05' beside 'atol 1e-05': digits enough to differ
        abs_text, atol_text = _apart(leaf.max_abs_err, leaf.atol) if leaf.n_over_tol else (
            f"{leaf.max_abs_err:.3g}", f"{leaf.atol:.3g}")
        parts = [f"{leaf.n_over_tol}/{leaf.n_elements} over tolerance (atol {atol_text}, rtol {leaf.rtol:.3g})"]
        if leaf.nan_count or leaf.inf_count:
            parts.append(f"{leaf.nan_count} NaN, {leaf.inf_count} Inf")
        err_text, rtol_text = _apart(leaf.rel_l2_err, leaf.rtol) if not l2_ok else (f"{leaf.rel_l2_err:.3g}", "")
        l2 = f"rel L2 {err_text}" + ("" if l2_ok else f" > rtol {rtol_text}")
        parts.append(f"max abs {abs_text}, {l2}{where}")
        if ref_nan and not equal_nan:  # else the failure reads as the output's fault alone
            parts.append(f"the reference holds {ref_nan} NaN, which never match (equal_nan=True matches NaN with NaN)")
        if not exact and l2_rule and leaf.atol == 0 and ref_host.size and not np.any(ref_host):
            parts.append("the reference is all zero, so it sets no scale: pass atol=")
        if exact and rtol_given:
            parts.append(UNUSED_RTOL)
        notes.insert(0, "; ".join(parts))
    leaf.message = "; ".join(notes)
    return leaf


def _apart(larger: float, smaller: float) -> tuple[str, str]:
    """Two numbers with the digits that show them apart (at least 3): 1.0013e-05 over rtol 1e-05 read '1e-05 > rtol
    1e-05'. Where no digits do (equal, or not finite), 3."""
    for digits in range(3, 18):
        a, b = f"{larger:.{digits}g}", f"{smaller:.{digits}g}"
        if a != b:
            return a, b
    return f"{larger:.3g}", f"{smaller:.3g}"


class _Numbers:
    """A list or tuple of plain numbers (nested equally), as trees.number_grid reads it: compared as one array."""

    def __init__(self, shape: tuple[int, ...], values: list):
        self.shape, self.values = shape, values


def _number_kind(kind: type) -> tuple[bool, bool, float, str]:
    """(integral, complex, its default rtol, its dtype name) of a number type as check() reads one number of it."""
    plain = {bool: "bool", int: "int64", float: "python float", complex: "python complex"}
    name = plain.get(kind) or np.dtype(kind).name
    integral, cplx = kind in (bool, int) or np.dtype(kind).kind in "biu", kind is complex or np.dtype(kind).kind == "c"
    return integral, cplx, 0.0 if integral else default_rtol(name), name


def _number_array(values: list, kinds: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(values as float64 or complex128, which were integers or bools, which complex, each one's default rtol), kinds
    being _number_kind of each type among them; number_grid lets through no integer float64 would round."""
    n = len(values)
    integral = np.fromiter((kinds[type(v)][0] for v in values), dtype=bool, count=n)
    is_complex = np.fromiter((kinds[type(v)][1] for v in values), dtype=bool, count=n)
    own_rtol = np.fromiter((kinds[type(v)][2] for v in values), dtype=np.float64, count=n)
    cplx = any(kind[1] for kind in kinds.values())
    return np.array(values, dtype=np.complex128 if cplx else np.float64), integral, is_complex, own_rtol


def _number_verdicts(out: tuple, ref: tuple, rtol, atol, equal_nan, dtype) -> tuple[np.ndarray, ...]:
    """(bad, |out - ref| with inf where not finite, relative error, each pair's rtol, which references are integers)
    for numbers as _number_array gives them: each pair judged as check() judges two numbers alone."""
    o, out_int, out_cplx, out_rtol = out
    r, ref_int, ref_cplx, ref_rtol = ref
    exact = out_int & ref_int
    exact_ref = exact | ref_int & ~out_int & ~out_cplx  # an integer reference is matched exactly, even by a float
    if rtol is not None or dtype is not None:
        side_rtol = np.full(r.shape, float(rtol) if rtol is not None else default_rtol(dtype))
    else:  # as for one number: the looser of the two numbers' dtype tolerances, none for an integer reference
        side_rtol = np.where(exact_ref, 0.0, np.maximum(out_rtol, ref_rtol))
    element_rtol = np.where(exact, 0.0, side_rtol)
    finite_ref = np.isfinite(r)
    ref_abs = np.abs(np.where(finite_ref, r, 0))
    with np.errstate(invalid="ignore", over="ignore"):
        if atol is None:  # rtol x RMS of one number: its own magnitude (none for an exact pair)
            element_atol = np.where(exact | (ref_abs == 0), 0.0, element_rtol * ref_abs)
        else:
            element_atol = np.full(r.shape, float(atol))
        diff = np.abs(o - r)
        same_special = (o == r) & ~finite_ref
        if equal_nan:
            same_special |= np.isnan(o) & np.isnan(r)
        diff = np.where(same_special, 0.0, diff)
        tol = element_atol + np.where(ref_abs > 0, element_rtol * ref_abs, 0.0)
        bad = ~(diff <= tol) | (~np.isfinite(o) & finite_ref) | (~finite_ref & ~same_special)
    finite_diff = np.where(np.isfinite(diff), diff, np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(ref_abs > 0, finite_diff / np.where(ref_abs > 0, ref_abs, 1), np.where(finite_diff > 0, np.inf, 0.0))
    if atol is None:  # each number's relative L2 error (its relative error) within its rtol, as for an array
        bad |= ~exact & ~((rel <= element_rtol) | (rel == 0))
    return bad, finite_diff, rel, element_rtol, exact_ref


def _check_numbers(path: str, out: _Numbers, ref: _Numbers, rtol, atol, equal_nan, dtype) -> LeafCheck:
    """The verdict a check of each pair of numbers on its own would give (each held to its own magnitude, an integer
    reference matched exactly), reached a chunk at a time over arrays: a leaf at a time took ~70 us a number."""
    out_kinds = {kind: _number_kind(kind) for kind in {type(v) for v in out.values}}
    ref_kinds = {kind: _number_kind(kind) for kind in {type(v) for v in ref.values}}
    out_name, ref_name = ({k[3] for k in kinds.values()} for kinds in (out_kinds, ref_kinds))
    out_name = out_name.pop() if len(out_name) == 1 else "mixed numbers"
    ref_name = ref_name.pop() if len(ref_name) == 1 else "mixed numbers"
    n = len(ref.values)
    leaf = LeafCheck(path=path, passed=False, shape=out.shape, ref_shape=ref.shape, dtype=out_name,
                     ref_dtype=ref_name, n_elements=n, atol=float(atol) if atol is not None else 0.0)
    first_bad, top_rel_at, ref_nan, integer_ref = None, 0, 0, False
    for part in _chunks(n):
        o, r = _number_array(out.values[part], out_kinds), _number_array(ref.values[part], ref_kinds)
        bad, finite_diff, rel, element_rtol, exact_ref = _number_verdicts(o, r, rtol, atol, equal_nan, dtype)
        if first_bad is None and bad.any():
            first_bad = part.start + int(np.argmax(bad))
        if rel.size and float(rel.max()) > leaf.max_rel_err or part.start == 0:
            top_rel_at = part.start + int(np.argmax(rel))
        leaf.n_over_tol += int(bad.sum())
        leaf.max_abs_err = max(leaf.max_abs_err, float(finite_diff.max()))
        leaf.max_rel_err = max(leaf.max_rel_err, float(rel.max()))
        leaf.rtol = max(leaf.rtol, float(element_rtol.max()))
        leaf.nan_count += int(np.isnan(o[0]).sum())
        leaf.inf_count += int(np.isinf(o[0]).sum())
        ref_nan += int(np.isnan(r[0]).sum())
        integer_ref = integer_ref or bool(exact_ref.any())
    leaf.rel_l2_err = leaf.max_rel_err  # each number's own: the worst of them, as over leaves of one number each
    leaf.passed = first_bad is None
    worst = first_bad if first_bad is not None else top_rel_at
    leaf.worst_index = tuple(int(i) for i in np.unravel_index(worst, out.shape))
    notes = [] if out_name == ref_name else [f"dtype {out_name} vs reference {ref_name}"]
    if not leaf.passed:
        where = path + "".join(f"[{i}]" for i in leaf.worst_index)
        rule = (f"|out - ref| <= atol {leaf.atol:.3g} + rtol {leaf.rtol:.3g} x |ref|" if atol is not None else
                f"each within rtol {leaf.rtol:.3g} of its own magnitude")
        if integer_ref and atol is None:
            rule += ", an integer reference matched exactly"
        integers_failed = any(kinds[0] for kinds in out_kinds.values()) and integer_ref
        parts = [f"{leaf.n_over_tol}/{n} numbers over tolerance ({rule}), first at {where}: "
                 f"{_short(out.values[worst])} vs reference {_short(ref.values[worst])}"]
        if leaf.nan_count or leaf.inf_count:
            parts.append(f"{leaf.nan_count} NaN, {leaf.inf_count} Inf")
        parts.append(f"max abs {leaf.max_abs_err:.3g}")
        if ref_nan and not equal_nan:
            parts.append(f"the reference holds {ref_nan} NaN, which never match (equal_nan=True matches NaN with NaN)")
        if integers_failed and rtol is not None and rtol > 0:
            parts.append(UNUSED_RTOL)
        notes.insert(0, "; ".join(parts))
    leaf.message = "; ".join(notes)
    return leaf


def check(out: Any, ref: Any, rtol: float | None = None, atol: float | None = None, *,
          dtype: str | None = None, equal_nan: bool = False) -> CheckResult:
    """Compare `out` against `ref` (arrays, scalars, or nested tuples/lists/dicts/dataclasses of them).

    NumPy masked arrays must be masked alike; only their unmasked elements are compared.

    rtol defaults by dtype (the less precise of out and ref; `dtype="tf32"` picks that row instead), atol to
    rtol x RMS(ref). With atol left to its default the relative L2 error must also be within rtol; an
    explicit atol makes the rule purely elementwise: |out - ref| <= atol + rtol * |ref| (module docstring).
    """
    tolerances = {"rtol": rtol, "atol": atol}
    for what, value in tolerances.items():
        if value is None:
            continue
        if isinstance(value, (str, bytes, bool)):  # '1e-3' >= 0 is a TypeError
            raise UserError(f"{what} must be a number >= 0, got {value!r}")
        try:  # one number: a 0-d tensor or array (torch.finfo(...).eps * 4 on a tensor) is one too
            tolerances[what] = value if isinstance(value, float) else float(value)
        except OverflowError:  # an int past any float: as good as infinite
            tolerances[what] = math.inf
        except (TypeError, ValueError, RuntimeError):  # a list, an array of several, a complex
            raise UserError(f"{what} must be one number >= 0, got {type(value).__name__} {value!r}") from None
    rtol, atol = tolerances["rtol"], tolerances["atol"]
    if rtol is not None and not rtol >= 0 or atol is not None and not atol >= 0:  # NaN too
        raise UserError(f"rtol and atol must be >= 0, got rtol={rtol}, atol={atol}")
    if dtype is not None and rtol is not None:
        raise UserError("check(): dtype= only picks a default rtol; pass dtype= or rtol=, not both")
    require_flag("check(): equal_nan", equal_nan)  # "no" matched NaN with NaN as True does: a failure passed
    if dtype is not None:
        default_rtol(dtype)  # an unknown name is a one-line error before any comparison
    if _returned_nothing(out) and _returned_nothing(ref):  # `assert check(f(x), ref(x))` passed two missing returns
        both = (f"are both {_short(ref)}" if repr(out) == repr(ref) else
                f"are {_short(out)} and {_short(ref)}")
        return CheckResult(False, f"FAIL: nothing compared: the output and the reference {both} (a missing `return` "
                           "in both?); for functions that write into their arguments, check those arguments "
                           "(verify_function does)")
    leaves: list[LeafCheck] = []
    for path, o, r, err in _pairs(out, ref):
        if err is not None:
            leaves.append(_uncompared(LeafCheck(path=path, passed=False), err))
        elif isinstance(o, _Numbers):
            leaves.append(_check_numbers(path, o, r, rtol, atol, equal_nan, dtype))
        else:
            leaves.append(_check_leaf(path, o, r, rtol, atol, equal_nan, dtype))
    failed = [lf for lf in leaves if not lf.passed]
    if not leaves:
        return CheckResult(True, "PASS: nothing to compare (empty structure)", leaves)
    if failed:
        lf = failed[0]
        more = f" (+{len(failed) - 1} more leaves failed)" if len(failed) > 1 else ""
        summary = f"FAIL {lf.path}: {lf.message}{more}"
    else:
        worst = max(leaves, key=lambda lf: lf.rel_l2_err)
        # an explicit atol makes the rule elementwise: the rel L2 error is then no bound, and "(rtol 1e-12)" beside a
        # rel L2 of 3e-05 read as a pass that broke its own rule
        rule = f"rtol {worst.rtol:g}" if atol is None else f"elementwise: atol {atol:g}, rtol {worst.rtol:g}"
        summary = (f"PASS: {sum(lf.n_elements for lf in leaves)} elements in {len(leaves)} array(s), "
                   f"max abs {max(lf.max_abs_err for lf in leaves):.3g}, rel L2 {worst.rel_l2_err:.3g} ({rule})")
    return CheckResult(passed=not failed, summary=summary, leaves=leaves)


# ---------------------------------------------------------------------------------------------------
# Poison and multi-seed verification
# ---------------------------------------------------------------------------------------------------


def poison_value(dtype_name: str):
    """NaN for floats, the dtype's max for integers (a value a real result rarely holds), True for bool."""
    name = str(dtype_name).replace("torch.", "")
    if name == "bool":
        return True
    if name.startswith(("int", "uint")):
        return int(np.iinfo(np.dtype(name)).max)
    return float("nan")


def poison(buf):
    """Fill an output buffer in place with NaN (floats) or a sentinel (ints) so unwritten elements show."""
    mod = type(buf).__module__.split(".")[0]
    if mod == "torch":
        import torch

        with torch.no_grad():  # an output buffer that requires grad (a Parameter) is still filled
            # a quantized buffer holds no NaN (NaN quantized to its top step, which count_poisoned read as
            # written): a value past its range saturates every element to its top integer, the sentinel
            buf.fill_(math.inf if buf.is_quantized else poison_value(str(buf.dtype)))
    elif mod == "numpy" and hasattr(buf, "flags") and not buf.flags.writeable:
        raise UserError("poison() needs a writable array: this NumPy array is read-only (a broadcast view?)")
    elif mod in ("numpy", "cupy") and hasattr(buf, "fill"):
        buf.fill(poison_value(str(buf.dtype)))
    else:
        raise UserError(f"poison() needs a mutable torch, NumPy or CuPy array, got {type(buf).__name__}")
    return buf


def count_poisoned(buf) -> int:
    """How many elements still hold the poison value (unwritten by the kernel)."""
    if type(buf).__module__.split(".")[0] == "torch" and buf.is_quantized:  # its integers: poison() saturates them
        raw = buf.detach().int_repr().cpu().numpy()
        return int((raw == np.iinfo(raw.dtype).max).sum())
    arr, name = _to_host(buf)
    value = poison_value(name)
    if isinstance(value, float):
        return int(np.isnan(arr).sum())
    return int((arr == value).sum())


def _returned_nothing(x) -> bool:
    """None, or a tuple or list of only Nones (an in-place function's (None, None)); an empty container is a result."""
    return x is None or isinstance(x, (tuple, list)) and len(x) > 0 and all(_returned_nothing(v) for v in x)


def _argument_arrays(args: tuple, ref_args: tuple) -> tuple[dict, dict]:
    """The arrays among fn's and the reference's arguments (leaf by leaf, by position), as two dicts to check."""
    from gpuspeed import trees

    mine, theirs = trees.flatten(args)[0], trees.flatten(ref_args)[0]
    keep = [i for i, x in enumerate(mine) if hasattr(x, "shape") and hasattr(x, "dtype")]
    # an argument one function grew (an array appended to a list) pairs with nothing: check() says so, by key
    return ({f"argument leaf {i}": mine[i] for i in keep},
            {f"argument leaf {i}": theirs[i] for i in keep if i < len(theirs)})


def verify_function(fn: Callable, reference: Callable, make_inputs: Callable[[int], tuple], *,
                    seeds: Iterable[int] | int = 3, rtol: float | None = None, atol: float | None = None,
                    dtype: str | None = None) -> list[CheckResult]:
    """Check fn against reference on fresh inputs from each seed (default: 3 random seeds).

    make_inputs(seed) returns the argument tuple; the reference sees its own copy of the inputs. When both
    return nothing to compare (None: functions that write their result into an argument), the arguments are
    compared after the calls, fn's against the reference's copy.
    """
    import numbers

    from gpuspeed.timing import clone_tree

    if isinstance(seeds, bool):
        raise UserError(f"seeds is a count or a list of seeds, got {seeds!r}")
    if isinstance(seeds, numbers.Integral):  # np.int64(3) too
        seeds = [random.randrange(2**31) for _ in range(int(seeds))]
    try:
        seeds = list(seeds)
    except TypeError:
        raise UserError(f"seeds is a count or a list of seeds, got {seeds!r}") from None
    if not seeds:  # all() of no results is True: a check that ran nothing would read as passed
        raise UserError("verify_function() needs at least one seed (default: 3 random seeds)")
    odd = [s for s in seeds if isinstance(s, bool) or not isinstance(s, numbers.Integral)][:1]
    if odd:  # seeds="abc" made make_inputs('a'): a TypeError from deep inside the user's generator of inputs
        raise UserError(f"seeds is a count or a list of integer seeds, got the seed {odd[0]!r}")
    if not callable(make_inputs):  # the inputs themselves, passed where their maker goes
        raise UserError(f"make_inputs is a function of a seed that returns the argument tuple, got "
                        f"{type(make_inputs).__name__}")
    from gpuspeed.trees import one_pass_argument

    results = []
    for seed in seeds:
        args = make_inputs(seed)
        args = args if isinstance(args, tuple) else (args,)
        if (why := one_pass_argument(args, {})) is not None:  # the reference would use it up, fn then see it empty
            raise UserError(f"make_inputs({seed}) returned arguments fn and the reference cannot both read: {why}; "
                            "return a tuple of the arguments, lists in place of iterators")
        ref_args = clone_tree(args)
        try:
            expected = reference(*ref_args)
        except TypeError as exc:
            if len(args) == 1 and isinstance(args[0], (dict, list)) and "argument" in str(exc):
                # gpuspeed.inputs.make_inputs returns {name: array}: passed whole, it is one positional argument
                kind, whole = ("dict", "tuple(d.values())") if isinstance(args[0], dict) else ("list", "tuple(args)")
                raise UserError(f"make_inputs returned a {kind}, passed whole as the only argument, and the reference "
                                f"raised TypeError: {exc}: return the arguments as a tuple ({whole})") from exc
            raise
        output = fn(*args)
        result = check(output, expected, rtol=rtol, atol=atol, dtype=dtype)
        # both returned None: an in-place pair passed on nothing ("nothing to compare"); two empty lists (a search
        # that found nothing) are results, and equal
        if not result.leaves and _returned_nothing(output) and _returned_nothing(expected):
            written, expected_written = _argument_arrays(args, ref_args)
            if not written:  # a PASS on nothing compared would read as a checked function
                raise UserError(f"{getattr(fn, '__name__', 'fn')} and the reference both returned {_short(expected)} "
                                "and no argument "
                                "is an array they could have written into: nothing to compare; return the result, "
                                "or pass the output buffer (a NumPy, torch or CuPy array) as an argument")
            result = check(written, expected_written, rtol=rtol, atol=atol, dtype=dtype)
            result.summary += " (both returned nothing: their argument arrays compared after the calls)"
        result.summary = f"seed {seed}: {result.summary}"
        results.append(result)
    return results
