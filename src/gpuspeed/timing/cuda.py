"""Events and graph modes: each sample is the time between two CUDA events on the current stream.

Events mode times one call per sample. Graph mode captures K calls in a CUDA graph and times one replay
per sample, divided by K: a call too short for events' fixed cost per sample is chosen for it in auto
mode. Between samples the L2 is flushed outside the timed window (or, with the flush off, the stream is held
busy for PRELAUNCH_HOLD_S), so the call's first launches are queued by the time the start event fires, as in
triton's do_bench; a call whose host takes longer to issue them is host-bound and pays for it, as in use.
hide_launch_latency holds it for HOLD_OVER_HOST times the host's time to issue one call (measured in the
warm-up, at most MAX_HOLD_S): a sample is then the GPU's time, not a Python launcher's latency (on the
H200's host a Triton launcher outlasted the flush: mandelbrot's kernel timed 68.6 us with its launcher's
latency, 6.8 us without; results/nvidia-h200/kernels.json at efc5c2d and 1bac8bf). A call whose host work
outlasts even that hold still shows as host-bound.
"""

from __future__ import annotations

import math
import time

import numpy as np

from gpuspeed.clocks import ClockWatch, throttled
from gpuspeed.sharing import ShareWatch, shared
from gpuspeed.errors import UserError
from gpuspeed.stats import Measurement, summarize
from gpuspeed.timing import gpu
from gpuspeed.timing.stopping import Stopper, sample_batches, settle

# Calls whose events time is under this are timed in a graph, where the fixed cost per sample
# (event timestamps, the launch after the start event) is shared by K calls.
GRAPH_MODE_BELOW_S = 20e-6
GRAPH_REPLAY_S = 5e-3  # work captured per graph replay: the replay's own start is a small share of it
EVENTS_FIXED_NOTE_BELOW_S = 300e-6  # under this, events mode's fixed cost per call is worth a note
PRELAUNCH_HOLD_S = 50e-6  # with the flush off, a spin this long stands in for it before each sample
HOLD_OVER_HOST = 1.5  # hide_launch_latency: the spin lasts this many times the call's host time
MAX_HOLD_S = 1e-3  # at most: a host-bound call (an eager decode loop) is not turned into its GPU time
BATCH_S = 0.025  # GPU work between two synchronizes while sampling
SETTLE_BATCH_MAX_S = 0.05  # one unread batch before sampling when a batch is at most this long


def flush_record(flush, graph: bool) -> tuple[bool, str]:
    """(flush_l2, flush) for the Measurement: what happened to L2 before each timed call."""
    if not flush:
        return False, "none"
    per = "per-replay" if graph else "per-call"
    if callable(flush):
        return False, f"custom {per}"
    return not graph, per


def prelaunch_hold(flushed: bool, hide_launch_latency: bool, host_s: float) -> float:
    """Seconds of spin before each sample's start event: none behind the flush (itself GPU work), else
    PRELAUNCH_HOLD_S; hiding the launch latency, HOLD_OVER_HOST x the host's time to issue one call, within
    [PRELAUNCH_HOLD_S, MAX_HOLD_S]."""
    if hide_launch_latency:
        return min(MAX_HOLD_S, max(PRELAUNCH_HOLD_S, HOLD_OVER_HOST * host_s))
    return 0.0 if flushed else PRELAUNCH_HOLD_S


