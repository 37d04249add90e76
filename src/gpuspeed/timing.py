"""bench(): the one timing path of gpuspeed.

GPU mode times each sample with CUDA events on the current stream, flushes L2 between samples by
writing a buffer twice the L2 size, warms up until the time settles, and stops once the median is
known to `max_noise` (relative standard error). Calls under ~20 us are timed inside a CUDA graph
(K calls per replay) so launch latency does not swamp them. CPU mode uses `perf_counter` and the same
stopping rule. Every study in gpuspeed times through here.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from gpuspeed import device as _device
from gpuspeed.errors import UserError

# Events around one call carry a fixed ~3 us on an H200 (event timestamps and the kernel boundary);
# in a graph the boundary costs ~0.9 us. Calls whose events time is under 20 us (~17 us of work) are
# timed inside a CUDA graph, where that fixed cost is amortized.
GRAPH_MODE_BELOW_S = 20e-6
GRAPH_REPLAY_S = 5e-3  # work captured per graph replay in graph mode
EVENTS_FIXED_NOTE_BELOW_S = 300e-6  # under this, events mode's fixed cost per call is worth a note
THROTTLE_FRACTION = 0.90  # an SM clock under 90 % of max during the run marks it throttled
CAPPED_FRACTION = 0.10  # so does a heat cap acting for over 10 % of the sampling (a power cap: a note)
CLOCK_POLL_S = 0.005  # the SM clock is polled this often while the samples run
_Z95 = 1.959963984540054


@dataclass
class Measurement:
    """Timing of one function. All times in seconds."""

    name: str
    median: float
    mean: float
    min: float
    max: float
    iqr: float
    p10: float
    p90: float
    n: int
    rel_noise: float  # relative standard error of the median (what the stopping rule watches)
    samples: list[float]
    device: str
    mode: str  # "events", "graph", "kernel" or "cpu"
    # sm_max_mhz, sm_mhz_before/_after, sm_mhz_median_during/_min_during (polled while sampling),
    # power_/thermal_capped_fraction (share of the sampling a cap acted)
    clocks: dict = field(default_factory=dict)
    throttled: bool = False
    flush_l2: bool = True
    rotate: int = 0
    calls_per_sample: int = 1  # K in graph mode: each sample is one replay divided by K
    notes: list[str] = field(default_factory=list)

    @property
    def rel_iqr(self) -> float:
        return self.iqr / self.median if self.median > 0 else float("nan")

    @property
    def median_us(self) -> float:
        return self.median * 1e6

    @property
    def median_ms(self) -> float:
        return self.median * 1e3

    def to_dict(self) -> dict:
        d = asdict(self)
        d["rel_iqr"] = self.rel_iqr
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Measurement":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> "Measurement":
        return cls.from_dict(json.loads(text))

    def __str__(self) -> str:
        flag = " THROTTLED" if self.throttled else ""
        return (f"{self.name}: {format_time(self.median)} median, ±{100 * self.rel_noise:.2f}% "
                f"(IQR {100 * self.rel_iqr:.1f}%, n={self.n}, {self.mode}){flag}")


def format_time(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "nan"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3f} {unit}"
    return f"{seconds * 1e9:.1f} ns"


# ---------------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------------


def median_rel_error(samples) -> float:
    """Relative standard error of the median, distribution-free.

    The 95 % confidence interval of the median runs between the order statistics n/2 -+ 1.96 sqrt(n)/2;
    its half-width over 1.96 is the standard error. Robust to the long right tail of GPU timings.
    """
    x = np.sort(np.asarray(samples, dtype=np.float64))
    n = x.size
    if n < 3:
        return float("inf")
    half = _Z95 * math.sqrt(n) / 2
    lo = max(int(math.floor(n / 2 - half)), 0)
    hi = min(int(math.ceil(n / 2 + half)), n - 1)
    med = float(np.median(x))
    return float((x[hi] - x[lo]) / (2 * _Z95) / med) if med > 0 else float("inf")


def summarize(samples, *, name: str, device: str, mode: str, **extra) -> Measurement:
    """A Measurement from raw samples (seconds)."""
    x = np.asarray(samples, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no samples")
    q10, q25, q50, q75, q90 = np.percentile(x, [10, 25, 50, 75, 90])
    return Measurement(
        name=name, median=float(q50), mean=float(x.mean()), min=float(x.min()), max=float(x.max()),
        iqr=float(q75 - q25), p10=float(q10), p90=float(q90), n=int(x.size),
        rel_noise=median_rel_error(x), samples=[float(v) for v in x], device=device, mode=mode, **extra,
    )


@dataclass
class Comparison:
    speedup: float  # baseline.median / candidate.median: > 1 means the candidate is faster
    ci_low: float
    ci_high: float
    verdict: str  # "faster", "slower" or "same"

    def __str__(self) -> str:
        return f"{self.speedup:.3f}x [{self.ci_low:.3f}, {self.ci_high:.3f}] ({self.verdict})"


def compare(baseline: Measurement, candidate: Measurement, *, n_boot: int = 2000, confidence: float = 0.95,
            threshold: float = 0.01, seed: int = 0) -> Comparison:
    """Speedup of `candidate` over `baseline`, with a bootstrap confidence interval of the median ratio.

    The verdict is "faster" (or "slower") only when the whole interval lies on one side of 1 and the
    speedup itself is beyond `threshold` (1 % by default); otherwise "same".
    """
    a = np.asarray(baseline.samples, dtype=np.float64)
    b = np.asarray(candidate.samples, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        raise ValueError("compare() needs measurements with samples")
    rng = np.random.default_rng(seed)
    ma = np.median(a[rng.integers(0, a.size, (n_boot, a.size))], axis=1)
    mb = np.median(b[rng.integers(0, b.size, (n_boot, b.size))], axis=1)
    ratios = ma / mb
    alpha = (1 - confidence) / 2
    lo, hi = (float(v) for v in np.quantile(ratios, [alpha, 1 - alpha]))
    speedup = baseline.median / candidate.median
    if lo > 1 and speedup > 1 + threshold:
        verdict = "faster"
    elif hi < 1 and speedup < 1 / (1 + threshold):
        verdict = "slower"
    else:
        verdict = "same"
    return Comparison(speedup=float(speedup), ci_low=lo, ci_high=hi, verdict=verdict)


# ---------------------------------------------------------------------------------------------------
# Array helpers: what is on the GPU, how to clone and synchronize it
# ---------------------------------------------------------------------------------------------------


def _leaves(obj):
    if isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _leaves(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _leaves(o)
    else:
        yield obj


def _module_of(x) -> str:
    return type(x).__module__.split(".")[0]


def is_gpu_array(x) -> bool:
    mod = _module_of(x)
    if mod == "torch":
        return getattr(x, "is_cuda", False)
    if mod == "cupy":
        return True
    if mod in ("jax", "jaxlib"):
        try:
            return any(d.platform == "gpu" for d in x.devices())
        except Exception:
            return False
    return False


def has_gpu_data(obj) -> bool:
    return any(is_gpu_array(x) for x in _leaves(obj))


def has_torch_cuda(obj) -> bool:
    return any(_module_of(x) == "torch" and getattr(x, "is_cuda", False) for x in _leaves(obj))


def clone_tree(obj):
    """Deep copy of every array in a nested structure (torch, NumPy, CuPy, JAX); scalars kept."""
    if isinstance(obj, tuple):
        return tuple(clone_tree(o) for o in obj)
    if isinstance(obj, list):
        return [clone_tree(o) for o in obj]
    if isinstance(obj, dict):
        return {k: clone_tree(v) for k, v in obj.items()}
    mod = _module_of(obj)
    if mod == "torch" and hasattr(obj, "clone"):
        return obj.clone()
    if mod in ("numpy", "cupy") and hasattr(obj, "copy"):
        return obj.copy()
    if mod in ("jax", "jaxlib") and hasattr(obj, "copy"):
        return obj.copy()
    return obj


def block_until_ready(obj) -> None:
    """Wait for results that CUDA events on the torch stream would not see (JAX, CuPy side streams)."""
    for x in _leaves(obj):
        mod = _module_of(x)
        if mod in ("jax", "jaxlib") and hasattr(x, "block_until_ready"):
            x.block_until_ready()
        elif mod == "cupy":
            import cupy

            stream = cupy.cuda.get_current_stream()
            if stream.ptr != 0:
                stream.synchronize()


# ---------------------------------------------------------------------------------------------------
# CUDA graph primitive (graphs.capture() builds on this)
# ---------------------------------------------------------------------------------------------------


def record_graph(body: Callable[[], Any], *, warmup: int = 3, pool=None):
    """Warm `body` up on a side stream, then capture one call of it into a CUDA graph.

    Returns (graph, output of the captured call). Raises whatever capture raises (a host sync, a CPU
    tensor, a data-dependent shape); callers turn that into their own message.
    """
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            body()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph, pool=pool):
            out = body()
    except BaseException:
        # a failing body makes the context's capture_end raise before it restores the stream
        torch.cuda.set_stream(stream)
        _reset_generators_after_failed_capture()
        raise
    torch.cuda.synchronize()
    return graph, out


def _reset_generators_after_failed_capture() -> None:
    """A capture that fails midway never runs the RNG's capture epilogue, and every later random op
    then fails ("Offset increment outside graph capture"). Swap in a fresh state with the same seed
    and offset so the process stays usable."""
    import torch

    for gen in torch.cuda.default_generators:
        if not hasattr(gen, "graphsafe_get_state"):
            continue
        try:
            fresh = torch.Generator(device=gen.device)
            fresh.set_state(gen.get_state())
            gen.graphsafe_set_state(fresh.graphsafe_get_state())
        except Exception:
            pass


# ---------------------------------------------------------------------------------------------------
# bench()
# ---------------------------------------------------------------------------------------------------

_flush_buffers: dict = {}


def flush_l2() -> None:
    """Evict L2 by writing a buffer of twice its size (allocated once per device)."""
    import torch

    idx = torch.cuda.current_device()
    buf = _flush_buffers.get(idx)
    if buf is None:
        buf = torch.empty(2 * _device.l2_bytes(), dtype=torch.int8, device="cuda")
        _flush_buffers[idx] = buf
    buf.fill_(1)  # write (not read) so dirty lines leave L2 too


class _Stopper:
    """The adaptive stopping rule shared by every mode."""

    def __init__(self, max_noise, min_samples, max_samples, budget_s):
        if not (0 < max_noise < 1):
            raise UserError(f"max_noise must be in (0, 1), got {max_noise}")
        if min_samples < 3 or max_samples < min_samples:
            raise UserError("need 3 <= min_samples <= max_samples")
        if budget_s <= 0:
            raise UserError("budget_s must be positive")
        self.max_noise, self.min_samples, self.max_samples, self.budget_s = (
            max_noise, min_samples, max_samples, budget_s)
        self.t0 = time.perf_counter()
        self.reason = ""

    def done(self, samples) -> bool:
        n = len(samples)
        if n >= self.max_samples:
            self.reason = f"stopped at max_samples={self.max_samples}"
            return True
        if n >= self.min_samples and median_rel_error(samples) <= self.max_noise:
            self.reason = "noise target met"
            return True
        if time.perf_counter() - self.t0 > self.budget_s and n >= min(self.min_samples, 3):
            self.reason = f"time budget of {self.budget_s:g} s spent before the noise target"
            return True
        return False


def _settle(one: Callable[[], float], budget_s: float, window: int = 5, tol: float = 0.05):
    """Call `one()` (returns a time) until two successive windows' medians agree within `tol`."""
    t0 = time.perf_counter()
    times = [one()]  # the first call pays for compilation and allocation: never part of a window
    while True:
        times.append(one())
        if len(times) > 2 * window:
            prev = float(np.median(times[-2 * window:-window]))
            cur = float(np.median(times[-window:]))
            if prev > 0 and abs(cur - prev) / prev < tol:
                return cur, len(times), True
        if time.perf_counter() - t0 > budget_s:
            return float(np.median(times[-window:])), len(times), False


