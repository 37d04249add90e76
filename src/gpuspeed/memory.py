"""peak_memory(), budgets, cap() and the chunk planner.

The peak of one call comes from three sources, because each sees something the others miss:
the torch caching allocator (its peak in use), CuPy's memory pool (its peak in use, tracked by a memory
hook) and NVML's used memory of the GPU being measured, sampled in a background thread (everything:
JAX, Numba, library workspaces, allocator rounding, but also other processes). The report takes the
larger of the frameworks' sum and NVML's increase, and says which won. On the CPU it is the host peak.
A budget fits when the peak stays under the budget less a 15 % headroom.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import re
import sys
import threading
import time
import tracemalloc
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Callable

from gpuspeed import device as _device
from gpuspeed import trees
from gpuspeed.errors import UserError
from gpuspeed.sharing import ShareWatch, memory_note, others_growth
from gpuspeed.torch_host import PROFILER_EVENT_BYTES, TorchHostAllocs

HEADROOM = 0.15  # fragmentation, the CUDA context, library workspaces: keep 15 % of a budget free
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 2**10, "m": 2**20, "g": 2**30}


SMALLEST_BARE = 2**20  # a bare number below 1 MiB is read as a unit left out (fits(8.5) meant GiB)


def format_bytes(n: float | None) -> str:
    """1536 -> '1.50 KiB', 8.5 * 2**30 -> '8.50 GiB': three significant figures in binary units."""
    if n is None:
        return "?"
    value, unit = float(n), "B"
    for next_unit in ("KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024:
            break
        value, unit = value / 1024, next_unit
    if unit == "B":
        return f"{int(value)} B"
    return f"{value:.2f} {unit}" if abs(value) < 10 else f"{value:.1f} {unit}" if abs(value) < 100 else \
        f"{value:.0f} {unit}"


def parse_budget(budget: str | int | float, total_bytes: int | None = None) -> int:
    """'8GiB', '8GB', '512 MiB', '100B', '80%' (of total_bytes) or a byte count (at least 1 MiB) -> bytes.

    A bare number is bytes; one under 1 MiB is refused as ambiguous, since fits(8.5) almost surely
    meant 8.5 GiB: write the unit."""
    if isinstance(budget, numbers.Real) and not isinstance(budget, bool):  # np.float32 and np.int64 too
        budget = float(budget) if not isinstance(budget, numbers.Integral) else int(budget)
        if not 0 < budget < float("inf"):  # NaN too
            raise UserError(f"budget must be a positive, finite size, got {budget}")
        if budget < SMALLEST_BARE:
            n = f"{float(budget):.15g}"  # as written ('8.5', '1048575'): ':g' gave '1.04858e+06', which is no budget
            raise UserError(f"budget {n} has no unit and is under 1 MiB as bytes: write it with its "
                            f"unit, e.g. '{n}GiB' or '{n}GB' (or '{n}B' for bytes)")
        return int(budget)
    # a sign and an exponent are read too: '-1' was "cannot read budget" (not "must be positive"), '1e9' refused
    m = re.fullmatch(r"\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(%|[a-zA-Z]*)\s*", str(budget))
    if not m:
        raise UserError(f"cannot read budget {budget!r}: use e.g. 8GiB, 8GB, 512MiB or 80%")
    value, unit = float(m.group(1)), m.group(2).lower()
    if unit == "%":
        if total_bytes is None:
            raise UserError(f"budget {budget!r} is a percentage but the device size is unknown")
        if not 0 < value <= 100:
            raise UserError(f"budget percentage must be in (0, 100], got {value}")
        return _whole_bytes(total_bytes * value / 100, budget)
    if unit not in _UNITS:
        raise UserError(f"unknown unit {m.group(2)!r} in budget {budget!r}")
    if value <= 0:
        raise UserError(f"budget must be positive, got {budget!r}")
    if unit == "":
        return parse_budget(value, total_bytes)  # a unitless string is a bare number
    if not value * _UNITS[unit] < float("inf"):  # 400 digits read as inf: int(inf) was an OverflowError
        number = m.group(1) if len(m.group(1)) <= 12 else f"{m.group(1)[:12]}... ({len(m.group(1))} digits) "
        raise UserError(f"budget {number}{unit} is too large to be a size")
    return _whole_bytes(value * _UNITS[unit], budget)


def _whole_bytes(n: float, budget) -> int:
    """A budget in whole bytes: one that rounds down to 0 B ('0.5B', '0.00000001%') holds nothing."""
    if int(n) < 1:
        raise UserError(f"budget {budget!r} is under one byte")
    return int(n)


def _check_peak(peak_bytes) -> None:
    """A peak is a number of bytes: finite and >= 0 (NaN, inf, a string or a negative one is refused)."""
    if (isinstance(peak_bytes, bool) or not isinstance(peak_bytes, numbers.Real)
            or not 0 <= peak_bytes < float("inf")):
        raise UserError(f"a peak is a number of bytes, finite and >= 0, got {peak_bytes!r}")


@dataclass
class BudgetCheck:
    budget_bytes: int
    usable_bytes: int  # budget less headroom
    peak_bytes: int
    fits: bool
    headroom: float = HEADROOM

    @property
    def message(self) -> str:
        limit = (f"{format_bytes(self.budget_bytes)} with {self.headroom:.0%} headroom "
                 f"(limit {format_bytes(self.usable_bytes)})")
        if self.peak_bytes <= 0:
            return f"nothing measured (peak 0 B): trivially fits in {limit}"
        verdict = "fits" if self.fits else "does NOT fit"
        return f"peak {format_bytes(self.peak_bytes)} {verdict} in {limit}"


def _check_headroom(headroom) -> None:
    """headroom is the share of a budget kept free: 0.15, not 15 (a negative one would allow more than it)."""
    if isinstance(headroom, bool) or not isinstance(headroom, numbers.Real) or not 0 <= headroom < 1:
        raise UserError(f"headroom is the share of the budget kept free, in [0, 1) (0.15 keeps 15 %), "
                        f"got {headroom!r}")


def check_budget(peak_bytes: int, budget: str | int, total_bytes: int | None = None,
                 headroom: float = HEADROOM) -> BudgetCheck:
    _check_headroom(headroom)
    _check_peak(peak_bytes)
    b = parse_budget(budget, total_bytes)
    usable = int(b * (1 - headroom))
    return BudgetCheck(budget_bytes=b, usable_bytes=usable, peak_bytes=int(peak_bytes), fits=bool(peak_bytes <= usable),
                       headroom=headroom)


@dataclass
class MemoryReport:
    device: str  # "cuda" or "cpu"
    peak_bytes: int  # best estimate of what the call needs above what existed before it
    torch_peak_bytes: int | None = None  # torch allocator: max allocated above the baseline
    torch_reserved_peak_bytes: int | None = None  # ... and what the allocator reserved for it
    cupy_peak_bytes: int | None = None  # CuPy pool: max in use above the baseline
    nvml_peak_delta_bytes: int | None = None  # device used-memory peak above the baseline, all processes
    host_peak_bytes: int | None = None  # CPU: peak host memory of the call
    total_bytes: int | None = None
    peak_source: str = ""  # which figure peak_bytes is: "torch", "cupy", "torch+cupy", "nvml" or "host"
    warmup: int = 0  # unmeasured calls made first
    notes: list[str] = field(default_factory=list)
    gpu_sharing: dict = field(default_factory=dict)  # other processes on the GPU during the call (sharing.py)
    unmeasured: str = ""  # what the peak could not see and why ("": nothing known missing)

    def fits(self, budget: str | int, headroom: float = HEADROOM) -> BudgetCheck:
        return check_budget(self.peak_bytes, budget, self.total_bytes, headroom)

    def to_dict(self) -> dict:
        return asdict(self)


class _Sampler(threading.Thread):
    """Samples a reading function in the background and keeps its maximum."""

    def __init__(self, read: Callable[[], int | None], period_s: float = 0.0005):
        super().__init__(daemon=True)
        self.read, self.period_s = read, period_s
        self.peak = read() or 0
        self._halt = threading.Event()
        self._sampling = threading.Event()  # set once the thread has made a reading and slept

    def start(self) -> None:
        """Start sampling and return once the thread runs: its own start (stack pages, the first reading's objects)
        then lies before a baseline read after this, not inside the measured call."""
        super().start()
        self._sampling.wait(timeout=1.0)

    def run(self):
        while not self._halt.is_set():
            v = self.read()
            if v is not None and v > self.peak:
                self.peak = v
            time.sleep(self.period_s)
            self._sampling.set()

    def stop(self) -> int:
        v = self.read()  # before the join: a thread's exit grows the RSS (60-190 KiB), which is not the call's
        self._halt.set()
        self.join()
        return max(self.peak, v or 0)


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _cupy_peak_hook(cupy):
    """A CuPy memory hook that keeps the peak of bytes in use from the pool above where it started."""

    class PeakHook(cupy.cuda.MemoryHook):
        name = "gpuspeed_peak"

        def __init__(self):
            self.now = self.peak = 0

        def malloc_postprocess(self, **kw):
            self.now += kw["mem_size"]
            self.peak = max(self.peak, self.now)

        def free_postprocess(self, **kw):
            self.now -= kw["mem_size"]

    return PeakHook()


def peak_memory(fn: Callable, *args, kwargs: dict | None = None, device: str = "auto",
                warmup: int = 1) -> MemoryReport:
    """Peak memory of one call of fn(*args, **kwargs) above what was in use before it.

    fn runs `warmup` times first, unmeasured (default 1), so one-time costs (library workspaces, lazily
    loaded kernels, compiled code) do not count; warmup=0 measures the first call with them.
    """
    if not callable(fn):
        raise UserError(f"peak_memory() needs a callable, got {type(fn).__name__}")
    if isinstance(warmup, bool) or not isinstance(warmup, numbers.Integral) or warmup < 0:
        raise UserError(f"warmup must be a whole number >= 0, got {warmup!r}")
    warmup = int(warmup)  # np.int64(2) is a whole number too
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise UserError(f"kwargs= is a dict of keyword arguments for fn, got {type(kwargs).__name__}")
    kwargs = kwargs or {}
    if (why := trees.bad_keyword(kwargs)) is not None:  # fn(**{1: x}): a TypeError from inside the run
        raise UserError(why)
    from gpuspeed.timing import lazy_result

    if (why := lazy_result(fn, trees.callable_name(fn), "peak_memory() would measure")) is not None:
        raise UserError(why)
    if warmup and (why := trees.one_pass_argument(args, kwargs)) is not None:
        raise UserError(why + " in the warm-up, so the measured call would see it empty; pass a list or a tuple "
                        "(or warmup=0)")
    where = _device.resolve_device(device)
    name = trees.callable_name(fn)
    for i in range(warmup):
        out = fn(*args, **kwargs)
        if i == 0 and (why := lazy_result(out, name, "peak_memory() would measure")) is not None:
            raise UserError(why)  # lambda: map(f, xs): the work, and its memory, come only when consumed
        del out
    if where == "cpu":
        # "no GPU" only where auto found none: device="cpu" on a GPU machine said so too (not asked: it imports torch)
        why = "device='cpu', so no GPU memory is counted" if str(device).lower() == "cpu" else "no GPU"
        rep = _peak_host(fn, args, kwargs, None if warmup else name, why)
        rep.warmup = warmup
        return rep
    import torch

    notes = []
    torch.cuda.synchronize()
    cupy = sys.modules.get("cupy")
    hook = None
    if cupy is not None:
        cupy.cuda.Device().synchronize()
        cupy.get_default_memory_pool().free_all_blocks()  # so NVML sees what the pool takes during the call
        hook = _cupy_peak_hook(cupy)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base_alloc, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    index = _device.current_index()  # the sampler thread's own current device would be GPU 0
    nvml_base = _device.nvml_used_bytes(index)
    sampler = _Sampler(lambda: _device.nvml_used_bytes(index)) if nvml_base is not None else None
    sharing = ShareWatch(index) if nvml_base is not None else None
    if sampler:
        sampler.start()
    try:
        with hook if hook is not None else contextlib.nullcontext():
            out = fn(*args, **kwargs)
            torch.cuda.synchronize()
            if cupy is not None:
                cupy.cuda.Device().synchronize()
    finally:
        nvml_peak = sampler.stop() if sampler else None
    others = sharing.stop() if sharing is not None else {}
    if not warmup and (why := lazy_result(out, name, "peak_memory() would measure")) is not None:
        raise UserError(why)
    del out
    torch_peak = torch.cuda.max_memory_allocated() - base_alloc
    reserved_peak = torch.cuda.max_memory_reserved() - base_reserved
    cupy_peak = hook.peak if hook is not None else None
    if cupy is None and "cupy" in sys.modules:  # imported by fn itself
        notes.append("CuPy was first imported inside the call: its pool was not tracked (NVML still saw it)")
    nvml_delta = None if nvml_peak is None else max(nvml_peak - nvml_base, 0)
    if nvml_delta is None:
        notes.append("NVML not available: device-level peak not sampled (JAX, Numba and workspaces unseen)")
    else:
        notes.append("NVML counts every process on this GPU and samples every ~0.5 ms")
    if (why := memory_note(others)) is not None:
        notes.append(why)
    if torch_peak > reserved_peak + 2**20:
        notes.append(f"torch served {format_bytes(torch_peak - reserved_peak)} from memory it had reserved before "
                     "the call: NVML's device-level delta does not show that part")
    if "jax" in sys.modules and os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "") != "platform":
        notes.append("JAX keeps a memory pool between calls, so NVML sees only its growth: set "
                     "XLA_PYTHON_CLIENT_ALLOCATOR=platform before importing jax to measure JAX arrays")
    framework = torch_peak + (cupy_peak or 0)
    source = "+".join(n for n, v in (("torch", torch_peak), ("cupy", cupy_peak)) if v) or "torch"
    peak = framework
    # NVML's rise counts what the frameworks' pools grew by plus everything else (JAX, Numba, raw
    # cudaMalloc, workspaces); the part the pools do not explain is added to their peak in use, so memory
    # outside torch still counts when torch served its share from memory it held before the call.
    # what other processes' memory grew by (NVML's per-process figures) is theirs, not the call's
    other = 0 if nvml_delta is None else max(nvml_delta - reserved_peak - (cupy_peak or 0) - others_growth(others), 0)
    if other > 2**21:  # under 2 MiB is allocator rounding and the context's own growth
        peak, source = framework + other, (source + "+nvml" if framework else "nvml")
        notes.append(f"peak from NVML and the allocators: the GPU's used memory rose {format_bytes(nvml_delta)}, "
                     f"{format_bytes(other)} more than torch and CuPy's pools grew (other libraries such as JAX "
                     "or Numba, workspaces, or another process), added to their peak in use")
    else:
        notes.append(f"peak from {source}'s allocator" + (f" (NVML's rise: {format_bytes(nvml_delta)})"
                                                            if nvml_delta is not None else ""))
    total = int(torch.cuda.get_device_properties(index).total_memory)
    return MemoryReport(device="cuda", peak_bytes=int(peak), torch_peak_bytes=int(torch_peak),
                        torch_reserved_peak_bytes=int(reserved_peak), cupy_peak_bytes=cupy_peak,
                        nvml_peak_delta_bytes=nvml_delta, total_bytes=total, peak_source=source, warmup=warmup,
                        notes=notes, gpu_sharing=others)


# the tracemalloc windows of the peak_memory() calls in progress (one inside another's call): tracemalloc has one
# peak, which a nested call's reset_peak() would take from the outer call, so the nested call hands it on here
_HOST_WINDOWS: list[list[int]] = []


def _peak_host(fn, args, kwargs, name: str | None = None, why: str = "no GPU") -> MemoryReport:
    """The host peak of one call; `name` set: refuse a lazy result (the call was not seen in a warm-up); `why` the
    host was measured, the note's first words."""
    # the instruments start before the baselines are read: torch's profiler (kineto's first start in a process grows
    # the RSS ~1.3 MiB), tracemalloc's tables and the sampler's thread were counted as the call's memory
    torch_allocs = TorchHostAllocs()
    torch_allocs.start()
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    sampler = _Sampler(_rss_bytes) if _rss_bytes() is not None else None
    if sampler:
        sampler.start()
    rss0 = _rss_bytes() if sampler else None
    if was_tracing and _HOST_WINDOWS:  # inside another peak_memory's call: its peak so far survives the reset below
        _, peak_so_far = tracemalloc.get_traced_memory()
        for window in _HOST_WINDOWS:
            window[0] = max(window[0], peak_so_far)
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    mine = [0]  # the highest peak a nested peak_memory's reset took from this window
    _HOST_WINDOWS.append(mine)
    try:
        out = fn(*args, **kwargs)
    finally:
        rss_peak = sampler.stop() if sampler else None
        _, traced_peak = tracemalloc.get_traced_memory()
        traced_peak = max(traced_peak, mine[0])
        _HOST_WINDOWS.remove(mine)
        if not was_tracing:
            tracemalloc.stop()
        torch_allocs.stop()  # after tracemalloc's reading: its events are Python objects
    from gpuspeed.timing import lazy_result

    if name is not None and (why := lazy_result(out, name, "peak_memory() would measure")) is not None:
        raise UserError(why)
    del out
    traced = max(traced_peak - base, 0)
    rss_delta = max(rss_peak - rss0, 0) if rss_peak is not None else 0
    # the profiler's own event buffer grew the RSS too (~44 B an event, torch 2.13): not the call's memory
    rss_delta = max(rss_delta - PROFILER_EVENT_BYTES * torch_allocs.events, 0)
    notes = [f"{why}: host memory of the call (Python/NumPy allocations via tracemalloc, plus torch's CPU "
             "allocations from its profiler's memory events, added; at least the process RSS's rise, sampled "
             "every ~0.5 ms)"]
    if torch_allocs.why:
        notes.append(f"torch's CPU allocations not measured: {torch_allocs.why}")
    peak = int(max(traced + (torch_allocs.peak or 0), rss_delta))
    return MemoryReport(device="cpu", peak_bytes=peak, host_peak_bytes=peak, torch_peak_bytes=torch_allocs.peak,
                        total_bytes=_device._host_mem_bytes(), peak_source="host", notes=notes,
                        unmeasured=f"torch's CPU allocations: {torch_allocs.why}" if torch_allocs.why else "")


# ---------------------------------------------------------------------------------------------------
# cap(): emulate a smaller card
# ---------------------------------------------------------------------------------------------------


@dataclass
class Cap:
    budget_bytes: int
    enforced: bool
    note: str = ""


_fraction_set: dict[int, float] = {}  # what cap() last set, per device: older torch has no getter


def _memory_fraction(torch, index: int) -> float:
    """torch's per-process memory fraction now (read where torch can; else the last one cap() set)."""
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if getter is not None:
        try:
            value = float(getter(index))
            if 0 < value <= 1:
                return value
        except Exception:
            pass
    return _fraction_set.get(index, 1.0)


def _set_memory_fraction(torch, index: int, fraction: float) -> None:
    torch.cuda.set_per_process_memory_fraction(float(fraction), index)
    _fraction_set[index] = float(fraction)


@contextlib.contextmanager
def cap(budget: str | int):
    """Enforce a memory budget inside the block: torch's per-process fraction and CuPy's pool limit.

    Allocations past the budget raise torch.cuda.OutOfMemoryError (or CuPy's OutOfMemoryError), so an
    8 GB card can be emulated on a bigger one. On exit the previous fraction and limit come back, so
    caps nest. Without a GPU the block runs unlimited, with a RuntimeWarning saying so.
    """
    if not _device.cuda_available():
        b = parse_budget(budget, _device.get_device("cpu").mem_bytes)
        note = f"no GPU: the {format_bytes(b)} budget is not enforced on the host"
        warnings.warn(f"gpuspeed.cap: {note}; the block runs unlimited", RuntimeWarning, stacklevel=3)
        yield Cap(b, False, note)
        return
    import torch

    index = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    b = parse_budget(budget, total)
    if b > total:
        raise UserError(f"budget {format_bytes(b)} exceeds the device's {format_bytes(total)}")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    previous = _memory_fraction(torch, index)
    _set_memory_fraction(torch, index, b / total)
    cupy = sys.modules.get("cupy")
    old_limit = None
    if cupy is not None:
        pool = cupy.get_default_memory_pool()
        old_limit = pool.get_limit()
        pool.set_limit(size=b)
    try:
        yield Cap(b, True, f"torch memory fraction {b / total:.4f}" + (", CuPy pool limit set" if cupy else ""))
    finally:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        _set_memory_fraction(torch, index, previous)
        if cupy is not None:
            cupy.get_default_memory_pool().set_limit(size=old_limit or 0)


# ---------------------------------------------------------------------------------------------------
# Chunk planner
# ---------------------------------------------------------------------------------------------------


@dataclass
class ChunkPlan:
    bytes_per_item: float
    fixed_bytes: float
    budget_bytes: int
    usable_bytes: int
    max_chunk: int | None  # None: the peak does not grow with the chunk
    predicted_peak_bytes: float | None
    note: str = ""


def plan_chunks(size_a: int, peak_a: int, size_b: int, peak_b: int, budget: str | int,
                total_bytes: int | None = None, headroom: float = HEADROOM,
                max_size: int | None = None) -> ChunkPlan:
    """Fit peak = fixed + per_item * size through two measurements and return the largest chunk whose
    predicted peak stays under budget x (1 - headroom)."""
    for label, n in (("size_a", size_a), ("size_b", size_b), ("max_size", max_size)):
        if n is not None and (isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1):
            raise UserError(f"{label} is a number of items per chunk, a whole number >= 1, got {n!r}")
    if size_a == size_b:
        raise UserError("the chunk planner needs two different chunk sizes")
    _check_peak(peak_a)
    _check_peak(peak_b)
    _check_headroom(headroom)
    b = parse_budget(budget, total_bytes)
    usable = int(b * (1 - headroom))
    slope = (peak_b - peak_a) / (size_b - size_a)
    fixed = peak_a - slope * size_a
    if slope <= 0 or not math.isfinite((usable - fixed) / slope):  # a slope under 1e-300 B/item is none either
        # no growth: a chunk needs what was measured (the larger peak), not the line's value at 0 items, which a
        # falling pair of peaks puts above both; past the budget nothing fits (0), as below, not None (unbounded)
        top = max(peak_a, peak_b)
        if top > usable:
            return ChunkPlan(slope, fixed, b, usable, 0, None, "peak does not grow with the chunk size, but the "
                             f"measured peak {format_bytes(top)} alone exceeds the budget")
        return ChunkPlan(slope, fixed, b, usable, max_size, top, "peak does not grow with the chunk size")
    chunk = math.floor((usable - fixed) / slope)
    if max_size is not None:
        chunk = min(chunk, max_size)
    if chunk < 1:
        return ChunkPlan(slope, fixed, b, usable, 0, None,
                         "even a chunk of 1 exceeds the budget: the fixed part is too large")
    return ChunkPlan(slope, fixed, b, usable, int(chunk), fixed + slope * chunk,
                     f"largest chunk keeping {headroom:.0%} headroom")


def measure_chunk_plan(run_chunk: Callable[[int], object], size_a: int, size_b: int, budget: str | int,
                       device: str = "auto", max_size: int | None = None) -> ChunkPlan:
    """Measure the peak of run_chunk(size) at two sizes and plan the largest chunk for the budget."""
    pa = peak_memory(run_chunk, size_a, device=device)
    pb = peak_memory(run_chunk, size_b, device=device)
    return plan_chunks(size_a, pa.peak_bytes, size_b, pb.peak_bytes, budget, pa.total_bytes, max_size=max_size)