def bench_cuda(fn, argsets, name: str, stopper: Stopper, warmup_s: float, mode: str, flush, rotate: int,
               graph_calls: int | None, hide_launch_latency: bool = False) -> Measurement:
    import torch

    from gpuspeed.timing import refuse_lazy_result

    position = 0

    def call():
        nonlocal position
        args, kwargs = argsets[position % len(argsets)]
        position += 1
        out = fn(*args, **kwargs)
        if position == 1:  # lambda: map(f, xs): events would time the map's creation, none of f's launches
            refuse_lazy_result(out, name)
        return out

    hold = [prelaunch_hold(bool(flush), False, 0.0)]  # hide_launch_latency: re-set once the warm-up has timed the host
    host_times: list[float] = []  # that time per warm-up call (a call that synchronizes includes its wait)

    def enqueue(start, end, body) -> None:
        if callable(flush):
            flush()
        elif flush:
            gpu.flush_l2()
        if hold[0]:
            gpu.hold_gpu(hold[0])
        start.record()
        t0 = time.perf_counter()
        gpu.block_until_ready(body())
        end.record()
        host_times.append(time.perf_counter() - t0)

    pairs = gpu.EventPairs()

    def one() -> float:
        (pair,) = pairs.take(1)
        enqueue(*pair, call)
        torch.cuda.synchronize()
        pairs.give_back([pair])
        return pair[0].elapsed_time(pair[1]) * 1e-3

    def queued_median(n: int) -> float:
        """Median of n samples queued back to back, as the real samples will be."""
        taken = pairs.take(n)
        for start, end in taken:
            enqueue(start, end, call)
        times = gpu.elapsed(taken)
        pairs.give_back(taken)
        return float(np.median(times))

    notes: list[str] = []
    typical, n_warm, settled = settle(one, warmup_s)
    host_s = float(np.median(host_times[1:]))  # the first call pays for compilation and allocation
    hold[0] = prelaunch_hold(bool(flush), hide_launch_latency, host_s)
    notes.append(f"warm-up: {n_warm} calls" + ("" if settled else ", did not settle"))
    if hide_launch_latency and HOLD_OVER_HOST * host_s > MAX_HOLD_S:
        notes.append(f"the host takes {host_s * 1e6:.0f} us to issue a call, longer than the {MAX_HOLD_S * 1e6:.0f} us "
                     "the stream is held before each sample: what it issues after that runs as it comes (host-bound)")
    if mode == "graph" or (mode == "auto" and typical < 5 * GRAPH_MODE_BELOW_S):
        # the warm-up synchronizes after every call (and held the stream only briefly), which makes a tiny call look
        # several times slower than when samples queue back to back: graph mode and K are chosen on real samples
        typical = min(typical, queued_median(10))

    graph, calls_per_sample = None, 1
    if mode == "graph" or (mode == "auto" and typical < GRAPH_MODE_BELOW_S):
        calls_per_sample = graph_calls or int(min(1000, max(10, GRAPH_REPLAY_S / max(typical, 1e-7))))

        def captured():
            for j in range(calls_per_sample):
                args, kwargs = argsets[j % len(argsets)]
                fn(*args, **kwargs)

        try:
            graph, _ = gpu.record_graph(captured)
        except Exception as exc:
            if mode == "graph":
                raise UserError(f"graph mode: capture failed: {type(exc).__name__}: "
                                f"{str(exc).splitlines()[0]}") from exc
            why = str(exc).splitlines()[0] if isinstance(exc, gpu.EmptyGraph) else type(exc).__name__
            notes.append(f"graph capture failed ({why}); timed with events instead")
            graph, calls_per_sample = None, 1

    watch, sharing = ClockWatch(), ShareWatch()
    # Samples go out in batches of ~BATCH_S of GPU work, double-buffered: the next batch is queued before
    # the host waits on the last one, so the GPU never idles between batches, as under a loop calling
    # the function. Clocks and power then settle where sustained use puts them instead of recovering in
    # sync pauses.
    per_sample = typical * calls_per_sample
    nominal = int(min(1000, max(3, math.ceil(BATCH_S / max(per_sample, 1e-6)))))
    body = graph.replay if graph is not None else call

    def queue(n: int) -> list:
        taken = pairs.take(n)
        for start, end in taken:
            enqueue(start, end, body)
        return taken

    def read(taken: list) -> list[float]:
        times = gpu.elapsed(taken, calls_per_sample)
        pairs.give_back(taken)
        return times

    samples = sample_batches(queue, read, stopper, per_sample, nominal,
                             settle_batch=per_sample * nominal <= SETTLE_BATCH_MAX_S)
    torch.cuda.synchronize()
    clocks, others = watch.stop(), sharing.stop()
    notes.insert(0, stopper.reason)
    is_throttled = throttled(clocks, notes)
    is_shared = shared(others, notes)
    flush_l2, flush_done = flush_record(flush, graph is not None)
    if graph is not None:
        notes.append(f"graph mode: {calls_per_sample} calls per replay, time divided by {calls_per_sample}")
        if flush:
            notes.append(f"graph mode: L2 flushed once per replay, so calls 2..{calls_per_sample} of each replay "
                         f"find what the call before them left in L2 (flush_l2=False, flush={flush_done!r}); "
                         "rotate=N spreads the calls over N copies of the inputs, mode='events' flushes before "
                         "every call")
    elif float(np.median(samples)) < EVENTS_FIXED_NOTE_BELOW_S:
        notes.append("events mode carries a fixed cost per call (the event timestamps and the launch after the "
                     "start event; benchmarks/bench_accuracy.py measures it as events_fixed_overhead_us): "
                     "mode='kernel' gives a single kernel's own duration")
    if gpu.profiled_before():
        notes.append(gpu.PROFILED_NOTE)
    return summarize(samples, name=name, device=torch.cuda.get_device_name(), mode="graph" if graph else "events",
                     clocks=clocks, throttled=is_throttled, flush_l2=flush_l2, flush=flush_done, rotate=rotate,
                     calls_per_sample=calls_per_sample, shared_gpu=is_shared, gpu_sharing=others, notes=notes)
