"""bench(), Measurement, compare() and the statistics behind them, on the CPU."""

import json
import time

import numpy as np
import pytest

from gpuspeed import clocks, timing
from gpuspeed.errors import UserError
from gpuspeed.timing import Measurement, bench, compare, median_rel_error, summarize


def test_sleep_10ms_timed_within_5_percent():
    m = bench(time.sleep, 0.010, device="cpu", max_noise=0.01, budget_s=3.0)
    assert m.mode == "cpu"
    assert abs(m.median - 0.010) / 0.010 < 0.05, m
    assert m.n >= 10


def test_stopping_rule_honoured_noise_target():
    m = bench(time.sleep, 0.001, device="cpu", max_noise=0.05, min_samples=10, budget_s=5.0)
    assert m.n >= 10
    assert m.rel_noise <= 0.05
    assert "noise target met" in m.notes[0]


def test_stopping_rule_honoured_max_samples_and_budget():
    m = bench(lambda: None, device="cpu", max_noise=1e-9, min_samples=5, max_samples=50, budget_s=10)
    assert m.n == 50 and "max_samples" in m.notes[0]
    t0 = time.perf_counter()
    m = bench(time.sleep, 0.002, device="cpu", max_noise=1e-9, min_samples=5, max_samples=10**6,
              budget_s=0.3, warmup_s=0.05)
    assert time.perf_counter() - t0 < 2.0
    assert "time budget" in m.notes[0] and m.n >= 5


def test_numpy_function_and_rotation_cycles_clones():
    seen = []

    def f(a):
        seen.append(id(a))
        return a.sum()

    x = np.random.default_rng(0).standard_normal(1000)
    bench(f, x, device="cpu", rotate=3, min_samples=10, max_samples=12, budget_s=1)
    assert len(set(seen)) == 3  # the original and two clones, cycled


def test_kwargs_and_name():
    seen = []

    def f(a, b=0):
        seen.append((a, b))
        time.sleep(b)

    m = bench(f, 1, kwargs={"b": 0.002}, device="cpu", name="sleeper", max_samples=20, min_samples=5)
    assert m.name == "sleeper"
    assert seen and set(seen) == {(1, 0.002)}  # every call, warm-up included, got the keyword
    assert m.median >= 0.002


def test_median_rel_error_shrinks_with_n():
    rng = np.random.default_rng(1)
    small = median_rel_error(1 + 0.1 * rng.standard_normal(20))
    large = median_rel_error(1 + 0.1 * rng.standard_normal(2000))
    assert large < small
    # for normal data, SE(median) ~ 1.2533 sigma / sqrt(n)
    assert large == pytest.approx(1.2533 * 0.1 / np.sqrt(2000), rel=0.25)
    assert median_rel_error([1.0, 2.0]) == float("inf")


def test_summarize_statistics():
    m = summarize([1.0, 2.0, 3.0, 4.0, 5.0], name="x", device="cpu", mode="cpu")
    assert (m.median, m.mean, m.min, m.max, m.n) == (3.0, 3.0, 1.0, 5.0, 5)
    assert m.iqr == pytest.approx(2.0)
    assert m.p10 == pytest.approx(1.4) and m.p90 == pytest.approx(4.6)


def test_measurement_json_round_trip():
    m = bench(lambda: sum(range(100)), device="cpu", max_samples=20, min_samples=5)
    back = Measurement.from_json(m.to_json())
    assert back == m
    d = json.loads(m.to_json())
    assert d["rel_iqr"] == pytest.approx(m.rel_iqr)
    assert "median" in str(m)


def test_compare_verdicts():
    rng = np.random.default_rng(2)
    a = summarize(1.0 + 0.01 * rng.standard_normal(200), name="a", device="cpu", mode="cpu")
    b = summarize(0.5 + 0.005 * rng.standard_normal(200), name="b", device="cpu", mode="cpu")
    c = summarize(1.0 + 0.01 * rng.standard_normal(200), name="c", device="cpu", mode="cpu")
    fast = compare(a, b)
    assert fast.verdict == "faster" and fast.speedup == pytest.approx(2.0, rel=0.02)
    assert fast.ci_low < fast.speedup < fast.ci_high
    assert compare(b, a).verdict == "slower"
    assert compare(a, c).verdict == "same"


