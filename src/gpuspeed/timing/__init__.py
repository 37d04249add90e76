"""bench(): the one timing path of gpuspeed.

GPU modes time each sample with CUDA events on the current stream (timing.cuda: events, and graph for
calls too short for events' fixed cost), or sum the call's kernel durations from CUPTI (timing.kernel).
The host clock (timing.cpu) times host functions. Every mode warms up until the time settles and stops
once the median is known to `max_noise` (timing.stopping). Every study in gpuspeed times through here.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

from gpuspeed import device as _device
from gpuspeed import trees
from gpuspeed.errors import UserError, require_flag
from gpuspeed.stats import Comparison, Measurement, compare, format_speedup, format_time, median_rel_error, summarize
from gpuspeed.timing.gpu import EmptyGraph, block_until_ready, flush_l2, hold_gpu, record_graph
from gpuspeed.timing.stopping import WARMUP_SHARE, Stopper
from gpuspeed.trees import clone_tree, has_gpu_data, is_gpu_array

__all__ = ["bench", "Measurement", "Comparison", "compare", "format_speedup", "format_time", "median_rel_error",
           "summarize", "record_graph", "EmptyGraph", "flush_l2", "hold_gpu", "block_until_ready", "clone_tree",
           "has_gpu_data", "is_gpu_array", "choose_clock"]

MODES = ("auto", "events", "graph", "kernel", "cpu")


def choose_clock(device: str, mode: str, gpu_present: bool, args, probe: Callable[[], Any]) -> tuple[str, bool]:
    """Which clock times the call: ("cuda", False) for the GPU modes, ("cpu", device_sync) for the host clock.

    The rule: with a GPU present, anything timed on the host clock is bracketed by full device
    synchronizes (device_sync=True) -- a call that takes and returns host data may still have launched
    GPU work (a launcher writing an output buffer and returning None, a Numba CUDA kernel on NumPy
    arrays), and a host clock without a synchronize would time only its launches. Only device="cpu"
    (the caller says: no GPU work) or no GPU at all gives the bare host clock. In auto device and mode,
    a call with host arrays in and no GPU arrays among its arguments is probed once (`probe()` returns
    its result): host data out -> host clock with device synchronizes, GPU data out -> CUDA events.
    """
    if device == "cpu" or not gpu_present:
        if mode in ("graph", "kernel", "events"):
            raise UserError(f"{mode} mode needs a CUDA device")
        return "cpu", False
    if mode == "cpu":
        return "cpu", True
    if device == "auto" and mode == "auto" and trees.host_arrays(args) and not trees.has_gpu_data(args):
        out = probe()
        block_until_ready(out)
        if not trees.has_gpu_data(out):
            return "cpu", True
    return "cuda", False


# results that hold their work back until consumed: map and filter call their function per item as they are
# iterated, zip and enumerate pass on whatever lazy iterables they wrap, and every itertools object is lazy
_LAZY_ITERATORS = (map, filter, zip, enumerate)


def lazy_result(fn_or_result, name: str, measuring: str = "bench() would time") -> str | None:
    """Why timing this would time nothing: a generator or async function (or the generator / coroutine one
    call returned), a lazy iterator (map, filter, zip, enumerate, itertools) or a concurrent.futures.Future
    does its work only when iterated, awaited or waited on, after the timed call. None when fine."""
    import concurrent.futures

    x, call = fn_or_result, name if isinstance(name, str) and name.isidentifier() else "fn"
    if inspect.isgeneratorfunction(x) or inspect.isgenerator(x):
        what, how = "a generator", f"lambda: list({call}(...))"
    elif isinstance(x, _LAZY_ITERATORS) or type(x).__module__ == "itertools":
        what, how = f"a lazy iterator ({type(x).__name__})", f"lambda: list({call}(...))"
    elif isinstance(x, concurrent.futures.Future):
        return (f"{name} returns a Future, whose work runs in another thread, so {measuring} submitting it; "
                f"pass a call that waits for it, e.g. lambda: {call}(...).result()")
    elif inspect.isasyncgenfunction(x) or inspect.isasyncgen(x):
        what, how = "an async generator", "an async loop run to its end"
    elif inspect.iscoroutinefunction(x) or inspect.iscoroutine(x):
        what, how = "a coroutine", f"lambda: asyncio.run({call}(...))"
    else:
        return None
    return (f"{name} returns {what}, which does its work only when consumed, so {measuring} creating it; "
            f"pass a call that runs it, e.g. {how}")


def refuse_lazy_result(out, name: str) -> None:
    """Raise lazy_result's one line for a first call's result that holds its work back (`lambda: gen()`,
    `lambda: map(f, xs)`: bench() itself sees only the lambda); a coroutine is closed first, so it does not warn."""
    if (why := lazy_result(out, name)) is not None:
        if hasattr(out, "close"):
            out.close()
        raise UserError(why)


def _check_rotation_fits(args, kwargs, rotate: int) -> None:
    """A one-line UserError where rotate - 1 copies of the arguments do not fit in the free memory where they live:
    cloned blindly, they took all of it and the OOM killer ended the process without a word (on a GPU: a raw
    out-of-memory error)."""
    from gpuspeed.inputs import gpu_available_bytes, host_available_bytes

    need: dict[str, int] = {}
    for x, size in trees.clone_copies((args, kwargs)):  # a broadcast view's copy is its few bytes, not its shape's
        dev = getattr(x, "device", None)
        where = "host"
        if trees.module_of(x) == "torch" and getattr(dev, "type", None) == "cuda":
            where = f"cuda:{dev.index or 0}"
        elif trees.module_of(x) == "cupy":
            where = f"cuda:{getattr(dev, 'id', 0)}"
        need[where] = need.get(where, 0) + size * (rotate - 1)
    for where, needed in need.items():
        free = host_available_bytes() if where == "host" else gpu_available_bytes(where)
        if free is not None and needed > free:
            place = "host" if where == "host" else f"GPU ({where})"
            raise UserError(f"rotate={rotate} makes {rotate - 1} cop{'y' if rotate == 2 else 'ies'} of the arguments: "
                            f"{needed / 2**30:.1f} GiB of "
                            f"{place} memory, {free / 2**30:.1f} GiB is free: pass a smaller rotate")


def _check_values(flush, graph_calls, mode, rotate, warmup_s, hide_launch_latency) -> None:
    """A one-line UserError for a value of these bench() options it cannot use."""
    require_flag("hide_launch_latency", hide_launch_latency)  # "no" held the stream as True does
    if not (isinstance(flush, (bool, np.bool_)) or callable(flush)):  # None read as False
        raise UserError(f"flush takes True, False or a callable that clears the cache, got {flush!r}")
    if graph_calls is not None and (isinstance(graph_calls, bool) or not isinstance(graph_calls, numbers.Integral)
                                    or graph_calls < 1):  # 0 meant the default; -5 captured nothing, times < 0
        raise UserError(f"graph_calls must be a whole number >= 1 (calls per graph replay), got {graph_calls!r}")
    if mode not in MODES:
        raise UserError(f"unknown mode {mode!r}: use {', '.join(MODES)}")
    if isinstance(rotate, bool) or not isinstance(rotate, numbers.Integral) or rotate < 0:  # True was kept as True
        raise UserError(f"rotate must be a whole number >= 0, got {rotate!r}")
    if warmup_s is not None and (isinstance(warmup_s, bool) or not isinstance(warmup_s, numbers.Real)
                                 or not 0 <= warmup_s < math.inf):  # NaN too: the warm-up would never end
        raise UserError(f"warmup_s must be a finite number of seconds >= 0, got {warmup_s!r}")


def check_options(caller: str, options: dict) -> None:
    """A one-line UserError for bench() options it would refuse (a name it has not, a value it cannot use), for a
    caller that passes them on after slow work of its own: place() measured the ceilings (~10 s to a minute) before
    bench() raised a bare TypeError for budge_s=."""
    params = inspect.signature(bench).parameters
    known = [p for p, v in params.items() if v.kind is inspect.Parameter.KEYWORD_ONLY and p not in ("kwargs", "name")]
    unknown = [k for k in options if k not in known]
    if unknown:
        import difflib

        close = difflib.get_close_matches(str(unknown[0]), known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise UserError(f"{caller} passes its other options on to bench(), which has no option {unknown[0]!r}{hint}; "
                        f"bench's: {', '.join(known)}")
    given = {p: options.get(p, v.default) for p, v in params.items() if p in known}
    _check_values(given["flush"], given["graph_calls"], given["mode"], given["rotate"], given["warmup_s"],
                  given["hide_launch_latency"])
    Stopper(given["max_noise"], given["min_samples"], given["max_samples"], given["budget_s"])
    gpu_present = _device.resolve_device(given["device"]) == "cuda"
    choose_clock(given["device"], given["mode"], gpu_present, (), lambda: None)  # graph mode on the CPU: refused


def bench(fn: Callable, *args, kwargs: dict | None = None, name: str | None = None, device: str = "auto",
          mode: str = "auto", flush: bool | Callable[[], Any] = True, rotate: int = 0, max_noise: float = 0.01,
          min_samples: int = 10, max_samples: int = 2000, budget_s: float = 2.0,
          warmup_s: float | None = None, graph_calls: int | None = None,
          hide_launch_latency: bool = False) -> Measurement:
    """Time `fn(*args, **kwargs)`.

    device: "auto" (the GPU when there is one), "cuda" or "cpu" (no GPU work: the bare host clock).
        In auto, a call that takes host arrays and returns host data is timed on the host clock with a
        device synchronize before and after each call (it may have launched GPU work; see choose_clock);
        Measurement.device_sync and a note record it.
    mode: "auto" (events; graph when one call times under 20 us and is capturable), "events", "graph",
        "kernel" (the sum of the function's GPU kernel durations from CUPTI (torch.profiler), what Nsight
        reports -- no launch latency, no gaps; events add a fixed cost per call), or "cpu" (host clock).
        Its profiler sessions, like any torch.profiler session, leave CUPTI's callbacks on every later launch in
        the process (pytorch/pytorch#144455): host-bound calls timed after it, in any mode, read slower.
    flush: read 3x L2 before each timed call, outside the timed window: it evicts the inputs and leaves clean
        lines behind (False: warm-cache timing; a callable: your own cache clear, e.g. to match another tool's:
        one that writes a buffer leaves dirty lines, which the timed call then writes back; on the host clock a
        callable runs before every call too, and calls are then never batched). Graph mode flushes
        once per replay of K calls, so calls 2..K run with a warm L2: Measurement.flush says "per-replay" and
        flush_l2 is False.
    rotate: N > 1 clones the arguments N times and cycles through them, so inputs are not L2-resident.
        Clones keep strides, memory order and which arguments alias each other.
    max_noise / min_samples / max_samples / budget_s: stop once the relative standard error of the
        median is under max_noise, at max_samples, or once budget_s (counted from the start of this call,
        warm-up included) is spent -- never with fewer than min_samples samples, a floor that can make a
        slow call take longer than budget_s. Batched GPU modes overshoot the budget by at most one batch.
    warmup_s: time the warm-up may take to settle (default: a third of budget_s; always at least 2 calls).
    graph_calls: K calls captured per graph replay in graph mode (default: about 5 ms of work, 10 to 1000).
    hide_launch_latency: in events mode the GPU is busy ~30-50 us before each sample (the flush, or a spin), so a
        call whose host takes longer to issue its launches pays for it, as in real use. True holds it for 1.5x the host's time
        to issue one call (measured in the warm-up; 50 us to 1 ms): the call's launches are queued when the
        start event fires, and a sample is the GPU's time, not a Python launcher's latency (kernel_report).
    """
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise UserError(f"kwargs= takes a dict of keyword arguments for fn, got {type(kwargs).__name__}")
    kwargs = kwargs or {}
    if (why := trees.bad_keyword(kwargs)) is not None:  # fn(**{1: x}): a TypeError from inside the run
        raise UserError(why)
    if not callable(fn):
        raise UserError(f"bench() needs a callable, got {type(fn).__name__}")
    _check_values(flush, graph_calls, mode, rotate, warmup_s, hide_launch_latency)
    rotate = int(rotate)
    name = name or trees.callable_name(fn)
    if not isinstance(name, str):  # name=5 made a record its own from_dict refuses
        raise UserError(f"name is the measurement's label, a string, got {type(name).__name__} {name!r}")
    if (why := lazy_result(fn, name)) is not None:
        raise UserError(why)
    if (why := trees.one_pass_argument(args, kwargs)) is not None:
        raise UserError(why + " and every later call would be timed on nothing; pass a list or a tuple")
    # before the budget's clock starts: finding the device may import torch, seconds in a fresh process
    gpu_present = _device.resolve_device(device) == "cuda"
    stopper = Stopper(max_noise, min_samples, max_samples, budget_s)
    warmup_s = budget_s * WARMUP_SHARE if warmup_s is None else warmup_s
    if rotate > 1:
        _check_rotation_fits(args, kwargs, rotate)
    argsets = [(args, kwargs)] + [clone_tree((args, kwargs)) for _ in range(max(rotate, 1) - 1)]

    clock, device_sync = choose_clock(device, mode, gpu_present, (args, kwargs), lambda: fn(*args, **kwargs))
    if clock == "cpu":
        from gpuspeed.timing.cpu import bench_host

        return bench_host(fn, argsets, name, stopper, warmup_s, rotate, device_sync=device_sync, flush=flush)
    if mode == "kernel":
        if callable(flush):
            raise UserError("kernel mode takes flush=True or False (its own flush marks the calls apart)")
        from gpuspeed.timing.kernel import bench_kernels

        return bench_kernels(fn, argsets, name, stopper, warmup_s, flush, rotate)
    from gpuspeed.timing.cuda import bench_cuda

    return bench_cuda(fn, argsets, name, stopper, warmup_s, mode, flush, rotate, graph_calls, hide_launch_latency)
