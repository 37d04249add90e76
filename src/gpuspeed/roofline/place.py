"""place(): put any function on the measured roofline.

Times `fn` with bench(), counts its FLOPs with torch's FlopCounterMode (matmul, conv, attention) unless
the caller gives them, and counts its bytes as the minimum traffic (every input tensor read once, every
output, and every input it writes in place, written once) unless overridden. The roof at its intensity comes
from a Ceilings object: the best device-memory bandwidth and the compute ceiling of its unit (bf16, tf32, fp32, ...).
"""

from __future__ import annotations

import math
import numbers
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from gpuspeed import device as _device
from gpuspeed import trees
from gpuspeed.errors import UserError
from gpuspeed.roofline import model
from gpuspeed.roofline.ceilings import Ceilings
from gpuspeed.timing import bench, check_options


def _extent(x) -> tuple | None:
    """(memory space, lowest address, one past the highest, bytes of its elements) of a torch, NumPy or
    CUDA-array-interface array (CuPy, Numba); None for anything else or an empty array."""
    try:
        mod = trees.module_of(x)
        if mod == "torch" and hasattr(x, "untyped_storage"):
            if not x.numel():
                return None
            size = x.element_size()
            span = sum((n - 1) * abs(st) for n, st in zip(x.shape, x.stride(), strict=True)) * size + size
            low = x.data_ptr() - sum((n - 1) * -st for n, st in zip(x.shape, x.stride(), strict=True) if st < 0) * size
            return str(x.device), low, low + span, x.numel() * size
        if mod == "numpy" and isinstance(x, np.ndarray):
            if not x.size:
                return None
            low, high = getattr(np.lib, "array_utils", np).byte_bounds(x)
            return "cpu", low, high, x.nbytes
        cai = getattr(x, "__cuda_array_interface__", None)
        if cai:
            shape, item = tuple(cai["shape"]), np.dtype(cai["typestr"]).itemsize
            n = math.prod(shape)
            if not n:
                return None
            strides = cai.get("strides") or tuple(item * math.prod(shape[i + 1:]) for i in range(len(shape)))
            ptr = cai["data"][0]
            low = ptr + sum((k - 1) * st for k, st in zip(shape, strides, strict=True) if st < 0)
            span = sum((k - 1) * abs(st) for k, st in zip(shape, strides, strict=True)) + item
            return "cuda", low, low + span, n * item
    except (RuntimeError, TypeError, ValueError, AttributeError):  # sparse, meta, fake: no address
        return None
    return None


def _distinct_bytes(obj) -> int:
    """Bytes of the arrays in obj with memory shared between views counted once: overlapping address ranges
    merge, and each merged range counts at most the bytes of its views' elements (a strided view that
    touches every 100th element is not charged the whole range)."""
    return _merged_bytes([e for e in map(_extent, trees.leaves(obj)) if e is not None])


def _merged_bytes(extents) -> int:
    """_distinct_bytes of arrays' _extent()s."""
    spans = sorted(extents)
    total, cur = 0, None
    for space, low, high, nbytes in spans:
        if cur and cur[0] == space and low < cur[2]:
            cur = [space, cur[1], max(cur[2], high), cur[3] + nbytes]
            continue
        if cur:
            total += min(cur[2] - cur[1], cur[3])
        cur = [space, low, high, nbytes]
    if cur:
        total += min(cur[2] - cur[1], cur[3])
    return total


def min_bytes(args: Any, out: Any) -> int:
    """Minimum traffic: the memory of the input arrays read once (views of the same memory counted once)
    plus the output arrays written once. Torch, NumPy and CUDA-array-interface arrays (CuPy, Numba)."""
    return _distinct_bytes(args) + _distinct_bytes(out)


def _fingerprint(x) -> tuple | None:
    """What changes when an array is written: a torch tensor's version counter (every in-place op bumps it), a
    writeable NumPy array's CRC of its bytes; None for anything else (CuPy, an inference tensor: not followed)."""
    try:
        if trees.module_of(x) == "torch" and hasattr(x, "_version"):
            return ("torch", x._version)
        if isinstance(x, np.ndarray) and x.flags.writeable and not x.dtype.hasobject and x.size:
            return ("numpy", zlib.crc32(np.ascontiguousarray(x).reshape(-1).view(np.uint8)))  # any dtype's bytes
    except (RuntimeError, TypeError, ValueError):  # no version counter (inference mode), no buffer
        return None
    return None