def test_bad_options_are_user_errors():
    with pytest.raises(UserError):
        bench(42)
    with pytest.raises(UserError):
        bench(lambda: None, mode="bogus")
    with pytest.raises(UserError):
        bench(lambda: None, device="tpu")
    with pytest.raises(UserError):
        bench(lambda: None, device="cpu", max_noise=0)
    with pytest.raises(UserError):
        bench(lambda: None, device="cpu", min_samples=1)
    with pytest.raises(UserError):
        bench(lambda: None, device="cpu", rotate=-1)
    with pytest.raises(UserError):
        bench(lambda: None, device="cpu", mode="graph")


def test_clone_tree_copies_arrays_keeps_scalars():
    import torch

    x, t = np.ones(3), torch.ones(3)
    tree = {"a": [x, 2], "b": (t, "s")}
    c = timing.clone_tree(tree)
    assert c["a"][0] is not x and np.array_equal(c["a"][0], x)
    assert c["b"][0] is not t and torch.equal(c["b"][0], t)
    assert c["a"][1] == 2 and c["b"][1] == "s"


def test_format_time():
    assert timing.format_time(1.5) == "1.500 s"
    assert timing.format_time(2e-3) == "2.000 ms"
    assert timing.format_time(3e-6) == "3.000 us"
    assert timing.format_time(5e-9) == "5.0 ns"


def test_cuda_device_without_gpu_is_a_user_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    with pytest.raises(UserError, match="no CUDA device"):
        bench(lambda: None, device="cuda")


def test_kernel_mode_splits_device_activity_at_markers():
    from types import SimpleNamespace as NS

    from gpuspeed.timing import kernel

    def act(name, start, dur):
        return NS(name=name, time_range=NS(start=start, elapsed_us=lambda d=dur: d))

    mark = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<signed char>>"
    # the session opens with a mark and no call; no flush here (flush=False: a marker only)
    acts = [act(mark, 0, 1), act(mark, 2, 1), act("gemm", 31, 100), act("epilogue", 132, 5),
            act(mark, 140, 1), act("gemm", 171, 102)]
    assert kernel.split_at_markers(acts, 2) == pytest.approx([105e-6, 102e-6])
    assert kernel.split_at_markers(acts, 3) is None  # the user's own int8 fill would look like this
    # each marker followed by the L2 flush's own kernels (two here): counted in the opening span, no call's time
    flushed = [act(mark, 0, 1), act("reduce", 2, 30), act("reduce_tail", 33, 2),
               act(mark, 40, 1), act("reduce", 42, 30), act("reduce_tail", 73, 2), act("gemm", 76, 100),
               act(mark, 180, 1), act("reduce", 182, 30), act("reduce_tail", 213, 2), act("gemm", 216, 102),
               act("epilogue", 320, 5)]
    assert kernel.split_at_markers(flushed, 2) == pytest.approx([100e-6, 107e-6])
    # a one-call session whose call launches its own int8 fill: everything after the flush is the call's
    own_fill = flushed[:7] + [act(mark, 177, 3), act("gemm2", 181, 10)]
    assert kernel.split_at_markers(own_fill, 1) is None
    assert kernel.first_call_after_marks(own_fill) == pytest.approx(113e-6)


def test_throttle_flag_under_90_percent_of_max_clock():
    notes = []
    assert clocks.throttled({"sm_max_mhz": 1980, "sm_mhz_before": 1700, "sm_mhz_after": 1980}, notes)
    assert "1700 MHz" in notes[0]
    assert not clocks.throttled({"sm_max_mhz": 1980, "sm_mhz_before": 1900, "sm_mhz_after": 1785}, [])
    notes = []
    assert not clocks.throttled({}, notes) and "not read" in notes[0]


