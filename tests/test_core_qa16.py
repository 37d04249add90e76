"""QA round 16, core: check() of Python number lists, the host-memory guard of half-precision GPU tensors, stale partial
results files, and a demanding user's pass over check / bench / peak_memory."""

from __future__ import annotations

import math
import random
import time

import numpy as np
import pytest

import gpuspeed


# -- check() of lists of plain numbers: one array, each number's own verdict ---------------------------------------

def test_check_of_a_million_float_list_takes_no_minutes_and_says_where_it_differs():
    # a list of 1,000,000 floats was compared a number at a time, each as its own leaf: ~2 minutes
    rng = random.Random(0)
    ref = [rng.random() for _ in range(1_000_000)]
    out = list(ref)
    out[777_777] += 1.0
    start = time.perf_counter()
    bad, good = gpuspeed.check(out, ref), gpuspeed.check(list(ref), ref)
    took = time.perf_counter() - start
    assert took < 15, f"check() of two 1M-float lists took {took:.0f} s"
    assert not bad.passed and "out[777777]" in bad.summary and bad.n_over_tol == 1, bad.summary
    assert good.passed, good.summary


def _number(rng: random.Random):
    kind = rng.choice(["float", "float", "int", "bool", "complex", "special", "numpy"])
    if kind == "numpy":  # a list(array) holds NumPy scalars, each with its dtype's tolerance
        kind = rng.choice([np.float32, np.float64, np.float16, np.int32, np.bool_, np.complex64])
        value = rng.choice([0, 1, -7]) if kind in (np.int32, np.bool_) else rng.choice([0.0, 1.0, 2.5, 1e-30, math.nan])
        return kind(value * rng.choice([1, 1 + 1e-7, 1 + 1e-3]) if kind not in (np.int32, np.bool_) else value)
    if kind == "float":
        return rng.choice([0.0, 1.0, -2.5, 1e-30, 3e7]) * rng.choice([1, 1 + 1e-7, 1 + 1e-3])
    if kind == "int":
        return rng.choice([0, 1, -7, 2**40])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "complex":
        return complex(rng.choice([0.0, 1.0, 2.0]), rng.choice([0.0, 1e-9, 1.0]))
    return rng.choice([math.nan, math.inf, -math.inf])


@pytest.mark.parametrize("options", [{}, {"atol": 1e-6}, {"rtol": 1e-2}, {"dtype": "float64"}, {"equal_nan": True},
                                     {"rtol": 0, "atol": 0}, {"rtol": math.inf}])
def test_check_of_a_number_list_gives_the_verdict_of_each_number_checked_alone(options):
    # compared as one array, each number keeps the tolerance it had as a leaf of its own (an element of (loss, count)
    # is not judged on the other's scale), and a failure names the first number that differs
    rng = random.Random(1)
    for _ in range(300):
        ref = [_number(rng) for _ in range(rng.randint(1, 6))]
        out = [rng.choice([r, _number(rng)]) if rng.random() < 0.3 else r for r in ref]
        if rng.random() < 0.3:
            ref[0] = ref[0] * (1 + 2e-6) if isinstance(ref[0], float) else ref[0]
        alone = [gpuspeed.check(o, r, **options).passed for o, r in zip(out, ref, strict=True)]
        whole = gpuspeed.check(out, tuple(ref), **options)
        assert whole.passed == all(alone), (out, ref, options, whole.summary)
        if not whole.passed:
            assert f"first at out[{alone.index(False)}]:" in whole.summary, (out, ref, whole.summary)
            assert whole.n_over_tol == alone.count(False)


def test_check_of_nested_number_lists_names_the_index_path():
    ref = [[float(i * 3 + j) for j in range(3)] for i in range(4)]
    out = [row[:] for row in ref]
    out[2][1] = 99.0
    r = gpuspeed.check({"grid": out}, {"grid": ref})
    assert not r.passed and "out['grid'][2][1]: 99.0 vs reference 7.0" in r.summary, r.summary
    assert r.worst_index == (2, 1)