def bench(fn: Callable, *args, kwargs: dict | None = None, name: str | None = None, device: str = "auto",
          mode: str = "auto", flush: bool | Callable[[], Any] = True, rotate: int = 0, max_noise: float = 0.01,
          min_samples: int = 10, max_samples: int = 2000, budget_s: float = 2.0,
          warmup_s: float | None = None, graph_calls: int | None = None) -> Measurement:
    """Time `fn(*args, **kwargs)`.

    device: "auto" (the GPU when there is one, unless host arrays go in and host arrays come out),
        "cuda" or "cpu".
    mode: "auto" (events; graph when one call times under 20 us and is capturable), "events", "graph",
        or "kernel": the sum of the function's GPU kernel durations from CUPTI (torch.profiler), what
        Nsight reports -- no launch latency, no gaps; events add a fixed ~3 us per call on an H200.
    flush: write 2x L2 between samples (False: warm-cache timing; a callable: your own cache clear,
        e.g. to match another tool's, run between samples outside the timed window).
    rotate: N > 1 clones the arguments N times and cycles through them, so inputs are not L2-resident.
    max_noise / min_samples / max_samples / budget_s: stop once the relative standard error of the
    median is under max_noise with at least min_samples, or at max_samples, or when budget_s is spent.
    warmup_s: time allowed for the warm-up to settle (default: half the budget, at least 0.5 s).
    graph_calls: K calls captured per graph replay in graph mode (default: about 5 ms of work, 10 to 1000).
    """
    kwargs = kwargs or {}
    if not callable(fn):
        raise UserError(f"bench() needs a callable, got {type(fn).__name__}")
    if mode not in ("auto", "events", "graph", "kernel", "cpu"):
        raise UserError(f"unknown mode {mode!r}: use auto, events, graph, kernel or cpu")
    if rotate < 0:
        raise UserError("rotate must be >= 0")
    name = name or getattr(fn, "__name__", "fn")
    stopper = _Stopper(max_noise, min_samples, max_samples, budget_s)
    warmup_s = max(0.5, budget_s / 2) if warmup_s is None else warmup_s
    argsets = [(args, kwargs)] + [clone_tree((args, kwargs)) for _ in range(max(rotate, 1) - 1)]

    where = "cpu" if mode == "cpu" else _device.resolve_device(device)
    host_arrays = [x for x in _leaves((args, kwargs)) if hasattr(x, "shape") and not is_gpu_array(x)]
    if where == "cuda" and device == "auto" and host_arrays and not has_gpu_data((args, kwargs)):
        # host arrays in, host arrays out: a CPU function (a closure over GPU data has no such arguments,
        # and a function returning nothing may have launched GPU work, so both stay on the GPU path)
        out = fn(*args, **kwargs)
        block_until_ready(out)
        if not has_gpu_data(out):
            where = "cpu"
    if where == "cpu":
        if mode in ("graph", "kernel"):
            raise UserError(f"{mode} mode needs a CUDA device")
        return _bench_cpu(fn, argsets, name, stopper, warmup_s, rotate)
    if mode == "kernel":
        if callable(flush):
            raise UserError("kernel mode takes flush=True or False (its own flush marks the calls apart)")
        return _bench_kernels(fn, argsets, name, stopper, warmup_s, flush, rotate)
    return _bench_cuda(fn, argsets, name, stopper, warmup_s, mode, flush, rotate, graph_calls)


