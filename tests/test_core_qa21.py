"""QA round 21, core: a demanding user's pass over the public API (check, bench, peak_memory, roofline.place,
graphs.capture) on the CPU."""

from __future__ import annotations

import re

import numpy as np
import pytest

from gpuspeed import check
from gpuspeed.errors import UserError


def _cpu_ceilings():
    from gpuspeed.roofline.ceilings import Ceiling, Ceilings

    return Ceilings("cpu", "test", [Ceiling("copy", "memory", 20.0), Ceiling("fp32", "compute", 0.5),
                                    Ceiling("fp64", "compute", 0.25)])


# -- check(): a failure's numbers read apart from the bound they broke ---------------------------------------------


def _number_after(label: str, text: str) -> float:
    return float(re.search(re.escape(label) + r" ([-+0-9.e]+)", text).group(1))


def test_check_failing_on_rel_l2_alone_prints_it_above_rtol():
    # one float32 number 1.0013e-5 off: within the elementwise bound, just past rel L2 <= rtol
    r = check(np.float32(1.0), np.float32(1.00001))
    assert not r.passed
    assert _number_after("rel L2", r.summary) > _number_after("> rtol", r.summary), r.summary


def test_check_failing_just_past_atol_prints_max_abs_above_it():
    x = np.random.default_rng(0).standard_normal(5)
    r = check(x, x + 1.00001e-5, rtol=0, atol=1e-5)
    assert not r.passed and r.n_over_tol == 5
    assert _number_after("max abs", r.summary) > _number_after("atol", r.summary), r.summary
    # far apart, three digits as before
    r = check(x, x + 1, rtol=0, atol=1e-5)
    assert "(atol 1e-05, rtol 0); max abs 1," in r.summary


@pytest.mark.parametrize("n", [7, 70_000])  # one pass, and a chunk at a time
def test_check_of_integers_names_the_element_furthest_off(n):
    import torch

    rng = np.random.default_rng(4)
    ref = rng.integers(-50, 50, n)
    out = ref.copy()
    out[1] += 1  # the first mismatch, off by 1
    out[n - 2] -= 1000  # the worst, off by 1000: 'worst at (1,)' pointed at the other
    for got, want in ((out, ref), (torch.from_numpy(out).int(), torch.from_numpy(ref).int())):
        r = check(got, want)
        assert not r.passed and r.n_over_tol == 2 and r.max_abs_err == 1000
        assert r.worst_index == (n - 2,) and f"worst at ({n - 2},)" in r.summary, r.summary


# -- place(): bench options are checked before the call is counted and the ceilings measured -----------------------


@pytest.mark.parametrize(("options", "said"), [
    ({"budge_s": 0.1}, "did you mean budget_s"),
    ({"budget_s": -1}, "budget_s must be a positive"),
    ({"mode": "gpu"}, "unknown mode 'gpu'"),
    ({"min_samples": 1}, "min_samples"),
    ({"rotate": 1.5}, "rotate must be a whole number"),
])
def test_place_refuses_a_bad_bench_option_before_any_work(options, said):
    import torch

    from gpuspeed.roofline import place

    calls = []

    def add(a, b):
        calls.append(1)
        return a + b

    x = torch.randn(64)
    with pytest.raises(UserError, match=said):
        place(add, x, x, flops=64, **options)  # no ceilings=: they would be measured first (~10 s on the CPU)
    assert calls == []


def test_place_graph_mode_on_the_cpu_is_refused_before_any_work():
    import torch

    from gpuspeed.device import cuda_available
    from gpuspeed.roofline import place

    if cuda_available():
        pytest.skip("graph mode is fine with a GPU")
    calls = []
    x = torch.randn(64)
    with pytest.raises(UserError, match="graph mode needs a CUDA device"):
        place(lambda a: calls.append(1) or a * 2, x, flops=64, mode="graph")
    assert calls == []


def test_place_takes_flops_summed_on_a_tensor_and_keeps_a_huge_count_short():
    import torch

    from gpuspeed.roofline import place

    x = torch.randn(256)
    flops = (x != 0).sum() * 2  # a 0-d tensor, as a count summed on the data is
    p = place(torch.add, x, x, flops=flops, ceilings=_cpu_ceilings(), budget_s=0.05, min_samples=3)
    assert p.flops == 2 * int((x != 0).sum()) and p.flops_source == "given"
    p = place(torch.add, x, x, flops=np.array(512), bytes=np.array(3072), ceilings=_cpu_ceilings(), budget_s=0.05,
              min_samples=3)
    assert (p.flops, p.bytes) == (512, 3072)
    with pytest.raises(UserError, match="an int of 401 digits") as err:
        place(torch.add, x, x, flops=10**400, ceilings=_cpu_ceilings())
    assert len(str(err.value)) < 120
    with pytest.raises(UserError, match=r"flops must be finite and >= 0 \(FLOPs per call\), got tensor"):
        place(torch.add, x, x, flops=torch.tensor([1.0, 2.0]), ceilings=_cpu_ceilings())


