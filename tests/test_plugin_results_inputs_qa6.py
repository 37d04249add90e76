"""QA round 6 on the pytest plugin, results files, statistics and input specs: each test fails without its fix."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from gpuspeed.errors import UserError
from gpuspeed.inputs import make_inputs, parse_spec, parse_specs
from gpuspeed.results import check_out_dir, make_results, strict_json, write_results, write_text_atomic
from gpuspeed.stats import compare, format_speedup, format_time, median_rel_error, reliability, summarize

pytest_plugins = ["pytester"]


# --- inputs ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["x=float32[³]", "x=float32[٣]"])
def test_a_unicode_digit_dimension_is_a_one_line_error(spec):
    # '³'.isdigit() is True but int('³') raises ValueError: a traceback before
    with pytest.raises(UserError, match="is not a non-negative integer"):
        parse_spec(spec)


def test_a_shape_past_what_an_array_can_address_is_refused_even_beside_a_zero_dimension():
    # 0 elements, so the memory check saw 0 bytes, and numpy raised "array is too big" (ValueError)
    for spec in ("x=float32[0,4611686018427387903]", "x=int8[2147483648,0,2147483648,4]"):
        with pytest.raises(UserError, match="multiply past what an array can hold"):
            parse_spec(spec)
        with pytest.raises(UserError, match="multiply past"):
            make_inputs([spec], backend="numpy")
    assert parse_spec("x=float32[0,1048576]").shape == (0, 1048576)  # a plain empty array still parses


def test_spec_spellings_whitespace_keywords_and_float_overflow():
    assert parse_spec("x=float32[\t4,\n5]").shape == (4, 5)  # only spaces were taken out before
    assert parse_spec("n=INT:3").value == 3 and parse_spec("e=Float:0.5").value == 0.5  # as FLOAT32[4] is
    with pytest.raises(UserError, match="Python keyword"):
        parse_spec("class=int:3")
    with pytest.raises(UserError, match="overflows a float"):
        parse_spec("e=float:1e999")  # was silently inf
    assert math.isinf(parse_spec("e=float:-inf").value)  # an inf that is written stays


def test_make_inputs_refuses_a_name_given_twice_instead_of_keeping_the_last():
    with pytest.raises(UserError, match="given twice"):
        make_inputs(["x=float32[4]", "x =float32[8]"])
    with pytest.raises(UserError, match="given twice"):
        make_inputs(parse_specs(["x=float32[4]"]) * 2)


def test_make_inputs_takes_one_spec_string_and_refuses_non_specs_in_one_line():
    assert make_inputs("x=float32[3]")["x"].shape == (3,)  # was iterated character by character
    assert parse_specs("x=int:2")[0].value == 2
    with pytest.raises(UserError, match="bad input spec None"):
        make_inputs([None])  # was AttributeError


def test_make_inputs_seed_is_checked_in_one_line():
    for seed in (-1, 1.5, "a", True):
        with pytest.raises(UserError, match="seed is a whole number"):
            make_inputs(["x=float32[2]"], seed=seed)
    a = make_inputs(["x=float32[2]"], seed=np.int64(3))["x"]
    assert torch.equal(a, make_inputs(["x=float32[2]"], seed=3)["x"])


def test_cli_negative_seed_is_one_line(tmp_path, capsys):
    from gpuspeed.cli import main

    (tmp_path / "f.py").write_text("def fn(x):\n    return x * 2\n")
    rc = main(["profile", "--function", f"{tmp_path / 'f.py'}:fn", "--input", "x=float32[4]", "--seed", "-1",
               "--device", "cpu"])
    _, err = capsys.readouterr()
    assert rc == 2 and err.startswith("gpuspeed: error:") and "seed" in err and err.count("\n") == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_inputs_on_a_cuda_device_without_cuda_are_one_line(device):
    with pytest.raises(UserError, match="need a CUDA GPU and there is none here"):  # was AssertionError
        make_inputs(["x=float32[4]"], device=device)


@pytest.mark.parametrize("device", ["gpu", "auto", "CPU", "cuda:abc"], ids=["word", "auto", "upper", "index"])
def test_inputs_on_an_unknown_device_are_one_line(device):
    with pytest.raises(UserError, match="unknown device"):  # was torch's RuntimeError
        make_inputs(["x=float32[4]"], device=device)


# --- results ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Row:
    t: float
    tags: set


def test_strict_json_writes_dataclasses_sets_and_bytes_as_data_not_reprs():
    doc = json.loads(strict_json({"row": _Row(math.nan, {3, 1, 2}), "f": frozenset({"b", "a"}),
                                  "raw": b"ok\xff", "mixed": {2, "a"}}))
    assert doc["row"] == {"t": None, "tags": [1, 2, 3]}  # was the string "_Row(t=nan, tags={1, 2, 3})"
    assert doc["f"] == ["a", "b"] and doc["raw"] == "ok\\xff" and sorted(map(str, doc["mixed"])) == ["2", "a"]


def test_write_results_failure_is_one_line_and_leaves_no_temp_file(tmp_path):
    doc = make_results("demo", device="cpu")
    (tmp_path / "demo.json").mkdir()  # a folder where the file goes
    with pytest.raises(UserError, match=r"cannot write .*demo\.json: Is a directory"):  # was IsADirectoryError
        write_results(doc, tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="cannot write"):  # was FileExistsError
        write_results(doc, tmp_path / "file" / "sub")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.json", "file"]


def test_write_results_takes_numpy_numbers_in_the_summary(tmp_path):
    doc = make_results("demo", device="cpu")
    doc["summary"] = {"gbps": np.float32(1.5), "n": np.int64(3), "bad": np.float64("nan")}
    path = write_results(doc, tmp_path)  # a UserError "must be a number" before, for a number
    assert json.loads(path.read_text())["summary"] == {"gbps": 1.5, "n": 3, "bad": None}
    doc["summary"] = {"k": [1, 2]}
    with pytest.raises(UserError, match="must be a number"):
        write_results(doc, tmp_path)


def test_check_out_dir_refuses_empty_nul_and_dangling_symlink(tmp_path):
    with pytest.raises(UserError, match="empty path"):
        check_out_dir("")  # was '.', the working directory, silently
    with pytest.raises(UserError, match="NUL"):
        check_out_dir("a\0b")  # was ValueError
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(UserError, match="a symlink to .*nowhere, which does not exist"):
        check_out_dir(tmp_path / "link")


def test_results_text_is_utf8_whatever_the_locale(tmp_path):
    target = tmp_path / "r.md"
    code = ("import sys; from gpuspeed.results import write_text_atomic; "
            "write_text_atomic(sys.argv[1], 'median 1.2 \\u00b5s \\u00b1 3 %\\n')")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0"}
    proc = subprocess.run([sys.executable, "-X", "utf8=0", "-c", code, str(target)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr  # UnicodeEncodeError under an ASCII locale before
    assert target.read_bytes().decode("utf-8") == "median 1.2 \u00b5s \u00b1 3 %\n"
    assert write_text_atomic(tmp_path / "b.md", "\u00b5").read_bytes() == "\u00b5".encode()


# --- stats -----------------------------------------------------------------------------------------------------


def test_summarize_with_an_infinite_sample_has_the_hand_computed_quantiles():
    m = summarize([1.0, 2.0, math.inf], name="x", device="cpu", mode="cpu")
    # sorted 1, 2, inf; linear quantiles at (n-1)q: q50 -> index 1 = 2 (numpy gave NaN: 0 * inf),
    # q25 -> index 0.5 = 1.5, q75 -> index 1.5 = inf, q10 -> 1.2, q90 -> inf
    assert (m.median, m.p10, m.p90, m.iqr) == (2.0, 1.2, math.inf, math.inf)
    assert m.unreliable and len(m.notes[0]) < 200
    finite = summarize([3.0, 1.0, 2.0, 4.0], name="x", device="cpu", mode="cpu")  # numpy's path, unchanged
    assert (finite.median, finite.iqr, finite.p10) == (2.5, 1.5, 1.3)


def test_median_rel_error_matches_the_order_statistics_by_hand():
    x = [float(v) for v in range(1, 11)]  # n = 10: half = 1.96 * sqrt(10) / 2 = 3.099
    # lo = floor(5 - 3.099) = 1, hi = ceil(5 + 3.099) = 9: (x[9] - x[1]) / (2 * 1.96) / median 5.5
    assert median_rel_error(x) == pytest.approx((10 - 2) / (2 * 1.959963984540054) / 5.5, rel=1e-12)
    assert median_rel_error([2.0] * 4) == 0.0 and median_rel_error([1.0, 2.0]) == math.inf


def test_reliability_note_of_a_huge_range_is_short():
    note = reliability(2.5e299, 0.1)
    assert "2.50e+301%" in note and len(note) < 200  # was a 300-digit percentage


def test_compare_keeps_an_infinite_interval_end_infinite():
    base = summarize([5.0, 5.0, 5.0], name="a", device="cpu", mode="cpu")
    cand = summarize([1.0, 1.0, 0.0], name="b", device="cpu", mode="cpu")
    c = compare(base, cand)
    # a resample of two or three zeros (7 of 27 equally likely resamples) has median 0: ratio inf, past the
    # 97.5th percentile; the lowest ratio is 5 / 1
    assert (c.speedup, c.ci_low, c.ci_high, c.verdict) == (5.0, 5.0, math.inf, "faster")  # ci_high was NaN
    huge = compare(summarize([1e300] * 5, name="a", device="cpu", mode="cpu"),
                   summarize([1e-300] * 5, name="b", device="cpu", mode="cpu"))
    assert huge.verdict == "faster" and huge.ci_low == math.inf  # was NaN and "same: within 1% of 1"


def test_compare_refuses_nan_times():
    nan = summarize([1.0, 1.0, math.nan], name="a", device="cpu", mode="cpu")
    ok = summarize([1.0, 1.0, 1.0], name="b", device="cpu", mode="cpu")
    with pytest.raises(UserError, match="NaN"):
        compare(nan, ok)  # was "nanx [95% CI nan, nan] (same: within 1% of 1)"


def test_format_speedup_and_time_at_the_extremes():
    assert format_speedup(1e300, 1e299, 1e301) == "1e+300x [95% CI 1e+299, 1e+301]"
    assert format_speedup(2e-5, 1e-5, 3e-5) == "2e-05x [95% CI 1e-05, 3e-05]"  # was 0.000000x
    assert format_speedup(1.0032, 1.0011, 1.0054) == "1.0032x [95% CI 1.0011, 1.0054]"
    assert (format_time(math.inf), format_time(math.nan), format_time(2e-3)) == ("inf", "nan", "2.000 ms")


# --- the pytest plugin -----------------------------------------------------------------------------------------


_TESTS = """
import functools
import itertools
import time