def written_inputs(args: Any, call: Callable[[], Any]) -> tuple[Any, list]:
    """(call(), the arrays of args it wrote in place): a function returning None that scales its input in place
    moved the input's bytes twice, read and written, where its output alone showed only the read."""
    arrays = list(trees.leaves(args))
    before = [_fingerprint(x) for x in arrays]
    out = call()
    return out, [x for x, was in zip(arrays, before, strict=True) if was is not None and _fingerprint(x) != was]


# the writes seen are whole arrays, not which elements or whether they were read first: bytes= says what the call did
IN_PLACE_NOTE = ("bytes: inputs the call wrote in place are counted read and written (x += y); bytes= states them "
                 "for an out= buffer it only writes, or one it writes in part")


def count_flops(fn: Callable, *args, kwargs: dict | None = None) -> tuple[int, Any]:
    """(FLOPs counted by torch's FlopCounterMode, output) for one call of a torch function."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        out = fn(*args, **(kwargs or {}))
    return int(counter.get_total_flops()), out


def default_unit(args: Any, counted: bool) -> str:
    """The compute ceiling a function is held to: tensor-core unit for matmul-like torch ops (those
    FlopCounterMode counts: matmul, conv, attention) on 16-bit or TF32 data, else the CUDA-core unit of its
    dtype (fp32, or fp64 for float64 or complex128 torch or NumPy arrays)."""
    import torch

    dts = _dtypes(args)
    if "float64" in dts or "complex128" in dts:  # a complex128 matmul runs fp64 arithmetic
        return "fp64"
    if not counted:
        return "fp32"
    for dt, unit in (("float8_e4m3fn", "fp8"), ("bfloat16", "bf16"), ("float16", "fp16")):
        if dt in dts:
            return unit
    return "tf32" if torch.get_float32_matmul_precision() != "highest" else "fp32"


def _dtypes(args: Any) -> set[str]:
    """The dtype names of the torch and NumPy arrays in args ('float32', 'complex128', ...)."""
    return {str(x.dtype).removeprefix("torch.") for x in trees.leaves(args)
            if trees.module_of(x) in ("torch", "numpy") and hasattr(x, "dtype")}


# FlopCounterMode counts a complex matmul's multiply-adds as real ones, 2 FLOPs each: one is 8 real FLOPs
COMPLEX_FLOPS = 4


UNITS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")  # the compute ceilings ceilings() measures
_UNIT_ALIASES = {"float64": "fp64", "double": "fp64", "float32": "fp32", "float": "fp32", "bfloat16": "bf16",
                 "float16": "fp16", "half": "fp16", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}


def unit_name(unit: str) -> str:
    """A compute unit as ceilings name it ('fp32', 'bf16', ...); dtype names ('bfloat16', torch.float16) read
    as their unit. Anything else is refused: compute_TFLOPs would hold it to fp32's ceiling without a word."""
    key = str(unit).strip().lower().removeprefix("torch.")
    key = _UNIT_ALIASES.get(key, key)
    if key not in UNITS:
        raise UserError(f"unknown compute unit {unit!r}: use {', '.join(UNITS)}")
    return key


@dataclass
class Placement:
    name: str
    flops: float
    bytes: int
    ai: float  # FLOP/byte
    time_s: float
    TFLOPs: float  # achieved
    GBps: float  # achieved
    unit: str  # the compute ceiling it is held to
    compute_ceiling: str
    roof_TFLOPs: float | None  # the roof at its intensity
    pct_of_roof: float | None
    bound: str | None  # "memory" or "compute"
    pct_of_mem_roof: float | None = None  # achieved GB/s over the device-memory roof
    above_roof: bool = False  # faster than the roof: see ABOVE_ROOF
    flops_source: str = "counted"
    rel_noise: float = math.nan
    samples: int = 0
    throttled: bool = False
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