# -- Measurement records: a field of the wrong type or sign is refused, not read on as a wrong answer --------------


def _record() -> dict:
    from gpuspeed.stats import summarize

    times = 1e-3 * (1 + 0.01 * np.random.default_rng(3).random(12))
    return summarize(times, name="f", device="cpu", mode="cpu", notes=["warm-up: 3 calls"]).to_dict()


@pytest.mark.parametrize(("edit", "words"), [
    ({"throttled": "no"}, "throttled must be true or false"),  # printed THROTTLED
    ({"unreliable": "false"}, "unreliable must be true or false"),  # printed UNRELIABLE
    ({"median": -1e-3}, "median is never below 0"),  # compare() gave a negative speedup
    ({"iqr": -1.0}, "iqr is never below 0"),
    ({"n": 2.5}, "n must be a whole number"),
    ({"calls_per_sample": 0}, "calls_per_sample must be a whole number >= 1"),
    ({"notes": "abc"}, "notes must be a list of strings"),  # three notes: 'a', 'b', 'c'
    ({"mode": None}, "mode must be a string"),
    ({"clocks": [1]}, "clocks must be a dict"),
])
def test_a_measurement_record_with_a_field_of_the_wrong_type_is_refused(edit, words):
    from gpuspeed.stats import Measurement

    with pytest.raises(UserError, match=words) as err:
        Measurement.from_dict(_record() | edit)
    assert "\n" not in str(err.value)


def test_a_measurement_record_still_reads_back_from_strict_json():
    import json

    from gpuspeed.results import strict_json
    from gpuspeed.stats import Measurement, summarize

    record = _record()
    back = Measurement.from_dict(json.loads(strict_json(record)))
    assert back.to_dict() == record
    assert Measurement.from_dict(record | {"n": 12.0}).n == 12  # a count written as a float
    few = summarize([1e-3, 2e-3], name="f", device="cpu", mode="cpu")  # rel_noise inf: null in strict JSON
    assert Measurement.from_dict(json.loads(strict_json(few.to_dict()))).rel_noise == float("inf")


def test_bench_refuses_a_name_that_is_not_a_string():
    from gpuspeed import bench

    with pytest.raises(UserError, match="name is the measurement's label, a string, got int 5"):
        bench(lambda: None, name=5, device="cpu", budget_s=0.05)


def test_place_says_when_its_unit_has_no_ceiling_and_another_stands_in():
    import torch

    from gpuspeed.roofline import place

    a = torch.randn(32, 32).half()
    p = place(torch.mm, a, a, ceilings=_cpu_ceilings(), budget_s=0.05, min_samples=3)  # no fp16 ceiling on a CPU
    assert (p.unit, p.compute_ceiling) == ("fp16", "fp32")
    assert any("no fp16 compute ceiling was measured on test: held to fp32's" in n for n in p.notes), p.notes
    p = place(torch.mm, a.float(), a.float(), ceilings=_cpu_ceilings(), budget_s=0.05, min_samples=3, unit="fp32")
    assert not any("compute ceiling was measured" in n for n in p.notes), p.notes


def test_place_counts_a_complex_matmul_in_real_flops_on_the_fp64_roof():
    import torch

    from gpuspeed.roofline import place

    gen = torch.Generator().manual_seed(5)
    a = torch.randn(24, 24, dtype=torch.complex128, generator=gen)
    p = place(torch.mm, a, a, ceilings=_cpu_ceilings(), budget_s=0.05, min_samples=3)
    # FlopCounterMode counts 2 n^3; a complex multiply-add is 8 real FLOPs (4 multiplies, 4 adds)
    assert p.flops == 8 * 24**3 and "x4 for complex data" in p.flops_source
    assert (p.unit, p.compute_ceiling) == ("fp64", "fp64")  # complex128 is fp64 arithmetic, not fp32's roof
    p = place(torch.mm, a.real.float(), a.real.float(), ceilings=_cpu_ceilings(), budget_s=0.05, min_samples=3)
    assert p.flops == 2 * 24**3 and p.flops_source == "counted by FlopCounterMode"


@pytest.mark.parametrize("value", ["no", None, 0])
def test_bench_refuses_hide_launch_latency_that_is_not_true_or_false(value):
    from gpuspeed import bench

    with pytest.raises(UserError, match="hide_launch_latency takes True or False"):  # "no" held the stream as True
        bench(lambda: None, hide_launch_latency=value, budget_s=0.05)