def test_throttle_flag_from_the_clock_polled_during_sampling_and_the_caps():
    # a power cap that acts only while the work runs: before and after read max, the median during does not
    full = {"sm_max_mhz": 1980, "sm_mhz_before": 1980, "sm_mhz_after": 1980}
    notes = []
    assert clocks.throttled(full | {"sm_mhz_median_during": 1600, "power_capped_fraction": 0.42}, notes)
    assert notes == ["SM clock fell to 1600 MHz (median while sampling), under 90% of max 1980 MHz",
                     "power-bound: the power cap acted for 42% of the sampling (NVML), so the result moves "
                     "with what ran just before it"]
    notes = []
    assert not clocks.throttled(full | {"sm_mhz_median_during": 1900, "power_capped_fraction": 0.42}, notes)
    assert len(notes) == 1 and notes[0].startswith("power-bound")
    assert not clocks.throttled(full | {"power_capped_fraction": 0.05}, [])
    assert clocks.throttled(full | {"thermal_capped_fraction": 0.5}, [])


def test_clock_watch_reports_the_share_of_time_a_cap_acted(monkeypatch):
    counters = iter([{"power": 0, "thermal": 7}, {"power": 30_000_000, "thermal": 7}])
    times = iter([100.0, 100.1])
    monkeypatch.setattr(clocks._device, "capped_ns", lambda *_: next(counters))
    monkeypatch.setattr(clocks._device, "read_clocks", lambda *_: {"sm_max_mhz": 1980})
    monkeypatch.setattr(clocks._device, "sm_clock_mhz", lambda *_: 1980)
    monkeypatch.setattr(clocks.time, "perf_counter", lambda: next(times))
    watch = clocks.ClockWatch()
    deadline = time.monotonic() + 5
    while not watch._readings and time.monotonic() < deadline:  # the poller reads the (mocked) clock
        time.sleep(0.01)
    read = watch.stop()
    assert read["power_capped_fraction"] == pytest.approx(0.3)
    assert read["thermal_capped_fraction"] == 0.0
    assert read["sm_mhz_median_during"] == 1980 and read["clock_readings"] >= 1
    assert not watch._thread.is_alive()


def test_prelaunch_hold_covers_the_launcher_only_when_asked():
    from gpuspeed.timing.cuda import MAX_HOLD_S, PRELAUNCH_HOLD_S, prelaunch_hold

    assert prelaunch_hold(True, False, 300e-6) == 0.0  # the flush is the GPU work ahead: a slow launcher pays
    assert prelaunch_hold(False, False, 300e-6) == PRELAUNCH_HOLD_S
    assert prelaunch_hold(True, True, 10e-6) == PRELAUNCH_HOLD_S  # never under the plain hold
    assert prelaunch_hold(True, True, 300e-6) == pytest.approx(450e-6)  # 1.5x the host's time to issue a call
    assert prelaunch_hold(False, True, 5e-3) == MAX_HOLD_S  # a host-bound loop stays host-bound past 1 ms


def test_cpu_timing_does_not_walk_a_large_result_nor_time_its_own_loop():
    """A call returning a big list costs what the call costs (not a walk of its leaves), and a call under 20 us
    is timed in batches: ns-scale functions read ns, not the clock's microsecond."""
    big = list(range(1_000_000))
    m = bench(lambda: big, device="cpu", budget_s=0.5)
    assert m.median < 20e-6, m
    m = bench(lambda: None, device="cpu", budget_s=0.5)
    assert m.median < 1e-6, m
    assert any("back-to-back calls" in n for n in m.notes)
    slow = bench(time.sleep, 0.001, device="cpu", budget_s=0.5)
    assert not any("back-to-back" in n for n in slow.notes)  # one call a sample when the clock is no concern


@pytest.mark.parametrize("bad", [dict(rotate=2.5), dict(budget_s=float("nan")), dict(rotate=-1)])
def test_bad_bench_options_are_user_errors(bad):
    with pytest.raises(UserError):
        bench(lambda: None, device="cpu", **bad)