# Why a point can sit above the roof, by its bound: the roof is what device memory or the compute ceiling
# delivers, and a point beats it only when that is not what limited it.
IMPLAUSIBLE_OVER_ROOF = 50  # times its roof: past any cache's bandwidth over memory's (a GPU's L1 ~8x, a CPU's L2 ~10x)
ABOVE_ROOF = {"memory": "above roof: cache-resident data (the working set sat in cache, faster than device memory)",
              "compute": "above roof: faster than the measured compute ceiling (measured in a slower clock state)",
              # mm fp32 256 at 915 % of a busy 2-core host's fp32 ceiling: BLAS threads had waited ms for the cores
              "cpu compute": "above roof: faster than the measured compute ceiling (this shared CPU's ceilings were "
                             "measured while other work used its cores, or in a slower clock state)",
              # a CPU's placement of a working set far past its last-level cache (sum over 128 MiB) was seen at
              # 157 % of a shared CI host's read ceiling: the ceilings were measured while neighbours used the bus
              "cpu memory": "above roof: faster than the measured memory ceiling (the working set sat in cache, or "
                            "this shared CPU's ceilings were measured while other work used its memory bus)",
              # a view or a no-op (x.t(), lambda x: None) was placed at ~60000 % of the roof as "cache-resident"
              "implausible": f"far above roof (over {IMPLAUSIBLE_OVER_ROOF}x): no cache or clock is that fast, so the "
                             "call moved fewer bytes or did fewer FLOPs than counted (it returned a view, did nothing, "
                             "or its work runs lazily or ran earlier): pass bytes= and flops= as one call moves them"}


def above_roof_note(bound: str, device_kind: str, pct_of_roof: float | None = None) -> str:
    """Why a point of this bound beats its roof on this kind of device (ABOVE_ROOF's entry); far above it, that its
    flops or bytes were not what the call did."""
    if pct_of_roof is not None and pct_of_roof > 100 * IMPLAUSIBLE_OVER_ROOF:
        return ABOVE_ROOF["implausible"]
    return ABOVE_ROOF.get(f"{device_kind} {bound}", ABOVE_ROOF[bound])


MAX_OVER_ROOF = 1e4  # a point this many times above its roof was given flops or bytes no device moves


def _real(v) -> float:
    """v as a float; inf where it is too large for one (10**400 raised OverflowError)."""
    try:
        return float(v)
    except OverflowError:
        return math.inf


def locate(name: str, flops: float, nbytes: int, time_s: float, ceilings: Ceilings, unit: str) -> dict:
    """The roofline numbers of one measured point (shared by place() and the tests)."""
    if not 0 <= _real(flops) < math.inf:  # NaN too; 0 is a copy's (no flops: it sits on the memory roof)
        raise UserError(f"{name}: flops must be finite and >= 0, got {flops}")
    for what, v in (("bytes", nbytes), ("time", time_s)):
        if not 0 < _real(v) < math.inf:
            raise UserError(f"{name}: {what} must be positive and finite, got {v}")
    unit = unit_name(unit)
    ai = model.intensity(flops, nbytes)
    cname, peak_T = ceilings.compute_TFLOPs(unit)
    bw = ceilings.mem_roof_GBps()
    d = {"name": name, "flops": flops, "bytes": nbytes, "ai": ai, "time_s": time_s,
         "TFLOPs": flops / time_s / 1e12, "GBps": nbytes / time_s / 1e9, "unit": unit,
         "compute_ceiling": cname, "roof_TFLOPs": None, "pct_of_roof": None, "bound": None,
         "pct_of_mem_roof": None}
    # no cache or clock beats a roof by this much: flops=1e300 was placed at 1e294 % of it, as 'above roof'
    if peak_T and d["TFLOPs"] > MAX_OVER_ROOF * peak_T:
        raise UserError(f"{name}: flops={flops:.3g} per call in {time_s:.3g} s is {d['TFLOPs']:.3g} TFLOP/s, "
                        f"{d['TFLOPs'] / peak_T:.3g} times this device's {cname} ceiling: flops= is the FLOPs "
                        "of one call")
    if bw and d["GBps"] > MAX_OVER_ROOF * bw:
        raise UserError(f"{name}: bytes={nbytes:.3g} per call in {time_s:.3g} s is {d['GBps']:.3g} GB/s, "
                        f"{d['GBps'] / bw:.3g} times this device's memory roof: bytes= is the bytes one call "
                        "reads and writes")
    if peak_T and bw and ai > 0:
        r = model.roof(ai, peak_T * 1e12, bw * 1e9)
        d |= {"roof_TFLOPs": r / 1e12, "pct_of_roof": 100 * d["TFLOPs"] * 1e12 / r,
              "bound": model.bound(ai, peak_T * 1e12, bw * 1e9), "pct_of_mem_roof": 100 * d["GBps"] / bw}
    elif bw and flops == 0:  # a copy: its roof is the memory roof (0 FLOP/s at AI 0), its % the bandwidth's
        d |= {"roof_TFLOPs": 0.0, "pct_of_roof": 100 * d["GBps"] / bw, "bound": "memory",
              "pct_of_mem_roof": 100 * d["GBps"] / bw}
    d["above_roof"] = d["pct_of_roof"] is not None and d["pct_of_roof"] > 100
    return d


