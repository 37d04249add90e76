"""What a Measurement records and how it reads (issue 14 items 1, 3 and 8): which clock timed the call,
what was done to L2, whether the timing can be trusted, and a speedup printed with enough digits."""

import numpy as np
import pytest

from gpuspeed.errors import UserError
from gpuspeed.stats import Comparison, Measurement, format_speedup, summarize
from gpuspeed.timing import choose_clock
from gpuspeed.timing.cuda import flush_record


def _never():
    raise AssertionError("the call must not be probed here")


def test_host_data_in_and_out_with_a_gpu_present_is_timed_with_device_syncs():
    x = np.ones(8)
    # a launcher that writes a GPU buffer and returns None: the old rule timed it on the bare host clock
    assert choose_clock("auto", "auto", True, ((x,), {}), lambda: None) == ("cpu", True)
    assert choose_clock("auto", "auto", True, ((x,), {}), lambda: x * 2) == ("cpu", True)
    # an explicit host clock with a GPU present synchronizes too
    assert choose_clock("auto", "cpu", True, ((x,), {}), _never) == ("cpu", True)
    assert choose_clock("cuda", "cpu", True, ((x,), {}), _never) == ("cpu", True)


def test_gpu_data_out_or_no_host_arrays_goes_to_the_gpu_modes():
    class FakeCuda:  # stands in for a GPU array's type only (is_gpu_array reads the module and is_cuda)
        __module__ = "torch"
        is_cuda = True
        shape = (1,)

    x = np.ones(8)
    assert choose_clock("auto", "auto", True, ((x,), {}), lambda: FakeCuda()) == ("cuda", False)
    assert choose_clock("auto", "auto", True, ((), {}), _never) == ("cuda", False)  # a closure
    assert choose_clock("auto", "events", True, ((x,), {}), _never) == ("cuda", False)  # asked for
    assert choose_clock("cuda", "auto", True, ((x,), {}), _never) == ("cuda", False)


def test_no_gpu_or_device_cpu_is_the_bare_host_clock():
    x = np.ones(8)
    assert choose_clock("cpu", "auto", True, ((x,), {}), _never) == ("cpu", False)
    assert choose_clock("auto", "auto", False, ((x,), {}), _never) == ("cpu", False)
    for mode in ("events", "graph", "kernel"):
        with pytest.raises(UserError, match="needs a CUDA device"):
            choose_clock("cpu", mode, True, ((x,), {}), _never)


def test_flush_record_says_graph_mode_flushes_once_per_replay():
    assert flush_record(True, graph=False) == (True, "per-call")
    assert flush_record(True, graph=True) == (False, "per-replay")
    assert flush_record(False, graph=True) == (False, "none")
    assert flush_record(lambda: None, graph=False) == (False, "custom per-call")
    assert flush_record(lambda: None, graph=True) == (False, "custom per-replay")


def test_old_records_still_read():
    old = {"name": "f", "median": 1e-3, "mean": 1e-3, "min": 1e-3, "max": 1e-3, "iqr": 0.0, "p10": 1e-3,
           "p90": 1e-3, "n": 10, "rel_noise": 0.001, "samples": [1e-3] * 10, "device": "x", "mode": "graph",
           "flush_l2": True, "rel_iqr": 0.0, "some_future_key": 1}
    m = Measurement.from_dict(old)
    assert m.flush == "" and m.unreliable is False and m.device_sync is False
    d = summarize([1.0, 1.01, 0.99] * 5, name="x", device="cpu", mode="cpu").to_dict()
    assert {"flush", "device_sync", "unreliable"} <= d.keys()


def test_noisy_measurement_is_flagged_unreliable():
    rng = np.random.default_rng(0)
    m = summarize(1.0 + 0.5 * rng.standard_normal(12).clip(-1.8, 1.8), name="noisy", device="cpu", mode="cpu")
    assert m.rel_noise > 0.05
    assert m.unreliable and any(n.startswith("unreliable: the median is known only") for n in m.notes)
    assert "UNRELIABLE" in str(m) and m.to_dict()["unreliable"] is True


def test_bimodal_measurement_with_a_tight_median_is_flagged_unreliable():
    # the case: ±0.17 % on the median beside IQR/median 92 %
    rng = np.random.default_rng(1)
    x = np.concatenate([1.0 + 0.001 * rng.standard_normal(1100), 2.0 + 0.001 * rng.standard_normal(900)])
    m = summarize(x, name="two modes", device="cpu", mode="cpu")
    assert m.rel_noise < 0.05 and m.rel_iqr > 0.25
    assert m.unreliable and any("more than one level" in n for n in m.notes)


def test_steady_measurement_is_not_flagged():
    rng = np.random.default_rng(2)
    m = summarize(1.0 + 0.01 * rng.standard_normal(200), name="steady", device="cpu", mode="cpu")
    assert not m.unreliable and not any("unreliable" in n for n in m.notes)


def test_speedup_printed_with_the_digits_its_interval_needs():
    # "speedup 1.0x [95% CI 1.0-1.0]" read as faster on one run and slower on the next
    text = format_speedup(1.0032, 1.0011, 1.0054)
    assert text == "1.0032x [95% CI 1.0011, 1.0054]"
    lo, hi = text.split("[95% CI ")[1].rstrip("]").split(", ")
    assert lo != hi and float(lo) > 1
    assert format_speedup(2.0, 1.9, 2.1) == "2.000x [95% CI 1.900, 2.100]"
    assert format_speedup(1.00004, 0.99998, 1.00011) == "1.000040x [95% CI 0.999980, 1.000110]"


def test_comparison_prints_the_basis_of_its_verdict():
    same = Comparison(speedup=1.0032, ci_low=1.0011, ci_high=1.0054, verdict="same")
    assert str(same) == "1.0032x [95% CI 1.0011, 1.0054] (same: within 1% of 1)"
    assert "interval includes 1" in str(Comparison(1.002, 0.998, 1.006, "same"))
    assert "whole interval above 1" in str(Comparison(1.5, 1.4, 1.6, "faster"))
    assert "whole interval below 1" in str(Comparison(0.5, 0.45, 0.55, "slower"))