def work(n=100):
    return sum(range(n))

def test_many(gpubench):
    gpubench(work, device="cpu", max_samples=6, min_samples=5)
    gpubench(work, 200, device="cpu", max_samples=6, min_samples=5)
    gpubench(functools.partial(work, 5), device="cpu", max_samples=6, min_samples=5)
    delays = itertools.cycle([0.001, 0.01])
    m = gpubench(lambda: time.sleep(next(delays)), device="cpu", max_samples=6, min_samples=6)
    assert m.unreliable
"""


def test_plugin_writes_the_named_file_names_repeats_and_flags_unreliable(plugin_args, pytester):
    pytester.makepyfile(test_user=_TESTS)
    out = pytester.path / "bench.out"
    result = pytester.runpytest(*plugin_args, "-p", "no:cacheprovider", f"--gpubench-json={out}")
    result.assert_outcomes(passed=1)
    assert out.is_file()  # was a folder bench.out/ holding gpubench.json
    names = [r["name"] for r in json.loads(out.read_text())["rows"]]
    assert names == ["test_many:work", "test_many:work#2", "test_many:work#3", "test_many:<lambda>"]  # partial: work
    result.stdout.fnmatch_lines(["*test_many:<lambda>*cpu UNRELIABLE*", f"gpubench: wrote {out}"])


def test_plugin_refuses_an_unwritable_json_path_before_any_test(plugin_args, pytester):
    pytester.makepyfile(test_user="def test_x(gpubench):\n    raise AssertionError('must not run')\n")
    (pytester.path / "afile").write_text("x")
    for bad, why in (("afile/x.json", "is not a folder"), ("", "an empty path")):
        result = pytester.runpytest(*plugin_args, "-p", "no:cacheprovider", f"--gpubench-json={bad}")
        assert result.ret == pytest.ExitCode.USAGE_ERROR  # was a traceback after the session, or nothing written
        result.stderr.fnmatch_lines([f"ERROR: --gpubench-json*{why}*"])
        assert "must not run" not in result.stdout.str()


def test_plugin_write_failure_at_the_end_is_one_line_and_fails_the_run(plugin_args, pytester):
    pytester.makepyfile(test_user="""
        def test_x(gpubench):
            gpubench(sum, [1, 2], device="cpu", max_samples=5, min_samples=5)
            open("sub", "w").write("now a file where the results folder was to go")
        """)
    result = pytester.runpytest(*plugin_args, "-p", "no:cacheprovider", "--gpubench-json=sub/r.json")
    result.stdout.fnmatch_lines(["gpubench: ERROR: cannot write *sub/r.json: *"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str() and result.ret == pytest.ExitCode.TESTS_FAILED


def test_plugin_writes_the_file_when_no_test_measured(plugin_args, pytester):
    pytester.makepyfile(test_user="def test_x():\n    pass\n")
    out = pytester.path / "r.json"
    pytester.runpytest(*plugin_args, "-p", "no:cacheprovider", f"--gpubench-json={out}").assert_outcomes(passed=1)
    doc = json.loads(out.read_text())  # none was written before: a CI step reading it failed
    assert doc["rows"] == [] and doc["summary"]["measurements"] == 0


def test_plugin_counts_the_xdist_workers_that_ran(plugin_args, pytester):
    """-n 2 --maxprocesses 1 runs one worker: no warning, parallel_workers 1 (it was -n's 2; and `--tx 2*popen`,
    two workers without -n, read as 1 and gave no warning)."""
    pytest.importorskip("xdist")
    args, workers = ("-n", "2", "--maxprocesses", "1"), 1
    pytester.makepyfile(test_user="def test_x(gpubench):\n    gpubench(sum, [1], device='cpu', max_samples=5, min_samples=5)\n")
    out = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(*plugin_args, "-p", "no:cacheprovider", *args, f"--gpubench-json={out}")
    result.assert_outcomes(passed=1)
    assert json.loads(out.read_text())["summary"]["parallel_workers"] == workers
    assert "pytest-xdist workers ran tests" not in result.stdout.str()