def _bench_cpu(fn, argsets, name, stopper, warmup_s, rotate) -> Measurement:
    i = 0

    def one() -> float:
        nonlocal i
        a, kw = argsets[i % len(argsets)]
        i += 1
        t = time.perf_counter()
        block_until_ready(fn(*a, **kw))
        return time.perf_counter() - t

    _, n_warm, settled = _settle(one, warmup_s)
    samples: list[float] = []
    while not stopper.done(samples):
        samples.append(one())
    notes = [stopper.reason, f"warm-up: {n_warm} calls" + ("" if settled else ", did not settle")]
    return summarize(samples, name=name, device=_device.get_device("cpu").name, mode="cpu",
                     flush_l2=False, rotate=rotate, notes=notes)


PRELAUNCH_HOLD_S = 50e-6
BATCH_S = 0.025  # GPU work between two synchronizes while sampling
SETTLE_BATCH_MAX_S = 0.05  # one unread batch before sampling when a batch is at most this long
_spin_rate: dict = {}


def hold_gpu(seconds: float) -> None:
    """Keep the current stream busy for about `seconds` (a spin kernel), so later launches queue up."""
    import torch

    if not hasattr(torch.cuda, "_sleep"):
        return
    idx = torch.cuda.current_device()
    if idx not in _spin_rate:  # SM cycles per second of the spin kernel, measured once with events
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        torch.cuda.synchronize()
        _spin_rate[idx] = 10_000_000 / (start.elapsed_time(end) * 1e-3)
    torch.cuda._sleep(int(seconds * _spin_rate[idx]))


