"""The host clock: each sample is `perf_counter` around one call.

Used for host functions, and -- with a full device synchronize before and after every call -- for a
call that takes host arrays and returns host data while a GPU is present, since it may still have
launched GPU work (a launcher writing an output buffer, a Numba CUDA kernel on NumPy arrays).
"""

from __future__ import annotations

import time

import numpy as np

from gpuspeed import device as _device
from gpuspeed.stats import Measurement, format_time, summarize
from gpuspeed.timing import gpu
from gpuspeed.timing import refuse_lazy_result as _refuse_lazy_result
from gpuspeed.timing.stopping import Stopper, settle


def idle_sync_s(n: int = 21) -> float:
    """Median seconds of a device synchronize with nothing to wait for: what device_sync adds per call."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        gpu.synchronize()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def clock_cost_s(n: int = 101) -> float:
    """Median seconds between two perf_counter readings with nothing between them."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


BATCH_BELOW_S = 20e-6  # a call under this is timed several at a time: the clock and the loop would be much of one
BATCH_SAMPLE_S = 200e-6  # what such a batch of calls takes


def bench_host(fn, argsets, name: str, stopper: Stopper, warmup_s: float, rotate: int,
               device_sync: bool = False, flush=False) -> Measurement:
    """Time on the host clock; device_sync brackets every call with device synchronizes (and flushes L2
    before it when `flush` is set), so whatever GPU work the call launched is inside its time. A callable
    `flush` (the caller's own cache clear) runs before every call, on the bare host clock too. On the bare
    host clock a call under 20 us is timed in batches of back-to-back calls (a sample is their mean), unless
    a callable flush must run before each."""
    position = 0
    wait = [None]  # whether results hold JAX / CuPy arrays to wait for: settled by the first call's result

    def call():
        nonlocal position
        args, kwargs = argsets[position % len(argsets)]
        position += 1
        out = fn(*args, **kwargs)
        if wait[0] is None:
            _refuse_lazy_result(out, name)  # lambda: gen(): the first result shows it
            wait[0] = gpu.needs_wait(out)  # a walk over every leaf, made once: not in each sample's time
        if wait[0]:
            gpu.block_until_ready(out)

    def one() -> float:
        if callable(flush):  # the caller's cache clear, on the bare host clock too
            flush()
        elif flush and device_sync:
            gpu.flush_l2()
        if device_sync:
            gpu.synchronize()  # nothing queued earlier runs inside this call's time
        t = time.perf_counter()
        call()
        if device_sync:
            gpu.synchronize()
        return time.perf_counter() - t

    def batch_size(per_call: float) -> int:
        return int(min(10_000, max(2, BATCH_SAMPLE_S // max(per_call, 1e-8))))

    typical, n_warm, settled = settle(one, warmup_s)
    per_sample = 1
    if not device_sync and not callable(flush) and typical < BATCH_BELOW_S:  # a flush goes before every call
        per_sample = batch_size(typical)
    # the argument sets of one batch, in rotation order: the timed loop does nothing but call
    plan = [argsets[i % len(argsets)] for i in range(per_sample)] if per_sample > 1 else []
    any_kwargs = any(kw for _, kw in argsets)

    def batch() -> float:
        block = gpu.block_until_ready if wait[0] else None
        t = time.perf_counter()
        if block is None and not any_kwargs:
            for args, _ in plan:
                fn(*args)  # an empty **{} alone would add ~100 ns a call
        elif block is None:
            for args, kwargs in plan:
                fn(*args, **kwargs)
        else:
            for args, kwargs in plan:
                block(fn(*args, **kwargs))
        return (time.perf_counter() - t) / per_sample

    if per_sample > 1:  # a call timed alone was mostly the clock's cost: sized again on a batch's time of one call
        typical = batch()
        per_sample = batch_size(typical)
        plan = [argsets[i % len(argsets)] for i in range(per_sample)]
    sample = one if per_sample == 1 else batch
    samples: list[float] = []
    while not stopper.done(samples):
        samples.append(sample())
    notes = [stopper.reason, f"warm-up: {n_warm} calls" + ("" if settled else ", did not settle")]
    if per_sample > 1:
        notes.append(f"each sample is the mean of {per_sample} back-to-back calls: one takes ~{typical * 1e6:.2g} us, "
                     "where the clock's own cost would be much of a single call's time")
    elif not device_sync and typical < BATCH_BELOW_S:  # a callable flush before every call: one call a sample
        notes.append(f"each sample is one call (the flush goes before each), ~{format_time(float(np.median(samples)))}: "
                     f"a call this short is timed with the clock's own cost in it (~{clock_cost_s() * 1e9:.0f} ns a "
                     "reading, measured here) and the call's Python overhead; without flush= it is timed in batches")
    flush_l2, flush_done = False, "custom per-call" if callable(flush) else "none"
    if device_sync:
        notes.append(f"host clock with a device synchronize before and after each call: host data in and out, "
                     f"but the call may launch GPU work; each sample includes one synchronize "
                     f"({idle_sync_s() * 1e6:.1f} us when idle, measured here)")
        if flush:
            flush_l2, flush_done = not callable(flush), "custom per-call" if callable(flush) else "per-call"
        if gpu.profiled_before():
            notes.append(gpu.PROFILED_NOTE)
    # with device_sync the time may be the GPU's: name the GPU, mode "cpu" names the clock
    where = _device.get_device("cuda").name if device_sync else _device.host_name()  # no torch import for NumPy code
    return summarize(samples, name=name, device=where, mode="cpu", flush_l2=flush_l2, calls_per_sample=per_sample,
                     flush=flush_done, device_sync=device_sync, rotate=rotate, notes=notes)
