"""The host clock: each sample is `perf_counter` around one call.

Used for host functions, and -- with a full device synchronize before and after every call -- for a
call that takes host arrays and returns host data while a GPU is present, since it may still have
launched GPU work (a launcher writing an output buffer, a Numba CUDA kernel on NumPy arrays).
"""

from __future__ import annotations

import time

import numpy as np

from gpuspeed import device as _device
from gpuspeed.stats import Measurement, summarize
from gpuspeed.timing import gpu
from gpuspeed.timing.stopping import Stopper, settle


def idle_sync_s(n: int = 21) -> float:
    """Median seconds of a device synchronize with nothing to wait for: what device_sync adds per call."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        gpu.synchronize()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def bench_host(fn, argsets, name: str, stopper: Stopper, warmup_s: float, rotate: int,
               device_sync: bool = False, flush=False) -> Measurement:
    """Time on the host clock; device_sync brackets every call with device synchronizes (and flushes L2
    before it when `flush` is set), so whatever GPU work the call launched is inside its time."""
    position = 0

    def one() -> float:
        nonlocal position
        args, kwargs = argsets[position % len(argsets)]
        position += 1
        if device_sync:
            if callable(flush):
                flush()
            elif flush:
                gpu.flush_l2()
            gpu.synchronize()  # nothing queued earlier runs inside this call's time
        t = time.perf_counter()
        gpu.block_until_ready(fn(*args, **kwargs))
        if device_sync:
            gpu.synchronize()
        return time.perf_counter() - t

    _, n_warm, settled = settle(one, warmup_s)
    samples: list[float] = []
    while not stopper.done(samples):
        samples.append(one())
    notes = [stopper.reason, f"warm-up: {n_warm} calls" + ("" if settled else ", did not settle")]
    flush_l2, flush_done = False, "none"
    if device_sync:
        notes.append(f"host clock with a device synchronize before and after each call: host data in and out, "
                     f"but the call may launch GPU work; each sample includes one synchronize "
                     f"({idle_sync_s() * 1e6:.1f} us when idle, measured here)")
        if flush:
            flush_l2, flush_done = not callable(flush), "custom per-call" if callable(flush) else "per-call"
        if gpu.profiled_before():
            notes.append(gpu.PROFILED_NOTE)
    # with device_sync the time may be the GPU's: name the GPU, mode "cpu" names the clock
    where = _device.get_device("cuda" if device_sync else "cpu").name
    return summarize(samples, name=name, device=where, mode="cpu", flush_l2=flush_l2,
                     flush=flush_done, device_sync=device_sync, rotate=rotate, notes=notes)