class _ClockWatch:
    """The SM clock before, during (polled from a background thread) and after sampling, and how long a
    power or heat cap acted in between (NVML's violation counters)."""

    def __init__(self):
        self.clocks = {"sm_max_mhz": _device.read_clocks().get("sm_max_mhz"), "sm_mhz_before": _device.sm_clock_mhz()}
        self._capped = _device.capped_ns()
        self._readings: list[int] = []
        self._done = threading.Event()
        self._thread = None
        if self.clocks["sm_mhz_before"]:  # NVML answers: poll it while the samples run
            self._thread = threading.Thread(target=self._poll, name="gpuspeed-clock-poll", daemon=True)
            self._thread.start()
        self._t0 = time.perf_counter()

    def _poll(self) -> None:
        while not self._done.wait(CLOCK_POLL_S):
            mhz = _device.sm_clock_mhz()
            if mhz:
                self._readings.append(mhz)

    def stop(self) -> dict:
        wall = time.perf_counter() - self._t0
        if self._thread is not None:
            self._done.set()
            self._thread.join()
        self.clocks["sm_mhz_after"] = _device.sm_clock_mhz()
        if self._readings:
            self.clocks["sm_mhz_median_during"] = int(np.median(self._readings))
            self.clocks["sm_mhz_min_during"] = int(min(self._readings))
            self.clocks["clock_readings"] = len(self._readings)
        capped = _device.capped_ns()
        for key in sorted(self._capped.keys() & capped.keys()):
            acted = (capped[key] - self._capped[key]) * 1e-9
            self.clocks[f"{key}_capped_fraction"] = min(1.0, max(0.0, acted / wall)) if wall > 0 else 0.0
        return self.clocks