def test_check_of_number_lists_keeps_its_structure_errors():
    assert "length differs" in gpuspeed.check([1.0, 2.0], [1.0, 2.0, 3.0]).summary
    assert "length differs" in gpuspeed.check([[1.0, 2.0], [1.0]], [[1.0, 2.0], [1.0, 2.0]]).summary
    assert "structure differs" in gpuspeed.check([1.0, 2.0], np.array([1.0, 2.0])).summary
    with pytest.raises(gpuspeed.UserError, match="cannot compare str"):
        gpuspeed.check([1.0, "2"], [1.0, 2.0])
    assert gpuspeed.check([], []).summary == "PASS: nothing to compare (empty structure)"
    big = [2**62 + 1]  # past 2**53: still a number at a time, exactly
    assert not gpuspeed.check([float(2**62)], big).passed and gpuspeed.check(big, list(big)).passed


# -- the host-memory guard counts the copies check() really makes ---------------------------------------------------

def _peak_rise(fn) -> int:
    """How far the process's peak resident memory rose over its resident memory while fn ran (Linux)."""
    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size
    base = status("VmRSS")
    fn()
    return status("VmHWM") - base


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_the_host_guard_counts_the_complex64_copy_of_a_complex32_tensor(monkeypatch):
    # a complex32 tensor becomes a complex64 array on the host (8 bytes an element) but the guard counted 4: with the
    # copy not fitting in free memory, check() went on and the OOM killer ended the process
    import torch

    import gpuspeed.inputs

    n = 1 << 27
    out = torch.empty(n, dtype=torch.complex32)  # untouched: refused before anything reads it
    monkeypatch.setattr(gpuspeed.inputs, "host_available_bytes", lambda: 6 * n)
    with pytest.raises(gpuspeed.UserError, match=r"~1\.0 GiB of host copies.*compare it in slices"):
        gpuspeed.check(out, np.zeros(n, dtype=np.complex64))
    # random values, not zeros: one CI run measured a rise of 0 on all-zero tensors (zero-filled huge pages can be
    # remapped to the shared zero page under memory pressure, dropping RSS before the peak is recorded); 64 MiB
    # copies, past glibc's largest mmap threshold, so they are fresh pages rather than reused heap
    small = torch.randn(1 << 23, dtype=torch.complex64).to(torch.complex32)
    ref = small.to(torch.complex64).numpy().copy()
    gpuspeed.check(small[:4], ref[:4])
    # the best of three: a reading of the kernel's counters can miss a rise (never invent one)
    rise = max(_peak_rise(lambda: gpuspeed.check(small, ref)) for _ in range(3))
    assert rise > 7 * small.numel(), f"{rise / small.numel():.1f} bytes an element: the guard's 8 is wrong"


def test_the_host_guard_counts_both_host_copies_of_a_bf16_tensor_off_the_host():
    # a bf16 CUDA tensor is copied to the host as bf16, then to float32 there: 6 bytes an element at once; the guard
    # counted 4 (a meta tensor stands for any tensor off the host: the accounting reads only its dtype and device)
    import torch

    from gpuspeed.verify import _host_bytes

    n = 1000
    assert _host_bytes(torch.empty(n, dtype=torch.bfloat16, device="meta")) == (4 * n, 2 * n)
    assert _host_bytes(torch.empty(n, dtype=torch.float32, device="meta")) == (4 * n, 0)
    assert _host_bytes(torch.empty(n, dtype=torch.bfloat16)) == (4 * n, 0)  # on the host: float32 alone
    assert _host_bytes(np.zeros(n)) == (0, 0)


@pytest.mark.gpu
def test_the_host_guard_counts_what_check_of_a_bf16_cuda_tensor_really_allocates(monkeypatch):
    import torch

    import gpuspeed.inputs

    n = 1 << 28  # 512 MiB of bf16 on the GPU, ~1.5 GiB on the host at once
    out = torch.zeros(n, dtype=torch.bfloat16, device="cuda")
    ref = np.zeros(n, dtype=np.float32)
    ref.fill(0)  # resident before the measurement
    gpuspeed.check(out[:4], ref[:4])
    rise = _peak_rise(lambda: gpuspeed.check(out, ref))
    assert 5.5 * n < rise < 6 * n + (128 << 20), f"{rise / n:.2f} bytes an element"
    monkeypatch.setattr(gpuspeed.inputs, "host_available_bytes", lambda: rise - (64 << 20))
    with pytest.raises(gpuspeed.UserError, match="compare it in slices"):
        gpuspeed.check(out, ref)
    monkeypatch.setattr(gpuspeed.inputs, "host_available_bytes", lambda: rise + (64 << 20))
    assert gpuspeed.check(out, ref).passed


# -- a complete results file takes the place of the partial ones of its study ---------------------------------------