@pytest.mark.parametrize("option", ["clone", "own_inputs"])
def test_capture_refuses_a_flag_that_is_not_true_or_false(option):
    import torch

    from gpuspeed.graphs import capture

    with pytest.raises(UserError, match=f"capture\\(\\): {option} takes True or False, got 'no'"):
        capture(lambda x: x * 2, torch.randn(4), **{option: "no"})


def test_check_refuses_equal_nan_that_is_not_true_or_false():
    out = np.array([1.0, np.nan])
    assert not check(out, out.copy()).passed
    with pytest.raises(UserError, match="equal_nan takes True or False, got 'False'"):  # it passed them as True
        check(out, out.copy(), equal_nan="False")
    assert check(out, out.copy(), equal_nan=np.bool_(True)).passed


# -- budgets: a sign and an exponent are read, so '-1' is told it must be positive -----------------------------------


@pytest.fixture(scope="module")
def small_peak():
    from gpuspeed import peak_memory

    return peak_memory(lambda n: np.random.default_rng(6).random(n), 100_000, device="cpu")


@pytest.mark.parametrize("budget", ["-1", "-1GB", "-0.5 GiB"])
def test_a_negative_budget_is_told_to_be_positive(small_peak, budget):
    with pytest.raises(UserError, match=f"budget must be positive, got '{budget}'"):  # was "cannot read budget"
        small_peak.fits(budget)


@pytest.mark.parametrize(("budget", "nbytes"), [("1e9", 10**9), ("1E9B", 10**9), ("1e3 MiB", 1000 * 2**20),
                                                ("5e-1GiB", 2**29), ("+8GiB", 8 * 2**30)])
def test_a_budget_in_scientific_notation_is_read(small_peak, budget, nbytes):
    fit = small_peak.fits(budget)  # '1e9' was refused though 1e9 as a number is taken
    assert fit.budget_bytes == nbytes and fit.fits


def test_cap_refuses_a_negative_budget_before_its_block():
    import warnings

    from gpuspeed import cap

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no GPU: the cap is not enforced
        with pytest.raises(UserError, match="budget must be positive"):
            with cap("-8GiB"):
                pass


# -- check(): a leaf that could not be compared has unknown errors, never 0 -----------------------------------------


@pytest.mark.parametrize(("out", "ref"), [
    (np.ones(3), np.ones(4)),  # shapes differ
    ((np.ones(2), None), (np.ones(2), np.ones(2))),  # a None where an array was expected
    ({"a": np.ones(2)}, {"b": np.ones(2)}),  # keys differ
    (np.ma.masked_array(np.ones(3), mask=[0, 1, 0]), np.ma.masked_array(np.ones(3), mask=[0, 0, 0])),
])
def test_check_that_could_not_compare_reports_no_zero_error(out, ref):
    r = check(out, ref)
    assert not r.passed
    # rel_l2_err read 0.0, so `check(...).rel_l2_err < 1e-6` passed a wrong shape
    assert r.rel_l2_err == r.max_abs_err == r.max_rel_err == float("inf")
    assert check(np.ones(3), np.ones(3)).rel_l2_err == 0.0


@pytest.mark.gpu
def test_place_and_bench_take_their_gpu_options_after_the_early_checks():
    # the options checked before place() does any work (check_options) and bench's own checks still let every valid
    # GPU option through: graph mode, kernel mode, hide_launch_latency, a callable flush, graph_calls
    import torch

    from gpuspeed import bench
    from gpuspeed.roofline import place
    from gpuspeed.roofline.ceilings import Ceiling, Ceilings

    ceil = Ceilings("cuda", torch.cuda.get_device_name(), [Ceiling("copy", "memory", 4000.0),
                                                          Ceiling("fp32", "compute", 60.0),
                                                          Ceiling("tf32", "compute", 400.0)])
    a = torch.randn(256, 256, device="cuda")
    for options in ({"mode": "graph", "graph_calls": 20}, {"mode": "events", "hide_launch_latency": True},
                    {"mode": "events", "flush": lambda: None}, {"mode": "kernel"}):
        p = place(torch.mm, a, a, ceilings=ceil, budget_s=0.2, **options)
        assert p.flops == 2 * 256**3 and p.time_s > 0, options
    m = bench(torch.mm, a, a, mode="events", hide_launch_latency=True, budget_s=0.2)
    assert m.mode == "events" and m.median > 0


def test_ceilings_refuse_quick_that_is_not_true_or_false():
    from gpuspeed.roofline import ceilings

    with pytest.raises(UserError, match="quick takes True or False, got 'no'"):  # it measured the quick ceilings
        ceilings(device="cpu", quick="no", nbytes=2**10)