def _throttled(clocks: dict, notes: list[str]) -> bool:
    """Flag a run whose SM clock fell under 90 % of its max: read before and after sampling, and as the
    median of the readings polled during it. A heat cap acting for over 10 % of the sampling flags it
    too. A power cap adds a note: NVML's clock reading does not follow every dip it causes."""
    seen = [c for c in (clocks.get("sm_mhz_before"), clocks.get("sm_mhz_median_during"),
                        clocks.get("sm_mhz_after")) if c]
    if not seen:
        notes.append("SM clock not read (no NVML): throttling not checked")
        return False
    throttled = bool(clocks.get("sm_max_mhz") and min(seen) < THROTTLE_FRACTION * clocks["sm_max_mhz"])
    if throttled:
        during = " (median while sampling)" if min(seen) == clocks.get("sm_mhz_median_during") else ""
        notes.append(f"SM clock fell to {min(seen)} MHz{during}, under {THROTTLE_FRACTION:.0%} of max "
                     f"{clocks['sm_max_mhz']} MHz")
    thermal = clocks.get("thermal_capped_fraction") or 0.0
    if thermal > CAPPED_FRACTION:
        throttled = True
        notes.append(f"the thermal cap held the clocks down for {thermal:.0%} of the sampling (NVML)")
    power = clocks.get("power_capped_fraction") or 0.0
    if power > CAPPED_FRACTION:
        notes.append(f"power-bound: the power cap acted for {power:.0%} of the sampling (NVML), so the result "
                     "moves with what ran just before it")
    return throttled


def _event_pairs(n: int) -> list:
    import torch

    return [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]


def _queue(enqueue: Callable, events: list) -> None:
    for start, end in events:
        enqueue(start, end)


def _elapsed(events: list, k: int = 1) -> list[float]:
    """Per-call seconds of queued (start, end) pairs, once the last one has completed."""
    events[-1][1].synchronize()
    return [s.elapsed_time(e) * 1e-3 / k for s, e in events]