def place(fn: Callable, *args, flops: float | None = None, bytes: int | None = None,  # noqa: A002
          ceilings: Ceilings | None = None, name: str | None = None, unit: str | None = None,
          kwargs: dict | None = None, **bench_kwargs) -> Placement:
    """Time `fn(*args)` and place it on the roofline of `ceilings` (measured quickly when not given: the
    CPU's for a call on host data alone, unless bench_kwargs say device=).

    flops: FLOPs per call (default: counted by FlopCounterMode; elementwise ops count zero there, so give
    them; 0 places a copy on the memory roof). bytes: whole bytes per call (default: the minimum traffic, an input the
    call writes in place counted as written too). unit: the
    compute ceiling (default from the dtypes, see default_unit). bench_kwargs go to gpuspeed.timing.bench.
    """
    if not callable(fn):
        raise UserError(f"place() needs a callable, got {type(fn).__name__}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise UserError(f"kwargs= takes a dict of keyword arguments for fn, got {type(kwargs).__name__}")
    if ceilings is not None and not isinstance(ceilings, Ceilings):
        raise UserError(f"ceilings= takes a Ceilings (gpuspeed.roofline.ceilings(), or "
                        f"gpuspeed.roofline.study.ceilings_from_results(doc) for a results file), "
                        f"got {type(ceilings).__name__}")
    kwargs = kwargs or {}
    name = name or trees.callable_name(fn)
    if not isinstance(name, str):
        raise UserError(f"name is the point's label, a string, got {type(name).__name__} {name!r}")
    check_options("place()", bench_kwargs)  # before the call is counted and the ceilings measured, not after
    # counted even when given: FLOPs that FlopCounterMode sees are matmul-like, held to the tensor-core unit
    (counted, out), written = written_inputs((args, kwargs), lambda: count_flops(fn, *args, kwargs=kwargs))
    source = "given"
    if flops is None:
        flops, source = counted, "counted by FlopCounterMode"
        if flops == 0:
            raise UserError(f"{name}: FlopCounterMode counted no FLOPs (it counts torch's matmul, conv and "
                            "attention ops only, not NumPy's or elementwise ones); pass flops= (0 for a copy)")
        if any(dt.startswith("complex") for dt in _dtypes((args, kwargs))):  # a complex mm read at 1/4 its FLOPs
            flops *= COMPLEX_FLOPS
            source += (f", x{COMPLEX_FLOPS} for complex data (it counts a complex multiply-add as 2 FLOPs, it is 8 real "
                       "ones; pass flops= where the counted ops are not all on complex data)")
    flops, bytes = _one_number(flops), _one_number(bytes)  # noqa: A001  (a count summed on a tensor is one too)
    # 0 is a copy's: no FLOPs, placed on the memory roof (locate)
    if isinstance(flops, bool) or not isinstance(flops, numbers.Real) or not 0 <= _real(flops) < math.inf:  # NaN too
        raise UserError(f"{name}: flops must be finite and >= 0 (FLOPs per call), got {_shown(flops)}")
    # a fractional count (1.5) would be int()ed to another number of bytes: a count of whole bytes, or refused
    if bytes is not None and (isinstance(bytes, bool) or not isinstance(bytes, numbers.Real)
                              or not 1 <= _real(bytes) < math.inf or not float(bytes).is_integer()):
        raise UserError(f"{name}: bytes must be a finite byte count >= 1, a whole number of bytes per call, "
                        f"got {_shown(bytes)}")
    nbytes = min_bytes((args, kwargs), (out, written)) if bytes is None else int(bytes)  # overlaps count once
    if nbytes <= 0:
        raise UserError(f"{name}: no tensor bytes found; pass bytes=")
    in_place = IN_PLACE_NOTE if bytes is None and nbytes > min_bytes((args, kwargs), out) else None
    unit = unit_name(unit) if unit is not None else default_unit((args, kwargs), counted > 0)
    host_note = None
    given = ceilings is not None
    if ceilings is None:  # the ceilings of the device the call is timed on (device="cpu" on a GPU machine too)
        where = bench_kwargs.get("device", "auto")
        if where == "auto" and not trees.has_gpu_data((args, kwargs, out)):
            where = "cpu"  # host data in and out (NumPy, CPU tensors): bench times it on the host, the CPU's roof
            if _device.cuda_available():  # a GPU kernel launched on host arrays would be judged against the CPU
                host_note = ("host data in and out: placed on the CPU's roofline (device='cuda' places GPU work "
                             "launched on host arrays on the GPU's)")
        ceilings = cached_ceilings(where)
    m = bench(fn, *args, kwargs=kwargs, name=name, **bench_kwargs)
    d = locate(name, float(flops), nbytes, m.median, ceilings, unit)
    above = [above_roof_note(d["bound"], ceilings.device_kind, d["pct_of_roof"])] if d["above_roof"] else []
    elsewhere = _elsewhere_note(ceilings, m) if given else None  # ceilings measured here need no word
    # an fp16 matmul on the CPU (no fp16 ceiling there) was held to fp32's roof without a word
    stand_in = (f"no {d['unit']} compute ceiling was measured on {ceilings.device_name}: held to "
                f"{d['compute_ceiling']}'s (unit= picks another)") if d["compute_ceiling"] != d["unit"] else None
    notes = list(m.notes) + above + [n for n in (in_place, host_note, elsewhere, stand_in) if n]
    return Placement(**d, flops_source=source, rel_noise=m.rel_noise, samples=m.n, throttled=m.throttled,
                     notes=notes)


def _one_number(v):
    """A 0-d array or tensor (`(x != 0).sum() * 2`) as the number it holds; anything else as it is."""
    if not isinstance(v, numbers.Number) and getattr(v, "shape", None) == () and callable(getattr(v, "item", None)):
        return v.item()
    return v


def _shown(v) -> str:
    """v for a message: a 400-digit int as its size, anything long cut to 40 characters."""
    if isinstance(v, numbers.Integral) and not isinstance(v, bool) and abs(int(v)) >= 10**16:
        return f"{float(v):.3g}" if _real(v) < math.inf else f"an int of {len(str(abs(int(v))))} digits"
    text = repr(v)
    return text if len(text) <= 40 else f"{text[:37]}... ({type(v).__name__})"


def _elsewhere_note(ceilings: Ceilings, m) -> str | None:
    """A note where the ceilings given were measured on another device than the one `m` was timed on (a saved
    roofline of another GPU, or of the CPU): the % of roof is then of that device's roof, not this one's."""
    from gpuspeed.results import measured_elsewhere

    here = _device.DeviceInfo(kind="cpu" if m.mode == "cpu" and not m.device_sync else "cuda", name=m.device)
    theirs = measured_elsewhere({"kind": ceilings.device_kind, "name": ceilings.device_name}, here)
    if theirs is None:
        return None
    return (f"roof measured on {theirs}, not this {here.name}: its % of roof is of that device's roof (place it on "
            "this device's ceilings: leave ceilings= out, or pass gpuspeed.roofline.ceilings())")


_cache: dict = {}


def cached_ceilings(device: str = "auto") -> Ceilings:
    """Quick ceilings for this device, measured once per process and device: keyed by the device the call resolves
    to ('auto' and 'cpu' on a machine without a GPU are one), and for a GPU by the current CUDA device's index, so a
    process that moves to another GPU with torch.cuda.set_device is not placed on the first one's roof."""
    from gpuspeed.roofline.ceilings import ceilings

    kind = _device.resolve_device(device)
    key = (kind, _torch_current_device() if kind == "cuda" else None)
    if key not in _cache:
        _cache[key] = ceilings(kind, quick=True)
    return _cache[key]


def _torch_current_device() -> int:
    import torch

    return torch.cuda.current_device()