def _gpuspeed_cli(args: list[str], capsys) -> tuple[int, str]:
    """`gpuspeed ARGS` in this process (only the stopped run needs a process of its own): (exit code, stderr)."""
    from gpuspeed.cli import main

    capsys.readouterr()
    rc = main(args)
    return rc, capsys.readouterr().err


def test_a_complete_run_removes_the_partial_files_a_stopped_run_left(tmp_path, capsys):
    # complete run, stopped run (launch.partial.json/.md/.png beside the complete launch.json), complete run again: the
    # stopped run's files stayed, and a reader of the folder saw two launch results
    import json
    import signal

    from test_interrupt_qa13 import stopped

    out = tmp_path / "res"
    args = ["launch", "--ks", "1,2,4", "--ns", "1000", "--variants", "eager", "--tiny-k", "10", "--budget", "0.05",
            "--out", str(out)]
    assert _gpuspeed_cli(args, capsys)[0] == 0
    rc, _, err = stopped(args, signal.SIGTERM, "; now fusion N=1e+03 copy", tmp_path)
    assert rc == 143 and (out / "launch.partial.json").is_file(), err[-3000:]
    (out / "roofline.partial.json").write_text("{}")  # another study's: not this run's to remove
    (out / "launch.partial.json.notes.txt").mkdir()  # not a file: left alone
    rc, err = _gpuspeed_cli(args, capsys)
    assert rc == 0, err[-3000:]
    assert not json.loads((out / "launch.json").read_text())["params"].get("partial")
    left = sorted(p.name for p in out.iterdir())
    assert left == ["launch.json", "launch.md", "launch.partial.json.notes.txt", "launch.png", "roofline.partial.json"]


def test_a_partial_write_removes_no_partial_file(tmp_path):
    from gpuspeed.results import make_results, write_results

    (tmp_path / "bench.partial.json").write_text("{}")
    write_results(make_results("bench", params={"partial": True}, device="cpu"), tmp_path)
    write_results(make_results("bench", device="cpu"), tmp_path / "elsewhere.json")  # not <study>.json: kept
    assert (tmp_path / "bench.partial.json").is_file()
    write_results(make_results("bench", device="cpu"), tmp_path)
    assert not (tmp_path / "bench.partial.json").exists() and (tmp_path / "bench.json").is_file()


# -- a demanding user's pass over check() ---------------------------------------------------------------------------

def test_check_of_a_list_of_numpy_scalars_is_one_array_with_their_dtypes_tolerance():
    # list(array) holds NumPy scalars: they were a leaf each (~2 minutes for 1M), not one array
    ref = np.random.default_rng(0).standard_normal(1_000_000)
    out = ref.astype(np.float32)
    out[4321] = 0
    start = time.perf_counter()
    r = gpuspeed.check(list(out), list(ref))
    assert time.perf_counter() - start < 20 and not r.passed and "first at out[4321]" in r.summary, r.summary
    assert r.n_over_tol == 1 and r.leaves[0].rtol == 1e-5  # float32's, as for one np.float32 against one np.float64


def test_check_with_an_infinite_rtol_passes_a_zero_reference():
    # rtol=inf (anything goes) failed 0 against 0: the default atol, rtol x RMS(ref), was inf x 0 = NaN
    assert gpuspeed.check(0.0, 0.0, rtol=math.inf).passed
    assert gpuspeed.check(np.zeros(3), np.zeros(3), rtol=math.inf).passed
    assert gpuspeed.check(np.array([0.0, 1.0]), np.array([0.0, 2.0]), rtol=math.inf).passed


def test_check_of_namedtuples_compares_them_by_field_name():
    # two namedtuples were compared by position: Stats(mean, std) against Stats2(std, mean) passed with the values
    # swapped, and a failure read out[1], not out.std
    import collections

    Stats = collections.namedtuple("Stats", "mean std")
    Flipped = collections.namedtuple("Flipped", "std mean")
    assert gpuspeed.check(Stats(1.0, 2.0), Flipped(std=2.0, mean=1.0)).passed
    swapped = gpuspeed.check(Stats(1.0, 2.0), Flipped(1.0, 2.0))
    assert not swapped.passed and swapped.summary.startswith("FAIL out.std:"), swapped.summary
    assert gpuspeed.check(Stats(np.ones(2), 2.5), Stats(np.ones(2), 2.0)).summary.startswith("FAIL out.std:")
    other = collections.namedtuple("Other", "mean var")
    assert "fields differ: Stats('mean', 'std') vs Other('mean', 'var')" in gpuspeed.check(Stats(1, 2), other(1, 2)).summary
    assert gpuspeed.check(Stats(1.0, 2.0), (1.0, 2.0)).passed  # against a plain tuple: by position, as before