def _sample_batches(enqueue: Callable, batch: int, stopper: "_Stopper", k: int = 1,
                    settle_batch: bool = False) -> list[float]:
    """Per-call seconds from batches of `batch` (start, end) event pairs, two batches in flight.

    `enqueue(start, end)` queues one sample. The loop queues batch i+1, then waits for batch i and reads
    it; it stops when the stopper is satisfied, keeping the batch still in flight (every sample counts).
    """
    import torch

    pools = [_event_pairs(batch), _event_pairs(batch)]
    samples: list[float] = []
    _queue(enqueue, pools[0])
    i = 0
    if settle_batch:  # one batch unread: sampling starts in the power state of sustained use
        _queue(enqueue, pools[1])
        _elapsed(pools[0])
        i = 1
    while True:
        _queue(enqueue, pools[(i + 1) % 2])
        samples += _elapsed(pools[i % 2], k)
        i += 1
        if stopper.done(samples):
            break
    samples += _elapsed(pools[i % 2], k)
    torch.cuda.synchronize()
    return samples[:stopper.max_samples]


def _queued_median(enqueue: Callable, n: int) -> float:
    """Median seconds of `n` samples queued back to back (one synchronize at the end), as bench samples."""
    events = _event_pairs(n)
    _queue(enqueue, events)
    return float(np.median(_elapsed(events)))


def _bench_cuda(fn, argsets, name, stopper, warmup_s, mode, flush, rotate, graph_calls) -> Measurement:
    import torch

    i = 0

    # The GPU is busy for ~30-50 us before each start event -- with the L2 flush, or with a spin when the
    # flush is off -- so the call's first launches are queued by the time the event fires (as in
    # triton's do_bench). A call whose launches take longer than that is host-bound and pays for it.
    def enqueue(start, end, body):
        if callable(flush):
            flush()
        elif flush:
            flush_l2()
        else:
            hold_gpu(PRELAUNCH_HOLD_S)
        start.record()
        out = body()
        block_until_ready(out)
        end.record()

    def call():
        nonlocal i
        a, kw = argsets[i % len(argsets)]
        i += 1
        return fn(*a, **kw)

    warm_events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))

    def one() -> float:
        enqueue(*warm_events, call)
        torch.cuda.synchronize()
        return warm_events[0].elapsed_time(warm_events[1]) * 1e-3

    def one_queued(start, end) -> None:
        enqueue(start, end, call)

    notes: list[str] = []
    typical, n_warm, settled = _settle(one, warmup_s)
    notes.append(f"warm-up: {n_warm} calls" + ("" if settled else ", did not settle"))
    # The warm-up synchronizes after every call, and on an H200 a tiny call then timed 16-19 us against
    # ~3.4 us once samples queue back to back: the choice of graph mode and K is made on a few samples
    # taken the way the real ones will be (never raising it above the warm-up's figure).
    if mode == "graph" or (mode == "auto" and typical < 5 * GRAPH_MODE_BELOW_S):
        typical = min(typical, _queued_median(one_queued, 10))

    use_graph = mode == "graph" or (mode == "auto" and typical < GRAPH_MODE_BELOW_S)
    graph = None
    k = 1
    if use_graph:
        # ~5 ms of calls per replay: a replay's own start (graph launch, the first kernel after the flush:
        # ~9 us on an H200) is then under 0.2 % of it
        k = graph_calls or int(min(1000, max(10, GRAPH_REPLAY_S / max(typical, 1e-7))))
        try:
            def body():
                for j in range(k):
                    a, kw = argsets[j % len(argsets)]
                    fn(*a, **kw)
            graph, _ = record_graph(body)
        except Exception as exc:
            if mode == "graph":
                raise UserError(f"graph mode: capture failed: {type(exc).__name__}: "
                                f"{str(exc).splitlines()[0]}") from exc
            notes.append(f"graph capture failed ({type(exc).__name__}); timed with events instead")
            graph, k = None, 1

    watch = _ClockWatch()
    # Samples go out in batches of ~BATCH_S of GPU work, double-buffered: the next batch is queued before
    # the host waits on the last one, so the GPU never idles between batches, as under a loop calling
    # the function. Clocks and power then settle where sustained use puts them (the throttle check sees
    # it; triton's do_bench queues all its samples at once too) instead of recovering in sync pauses.
    per_sample = typical * k
    batch = int(min(1000, max(3, math.ceil(BATCH_S / max(per_sample, 1e-6)))))
    body = graph.replay if graph is not None else call
    samples = _sample_batches(lambda start, end: enqueue(start, end, body), batch, stopper, k,
                              settle_batch=per_sample * batch <= SETTLE_BATCH_MAX_S)
    clocks = watch.stop()
    notes.insert(0, stopper.reason)
    throttled = _throttled(clocks, notes)
    if graph is not None:
        notes.append(f"graph mode: {k} calls per replay, time divided by {k}")
    elif float(np.median(samples)) < EVENTS_FIXED_NOTE_BELOW_S:
        notes.append("events mode carries a fixed ~3 us per call on an H200 (the event timestamps and the launch after "
                     "the start event; benchmarks/bench_accuracy.py measures it): mode='kernel' gives a single "
                     "kernel's own duration")
    return summarize(samples, name=name, device=torch.cuda.get_device_name(), mode="graph" if graph else "events",
                     clocks=clocks, throttled=throttled, flush_l2=bool(flush), rotate=rotate, calls_per_sample=k,
                     notes=notes)


