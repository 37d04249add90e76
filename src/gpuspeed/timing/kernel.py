"""Kernel mode: each sample is the summed duration of the GPU work one call launched, read from CUPTI
(torch.profiler) -- what Nsight reports: no launch latency, no gaps between kernels.

Several calls share a profiler session, each preceded by a 1-byte int8 fill (the marker) and the L2 flush:
the device activities between two markers, less the flush's own, are one call's. Each session opens with a
marker and a flush and no call, so the activities between its first two markers are the flush's own: they
are counted there, in the same session (a session of its own would cost a second profiler start). If the call
itself launches an int8 fill, the markers are ambiguous and each sample gets a session of its own (slower,
same answer).
"""

from __future__ import annotations

import contextlib
import time

from gpuspeed.clocks import ClockWatch, throttled
from gpuspeed.compat import quiet_profiler_start
from gpuspeed.sharing import ShareWatch, shared
from gpuspeed.errors import UserError
from gpuspeed.stats import Measurement, summarize
from gpuspeed.timing import gpu
from gpuspeed.timing.cuda import flush_record
from gpuspeed.timing.stopping import Stopper

MARKER = "FillFunctor<signed char>"  # the 1-byte int8 fill that marks where each call's device work starts
SESSION_S = 0.05  # a profiler session costs tens of ms to start and read: give each about this much work
WARMUP_MAX_S = 0.5
_markers: dict = {}


def device_activities(prof) -> list:
    """Device-side events of a profiler session (kernels, memcpy, memset), in start order."""
    acts = [e for e in prof.events()
            if not str(e.device_type).endswith("CPU") and not getattr(e, "is_user_annotation", False)]
    return sorted(acts, key=lambda e: e.time_range.start)


def marker_positions(acts) -> list[int]:
    """Indices of the marker fills among a session's device activities."""
    return [i for i, e in enumerate(acts) if MARKER in e.name or "FillFunctor<char>" in e.name]


def split_at_markers(acts, n_calls: int) -> list[float] | None:
    """Per-call device seconds from a session of n_calls calls that opened with one extra mark (a marker and
    the flush, no call): the activities between consecutive markers, less the flush's own, which lead each
    span and are counted in the opening one. None if the markers don't come out as exactly one per call plus
    the opening one (the user's own code launched an int8 fill)."""
    marks = marker_positions(acts)
    if len(marks) != n_calls + 1:
        return None
    lead = marks[1] - marks[0] - 1
    bounds = marks + [len(acts)]
    return [sum(e.time_range.elapsed_us() for e in acts[bounds[j] + 1 + lead:bounds[j + 1]]) * 1e-6
            for j in range(1, n_calls + 1)]


def first_call_after_marks(acts) -> float:
    """A one-call session's device seconds (opening mark, mark, call): everything after the second marker and
    the flush's activities, whatever the call itself launches."""
    marks = marker_positions(acts)
    if len(marks) < 2:  # seen beside other CUPTI users: "CUPTI initialization failed", and an IndexError here
        raise UserError(f"kernel mode: the profiler recorded {len(acts)} GPU activities and {len(marks)} of its own "
                        "2 markers: CUPTI is not recording in this process (torch's warnings above say why); "
                        "time with mode='events'")
    lead = marks[1] - marks[0] - 1
    return sum(e.time_range.elapsed_us() for e in acts[marks[1] + 1 + lead:]) * 1e-6


def place_marker() -> None:
    """The 1-byte int8 fill that starts a call's span in the trace."""
    import torch

    idx = torch.cuda.current_device()
    if idx not in _markers:
        _markers[idx] = torch.empty(1, dtype=torch.int8, device="cuda")
    _markers[idx].fill_(1)


def bench_kernels(fn, argsets, name: str, stopper: Stopper, warmup_s: float, flush: bool,
                  rotate: int) -> Measurement:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from gpuspeed.timing import refuse_lazy_result

    position = 0

    def call():
        nonlocal position
        args, kwargs = argsets[position % len(argsets)]
        position += 1
        out = fn(*args, **kwargs)
        if position == 1:  # lambda: map(f, xs): its launches would come only when consumed, after the session
            refuse_lazy_result(out, name)
        gpu.block_until_ready(out)

    def mark():
        place_marker()
        if flush:
            gpu.flush_l2()

    call()  # compile, allocate: never part of the estimate below
    torch.cuda.synchronize()
    t0, n_warm = time.perf_counter(), 0
    while True:  # warm-up: wake the clocks, and learn what a call costs
        call()
        torch.cuda.synchronize()
        n_warm += 1
        if time.perf_counter() - t0 > min(warmup_s, WARMUP_MAX_S):
            break
    per_call_s = (time.perf_counter() - t0) / n_warm
    per_session = int(min(100, max(10, SESSION_S / max(per_call_s, 1e-6))))
    samples: list[float] = []
    watch, sharing = ClockWatch(), ShareWatch()
    while not stopper.done(samples):
        size = stopper.next_batch(len(samples), 0, per_call_s, per_session)
        started = time.perf_counter()
        with contextlib.ExitStack() as session:
            with quiet_profiler_start():  # torch 2.10/2.11 warn at every start (pytorch#180348)
                prof = session.enter_context(profile(activities=[ProfilerActivity.CUDA]))
            mark()  # no call after this one: what follows it up to the next marker is the flush's own work
            for _ in range(size):
                mark()
                call()
            torch.cuda.synchronize()
        gpu.mark_profiled()  # this session's CUPTI stays attached: later host-bound timings note it
        acts = device_activities(prof)
        got = split_at_markers(acts, size)
        if got is None:
            if size == 1:  # one call, one session
                got = [first_call_after_marks(acts)]
            else:
                per_session = 1
                continue
        if not any(t > 0 for t in got):
            raise UserError("kernel mode: the profiler saw no GPU work for this function")
        samples.extend(got)
        per_call_s = (time.perf_counter() - started) / size  # the session's own cost included
    samples = samples[:stopper.max_samples]
    clocks, others = watch.stop(), sharing.stop()
    notes = [stopper.reason, f"warm-up: {n_warm + 1} calls",
             "kernel mode: summed device activity durations (CUPTI); excludes launch latency and gaps between "
             "kernels"]
    is_throttled = throttled(clocks, notes)
    is_shared = shared(others, notes)
    flush_l2, flush_done = flush_record(flush, graph=False)
    return summarize(samples, name=name, device=torch.cuda.get_device_name(), mode="kernel", clocks=clocks,
                     throttled=is_throttled, flush_l2=flush_l2, flush=flush_done, rotate=rotate,
                     shared_gpu=is_shared, gpu_sharing=others, notes=notes)