def test_check_of_a_generator_says_to_pass_a_list():
    def rows():
        yield np.ones(2)

    with pytest.raises(gpuspeed.UserError, match=r"gives its items once.*list\(\.\.\.\)"):
        gpuspeed.check(rows(), rows())


def test_check_of_integers_far_apart_never_reads_them_equal():
    # int64's own difference wrapped: 2**62 against -2**62 differ by 2**63, which read as -2**63 <= atol: PASS
    import torch

    for out, ref in [(np.array([2**62]), np.array([-2**62])), (torch.tensor([2**62]), torch.tensor([-2**62])),
                     (2**62, -2**62), (np.array([2**63 - 1]), np.array([-2**63]))]:
        r = gpuspeed.check(out, ref)
        assert not r.passed and r.max_abs_err >= 2.0**63, r.summary
    assert not gpuspeed.check(np.array([2**62]), np.array([-2**62]), atol=2**40).passed
    assert gpuspeed.check(np.array([5, -3], np.int8), np.array([4, -2], np.int8), atol=1).passed


# -- verify_function(): inputs it cannot use are refused in one line ------------------------------------------------

def test_verify_function_refuses_inputs_it_cannot_use_in_one_line():
    from gpuspeed.verify import verify_function

    ones = lambda seed: (np.ones(3),)  # noqa: E731
    # a generator argument: the reference used it up and fn, as right as it, read nothing: FAIL for a correct fn
    with pytest.raises(gpuspeed.UserError, match="one-pass iterator"):
        verify_function(sum, sum, lambda seed: (iter([1.0, 2.0]),), seeds=[1])
    with pytest.raises(gpuspeed.UserError, match="make_inputs is a function of a seed"):  # was "'tuple' is not callable"
        verify_function(np.cumsum, np.cumsum, (np.ones(3),), seeds=[1])
    with pytest.raises(gpuspeed.UserError, match="integer seeds, got the seed 'a'"):  # a TypeError from make_inputs('a')
        verify_function(np.cumsum, np.cumsum, ones, seeds="abc")
    with pytest.raises(gpuspeed.UserError, match=r"returned a list, passed whole.*tuple\(args\)"):
        verify_function(np.add, np.add, lambda seed: [np.ones(3), np.ones(3)], seeds=[1])
    assert all(verify_function(np.cumsum, np.cumsum, ones, seeds=[np.int64(3)]))


def test_verify_function_of_two_empty_results_passes_them_as_equal():
    # a search that found nothing returned [] in fn and the reference alike: read as "both returned nothing", the
    # arguments were compared instead, and with no array among them the check was refused
    from gpuspeed.verify import verify_function

    def matches(values, limit):
        return [v for v in values if v > limit]

    (r,) = verify_function(matches, matches, lambda seed: ([1.0, 2.0], 5.0), seeds=[1])
    assert r.passed and "argument" not in r.summary, r.summary
    (bad,) = verify_function(matches, lambda values, limit: [7.0], lambda seed: ([1.0, 2.0], 5.0), seeds=[1])
    assert not bad.passed and "length differs" in bad.summary


def test_check_of_a_list_against_an_array_says_how_to_compare_them():
    # "structure differs: output list, reference ndarray" left a user of a list-returning version to guess
    r = gpuspeed.check([1.0, 2.0], np.array([1.0, 2.0]))
    assert not r.passed and "np.asarray(...) the list" in r.summary, r.summary
    assert gpuspeed.check(np.asarray([1.0, 2.0]), np.array([1.0, 2.0])).passed


def test_check_of_a_number_list_holds_no_whole_list_temporaries():
    # the list's numbers were made into a dozen whole-length float64 arrays at once: ~140 bytes an element on top of
    # the lists (a 10M-element list pair took 1.4 GB more); now a chunk at a time
    import tracemalloc

    rng = random.Random(2)
    ref = [rng.random() for _ in range(500_000)]
    out = list(ref)
    out[-1] = -1.0
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        r = gpuspeed.check(out, ref)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert not r.passed and "first at out[499999]" in r.summary, r.summary
    assert peak < 30 * len(ref), f"check() held {peak / len(ref):.0f} bytes a number"