_MARK = "FillFunctor<signed char>"  # the int8 fill of the L2 flush (or of a 1-byte marker) between calls
_marker: dict = {}


def _device_activities(prof) -> list:
    """Device-side events of a profiler session (kernels, memcpy, memset), in start order."""
    acts = [e for e in prof.events()
            if not str(e.device_type).endswith("CPU") and not getattr(e, "is_user_annotation", False)]
    return sorted(acts, key=lambda e: e.time_range.start)


def _split_at_markers(acts, n_calls: int) -> list[float] | None:
    """Per-call device seconds: the activities between consecutive markers; None if the markers don't
    come out as exactly one per call (the user's own code launched an int8 fill)."""
    marks = [i for i, e in enumerate(acts) if _MARK in e.name or "FillFunctor<char>" in e.name]
    if len(marks) != n_calls:
        return None
    bounds = marks + [len(acts)]
    return [sum(e.time_range.elapsed_us() for e in acts[bounds[j] + 1:bounds[j + 1]]) * 1e-6
            for j in range(n_calls)]


def _bench_kernels(fn, argsets, name, stopper, warmup_s, flush, rotate) -> Measurement:
    """Kernel mode: each sample is the summed duration of the GPU work one call launched, from CUPTI.

    Ten calls share a profiler session, separated by the L2 flush (or a 1-byte int8 fill): the device
    activities between two markers are one call's. If the call itself launches an int8 fill, the
    markers are ambiguous and each sample gets a session of its own (slower, same answer).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    i = 0

    def call():
        nonlocal i
        a, kw = argsets[i % len(argsets)]
        i += 1
        block_until_ready(fn(*a, **kw))

    def mark():
        if flush:
            flush_l2()
        else:
            idx = torch.cuda.current_device()
            if idx not in _marker:
                _marker[idx] = torch.empty(1, dtype=torch.int8, device="cuda")
            _marker[idx].fill_(1)

    t0 = time.perf_counter()
    n_warm = 0
    while True:  # warm-up: compile, allocate, wake the clocks
        call()
        torch.cuda.synchronize()
        n_warm += 1
        if time.perf_counter() - t0 > min(warmup_s, 0.5):
            break
    samples: list[float] = []
    # a profiler session costs tens of ms to start and read: give each ~50 ms of calls (10 to 100 of them)
    per_call_s = (time.perf_counter() - t0) / n_warm
    per_session = int(min(100, max(10, 0.05 / max(per_call_s, 1e-6))))
    watch = _ClockWatch()
    while not stopper.done(samples):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(per_session):
                mark()
                call()
            torch.cuda.synchronize()
        acts = _device_activities(prof)
        got = _split_at_markers(acts, per_session)
        if got is None:
            if per_session == 1:  # one call, one session: everything after the marker is the call's
                got = [sum(e.time_range.elapsed_us() for e in acts[1:]) * 1e-6]
            else:
                per_session = 1
                continue
        if not any(t > 0 for t in got):
            raise UserError("kernel mode: the profiler saw no GPU work for this function")
        samples.extend(got)
    clocks = watch.stop()
    notes = [stopper.reason, "kernel mode: summed device activity durations (CUPTI); excludes launch latency "
             "and gaps between kernels"]
    throttled = _throttled(clocks, notes)
    return summarize(samples, name=name, device=torch.cuda.get_device_name(), mode="kernel", clocks=clocks,
                     throttled=throttled, flush_l2=flush, rotate=rotate, notes=notes)
