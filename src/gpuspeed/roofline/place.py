"""place(): put any function on the measured roofline.

Times `fn` with bench(), counts its FLOPs with torch's FlopCounterMode (matmul, conv, attention) unless
the caller gives them, and counts its bytes as the minimum traffic (every input tensor read once, every
output written once) unless overridden. The roof at its intensity comes from a Ceilings object: the best
device-memory bandwidth and the compute ceiling of its unit (bf16, tf32, fp32, ...).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from gpuspeed import trees
from gpuspeed.errors import UserError
from gpuspeed.roofline import model
from gpuspeed.roofline.ceilings import Ceilings
from gpuspeed.timing import bench


def _tensors(obj) -> list:
    return [x for x in trees.leaves(obj) if trees.module_of(x) == "torch" and hasattr(x, "untyped_storage")]


def min_bytes(args: Any, out: Any) -> int:
    """Minimum traffic: each distinct input tensor read once plus each output tensor written once."""
    seen, total = set(), 0
    for t in _tensors(args):
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total + sum(t.numel() * t.element_size() for t in _tensors(out))


def count_flops(fn: Callable, *args, kwargs: dict | None = None) -> tuple[int, Any]:
    """(FLOPs counted by torch's FlopCounterMode, output) for one call of a torch function."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        out = fn(*args, **(kwargs or {}))
    return int(counter.get_total_flops()), out


def default_unit(args: Any, counted: bool) -> str:
    """The compute ceiling a function is held to: tensor-core unit for counted (matmul-like) torch ops on
    16-bit or TF32 data, else the CUDA-core unit of its dtype (fp32, or fp64)."""
    import torch

    dts = {t.dtype for t in _tensors(args) if t.is_floating_point()}
    if torch.float64 in dts:
        return "fp64"
    if not counted:
        return "fp32"
    for dt, unit in ((torch.float8_e4m3fn, "fp8"), (torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        if dt in dts:
            return unit
    return "tf32" if torch.get_float32_matmul_precision() != "highest" else "fp32"


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
ABOVE_ROOF = {"memory": "above roof: cache-resident data (the working set sat in cache, faster than device memory)",
              "compute": "above roof: faster than the measured compute ceiling (measured in a slower clock state)"}


def locate(name: str, flops: float, nbytes: int, time_s: float, ceilings: Ceilings, unit: str) -> dict:
    """The roofline numbers of one measured point (shared by place() and the tests)."""
    if not 0 <= flops < math.inf:  # NaN too; 0 is a copy's (no flops: it sits on the memory roof)
        raise UserError(f"{name}: flops must be finite and >= 0, got {flops}")
    for what, v in (("bytes", nbytes), ("time", time_s)):
        if not 0 < v < math.inf:
            raise UserError(f"{name}: {what} must be positive and finite, got {v}")
    ai = model.intensity(flops, nbytes)
    cname, peak_T = ceilings.compute_TFLOPs(unit)
    bw = ceilings.mem_roof_GBps()
    d = {"name": name, "flops": flops, "bytes": nbytes, "ai": ai, "time_s": time_s,
         "TFLOPs": flops / time_s / 1e12, "GBps": nbytes / time_s / 1e9, "unit": unit,
         "compute_ceiling": cname, "roof_TFLOPs": None, "pct_of_roof": None, "bound": None,
         "pct_of_mem_roof": None}
    if peak_T and bw and ai > 0:
        r = model.roof(ai, peak_T * 1e12, bw * 1e9)
        d |= {"roof_TFLOPs": r / 1e12, "pct_of_roof": 100 * d["TFLOPs"] * 1e12 / r,
              "bound": model.bound(ai, peak_T * 1e12, bw * 1e9), "pct_of_mem_roof": 100 * d["GBps"] / bw}
    d["above_roof"] = d["pct_of_roof"] is not None and d["pct_of_roof"] > 100
    return d


def place(fn: Callable, *args, flops: float | None = None, bytes: int | None = None,  # noqa: A002
          ceilings: Ceilings | None = None, name: str | None = None, unit: str | None = None,
          kwargs: dict | None = None, **bench_kwargs) -> Placement:
    """Time `fn(*args)` and place it on the roofline of `ceilings` (measured quickly when not given).

    flops: FLOPs per call (default: counted by FlopCounterMode; elementwise ops count zero there, so give
    them). bytes: bytes per call (default: the minimum traffic). unit: the compute ceiling (default from
    the dtypes, see default_unit). bench_kwargs go to gpuspeed.timing.bench.
    """
    kwargs = kwargs or {}
    name = name or trees.callable_name(fn)
    source = "given"
    if flops is None:
        flops, out = count_flops(fn, *args, kwargs=kwargs)
        source = "counted by FlopCounterMode"
        if flops == 0:
            raise UserError(f"{name}: FlopCounterMode counted no FLOPs (it counts matmul, conv and attention "
                            "only); pass flops=")
    else:
        out = fn(*args, **kwargs)
    if not 0 < flops < math.inf:  # NaN too
        raise UserError(f"{name}: flops must be positive and finite, got {flops}")
    if bytes is not None and not 0 < bytes < math.inf:
        raise UserError(f"{name}: bytes must be positive and finite, got {bytes}")
    nbytes = min_bytes((args, kwargs), out) if bytes is None else int(bytes)
    if nbytes <= 0:
        raise UserError(f"{name}: no tensor bytes found; pass bytes=")
    unit = unit or default_unit((args, kwargs), source != "given")
    if ceilings is None:
        ceilings = cached_ceilings()
    m = bench(fn, *args, kwargs=kwargs, name=name, **bench_kwargs)
    d = locate(name, float(flops), nbytes, m.median, ceilings, unit)
    notes = list(m.notes) + ([ABOVE_ROOF[d["bound"]]] if d["above_roof"] else [])
    return Placement(**d, flops_source=source, rel_noise=m.rel_noise, samples=m.n, throttled=m.throttled,
                     notes=notes)


_cache: dict = {}


def cached_ceilings(device: str = "auto") -> Ceilings:
    """Quick ceilings for this device, measured once per process."""
    from gpuspeed.roofline.ceilings import ceilings

    if device not in _cache:
        _cache[device] = ceilings(device, quick=True)
    return _cache[device]
