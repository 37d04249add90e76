"""QA round 25, the measuring core: bench() / check() / peak_memory() as a demanding user drives them on the CPU."""

import time

import numpy as np

from gpuspeed import bench, check
from gpuspeed.stats import summarize


def _busy(seconds: float) -> None:
    """Hold the host for `seconds` (a sleep's wake-up is too coarse to grow by a few microseconds a call)."""
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        pass


def test_a_time_that_drifts_through_the_run_is_flagged_unreliable():
    # 1.0 ms rising to 1.4 ms over the run: IQR/median ~17 % and a median error ~1 % passed it as a 1.2 ms call
    rng = np.random.default_rng(0)
    ramp = 1e-3 * (1 + 0.4 * np.linspace(0, 1, 300)) * (1 + 0.002 * rng.standard_normal(300))
    m = summarize(ramp, name="ramp", device="cpu", mode="cpu")
    assert m.rel_noise < 0.05 and m.rel_iqr < 0.25  # neither existing rule sees it
    assert m.unreliable and any("drift" in n for n in m.notes), m.notes
    # the same samples in shuffled order hold no trend: not flagged for it
    shuffled = summarize(rng.permutation(ramp), name="shuffled", device="cpu", mode="cpu")
    assert not any("drift" in n for n in shuffled.notes), shuffled.notes


def test_a_call_that_gets_slower_every_call_is_flagged_by_bench():
    calls = [0]

    def slower_each_call():
        calls[0] += 1
        _busy(200e-6 * (1 + 0.002 * calls[0]))  # +0.2 % a call: +60 % over 300 calls

    m = bench(slower_each_call, device="cpu", max_noise=1e-6, min_samples=300, max_samples=300, budget_s=0.05)
    assert m.n == 300
    assert m.unreliable and any("drift" in n for n in m.notes), (str(m), m.notes)
    assert "UNRELIABLE" in str(m)


def test_a_pass_with_an_explicit_atol_names_the_elementwise_rule_it_met():
    # "PASS: ..., rel L2 3e-05 (rtol 1e-12)" read as a pass that broke its own bound: an explicit atol makes the
    # rule elementwise, and the line did not say so nor name the atol
    x = np.linspace(1, 2, 100)
    r = check(x * (1 + 3e-5), x, atol=1e-3)
    assert r.passed
    assert "atol 0.001" in r.summary and "elementwise" in r.summary, r.summary
    assert "(rtol 1e-12)" not in r.summary, r.summary
    numbers = check([1.0, 2.0, 3.0], [1.0, 2.0, 3.0001], atol=1e-3)  # a list of numbers: the same rule, the same line
    assert numbers.passed and "atol 0.001" in numbers.summary, numbers.summary
    # the default rule's line is unchanged: the rel L2 bound is the rtol it prints
    plain = check(x * (1 + 3e-6), x, rtol=1e-5)
    assert plain.passed and plain.summary.endswith("(rtol 1e-05)"), plain.summary


def test_the_first_host_peak_in_a_process_does_not_count_the_instruments_starting():
    # the first peak_memory() of a process that imported torch read a do-nothing call as ~1.3 MiB (a 781 KiB copy as
    # 1.27 MiB): torch's profiler and the RSS sampler started after the RSS baseline was read, and their own growth
    # was counted as the call's
    import subprocess
    import sys

    code = ("import numpy as np, torch, gpuspeed\n"
            "a = np.ones(100_000)\n"
            "print(gpuspeed.peak_memory(lambda: None, device='cpu').peak_bytes)\n"
            "print(gpuspeed.peak_memory(lambda: a.copy(), device='cpu').peak_bytes)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    nothing, copy = (int(v) for v in r.stdout.split())
    assert nothing < 64 * 2**10, nothing
    assert 800_000 <= copy < 800_000 + 64 * 2**10, copy


def test_an_rtol_passed_for_integers_is_said_to_be_unused_where_they_fail():
    # check(ints, ints + 1, rtol=0.5) failed with "(atol 0, rtol 0)": the rtol the user passed was dropped without a
    # word (integers compare exactly, within an atol alone), which read as check() losing the argument
    for out, ref in ((np.array([10, 20, 30]), np.array([10, 20, 31])), ([10, 20, 30], [10, 20, 31]), (30, 31)):
        r = check(out, ref, rtol=0.5)
        assert not r.passed
        assert "rtol= is not applied to integers" in r.summary and "atol=" in r.summary, r.summary
    assert check(np.array([10, 20, 30]), np.array([10, 20, 31]), rtol=0.5, atol=1).passed
    # no rtol passed: no such words
    assert "rtol=" not in check(np.array([1, 2]), np.array([1, 3])).summary


def test_peak_memory_on_the_host_says_why_it_measured_the_host():
    # device="cpu" on a GPU machine (optimize's first-call peak does so) said "no GPU: host memory of the call"
    from gpuspeed import peak_memory

    asked = peak_memory(np.ones, 1000, device="cpu")
    assert asked.notes[0].startswith("device='cpu', so no GPU memory is counted: host memory"), asked.notes
    from gpuspeed.device import cuda_available

    if not cuda_available():
        found = peak_memory(np.ones, 1000)  # auto on a machine without a GPU
        assert found.notes[0].startswith("no GPU: host memory"), found.notes


def test_a_drift_that_also_spreads_the_samples_is_said_as_a_drift():
    # a rise from 1.0 to 2.0 spreads the samples over IQR/median ~ 50 %: "more than one level" was the only reason
    # given (the first rule that fired), and the drift, the cause, went unsaid
    from gpuspeed.stats import summarize

    m = summarize(np.linspace(1.0, 2.0, 120), name="rising", device="cpu", mode="cpu")
    assert m.unreliable and any("more than one level" in n for n in m.notes), m.notes
    assert any("drift" in n for n in m.notes), m.notes
