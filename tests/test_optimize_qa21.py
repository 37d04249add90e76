"""QA round 21, optimize: the workload format as users write it (an `np.empty` out= buffer, a variant that returns a
view of its input)."""
from __future__ import annotations

import numpy as np
import pytest

from gpuspeed.optimize import workload as W

# an out=-style original whose inputs() hands it a fresh np.empty buffer: its contents differ call to call (here made
# to differ on purpose, as np.empty's do when the allocator gives other memory), and the original never reads them
EMPTY_OUT = '''
import itertools

import numpy as np
import pytest

_calls = itertools.count()


def original(x, out):
    for i in range(x.shape[0]):
        out[i] = x[i] * 2.0 + 1.0


def inputs(rng):
    x = rng.standard_normal(50)
    out = np.empty(50)
    out[:] = next(_calls)  # np.empty's garbage, made to differ every call
    return x, out
'''

# the same, but inputs() hands out a module-level array the original changes: other arguments for the same seed
SHARED_STATE = '''
import numpy as np
import pytest

STATE = np.linspace(0.0, 1.0, 50)


def original(x, state):
    state += x


def inputs(rng):
    return rng.standard_normal(50), STATE
'''


def _reference(tmp_path, text):
    path = tmp_path / "work.py"
    path.write_text(text)
    wl = W.load(path, gpu=False)
    return wl, W.reference(wl, [1, 2, 3])


def test_an_out_buffer_from_np_empty_is_not_called_other_inputs_for_the_same_seed(tmp_path):
    # optimize refused the README's own out= form ("inputs(rng) made other arguments for the same seed") whenever
    # np.empty handed the buffer other garbage on the second call, which the original overwrites unread
    wl, (refs, mutates, in_place) = _reference(tmp_path, EMPTY_OUT)
    assert mutates and in_place == [1]
    x = wl.make_args(1)[0]
    np.testing.assert_array_equal(refs[1][0], x * 2.0 + 1.0)


def test_a_module_level_argument_the_original_changes_is_still_refused(tmp_path):
    from gpuspeed.errors import UserError

    with pytest.raises(UserError, match="made other arguments for the same seed"):
        _reference(tmp_path, SHARED_STATE)


# --- a variant that hands back its input where the original returns a new array ---

VIEWS = '''
import numpy as np
import pytest


def original(x, y):
    return x[::-1], y.copy()  # a view of x (the caller's data), and a new array


def inputs(rng):
    return rng.standard_normal(40), rng.standard_normal(40)


def keeps_both(x, y):
    return x[::-1], y + 0.0


def hands_back_y(x, y):
    return x[::-1], y  # the same numbers, but the caller's own y: writing into the result changes y


def hands_back_a_view_of_y(x, y):
    return x[::-1].copy(), y[:]


def forgets_return(x, y):
    x[::-1], y.copy()


_BUFFER = {}


def reuses_a_buffer(x, y):
    out = _BUFFER.setdefault(y.shape, np.empty_like(y))  # "saves an allocation": every call returns this array
    out[:] = y
    return x[::-1], out


variants = {"keeps_both": keeps_both, "hands_back_y": hands_back_y, "view_of_y": hands_back_a_view_of_y,
            "forgets_return": forgets_return, "reuses_a_buffer": reuses_a_buffer}
'''


def test_a_variant_returning_its_input_where_the_original_returns_a_new_array_is_wrong(tmp_path):
    # it was "correct" and chosen as the primary: the optimized call handed the caller its own array back, so writing
    # into the result changed the input (and changing the input, the result), which the original's never does
    from optimize_script_helpers import optimize_text

    run = optimize_text(tmp_path, "views", VIEWS, ["variant"])
    rows = run.results
    assert rows["variant:keeps_both"]["status"] == "ok", rows["variant:keeps_both"]
    for name in ("variant:hands_back_y", "variant:view_of_y"):
        assert rows[name]["status"] == "incorrect", rows[name]
        assert "`y` (argument 1)" in rows[name]["reason"] and "new array" in rows[name]["reason"], rows[name]["reason"]
    assert run.choice["primary"] in ("original", "variant:keeps_both"), run.choice
    # right on each call, but a caller's `a = f(x1); b = f(x2)` found a overwritten by b
    reused = rows["variant:reuses_a_buffer"]
    assert reused["status"] == "incorrect" and "previous call" in reused["reason"], reused
    # a variant without its `return` was "output 0: shape (), the original's (40,)": the row says what it returned
    missing = rows["variant:forgets_return"]
    assert missing["status"] == "wrong_output" and "returns None" in missing["reason"], missing


# --- inputs so small that the original's output is empty ---

SQUARES = '''
import numpy as np
import pytest


def original(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = x[i] ** 2
    return out


def inputs(rng, scale=1.0):
    return (rng.standard_normal(int(100 * scale)),)
'''


def test_an_original_whose_output_is_empty_at_this_scale_is_refused(tmp_path, capsys):
    # at --scale 0.001 inputs() made 0 elements: every candidate was "correct" against an empty output, a check of
    # nothing, and its speedup a time of nothing
    from gpuspeed.cli import main

    path = tmp_path / "squares.py"
    path.write_text(SQUARES)
    assert main(["optimize", str(path), "--device", "cpu", "--scale", "0.001", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "returned only empty arrays" in err and "raise --scale" in err and "Traceback" not in err, err
    assert not (tmp_path / "out" / "report.md").exists()
    # so is a number made of empty arrays (a sum of nothing is 0.0 whatever a candidate adds)
    path.write_text(SQUARES.replace("    return out\n", "    return float(out.sum())\n"))
    assert main(["optimize", str(path), "--device", "cpu", "--scale", "0.001", "--out", str(tmp_path / "out")]) == 2
    assert "numbers of empty arrays" in capsys.readouterr().err


def test_a_variant_precision_other_than_float32_is_a_one_line_error(tmp_path):
    # `fn.precision = "fp32"` was silently taken as written (no float32 inputs, no float32 label), and the recipe
    # carried the unknown word into the report and the emitted script
    from gpuspeed.errors import UserError

    path = tmp_path / "prec.py"
    path.write_text("import numpy as np\n\ndef original(x):\n    return np.exp(x)\n\ndef fast(x):\n    return np.exp(x)\n\n"
                    "fast.precision = 'fp32'\nvariants = {'fast': fast}\n\n"
                    "def inputs(rng):\n    return (rng.standard_normal(16),)\n")
    with pytest.raises(UserError, match=r"variants\['fast'\]\.precision must be 'float32'.*got 'fp32'"):
        W.load(path, gpu=False)
    # so was `fn.gpuspeed_inputs = "Torch"`: the variant got NumPy arrays, and failed on them or passed untried on torch
    path.write_text(path.read_text().replace("fast.precision = 'fp32'", "fast.gpuspeed_inputs = 'Torch'"))
    with pytest.raises(UserError, match=r"variants\['fast'\]\.gpuspeed_inputs must be 'torch' or 'cupy'.*'Torch'"):
        W.load(path, gpu=False)


@pytest.mark.gpu
def test_on_a_gpu_the_handed_back_check_spares_the_gpu_candidates(tmp_path):
    # GPU candidates hand back host copies: none may be called WRONG by the check for a caller's memory handed back,
    # while the host variants that do hand it back still are
    from gpuspeed.optimize.pipeline import optimize

    path = tmp_path / "views.py"
    path.write_text(VIEWS)
    run = optimize(path, device="cuda", out=tmp_path / "out", backends=["variant", "cupy", "torch_compile"],
                   time_budget=300, bench_budget_s=0.1)
    rows = run.results
    assert rows["variant:hands_back_y"]["status"] == "incorrect", rows["variant:hands_back_y"]
    assert rows["variant:reuses_a_buffer"]["status"] == "incorrect", rows["variant:reuses_a_buffer"]
    for name, row in rows.items():
        if not name.startswith("variant:"):
            assert "new array" not in (row.get("reason") or ""), (name, row)
    assert any(row["status"] == "ok" and not name.startswith("variant:") and name != "original"
               for name, row in rows.items()), {n: r["status"] for n, r in rows.items()}


def test_a_tolerance_half_from_the_command_line_says_where_each_half_came_from(tmp_path):
    # --rtol with TOLERANCE's atol: the report said "rtol 0.001, atol 1e-09 (--rtol/--atol)", an atol never typed
    path = tmp_path / "tol.py"
    path.write_text("import numpy as np\n\nTOLERANCE = dict(rtol=1e-6, atol=1e-9)\n\ndef original(x):\n"
                    "    return np.cumsum(x)\n\ndef inputs(rng):\n    return (rng.standard_normal(8),)\n")
    wl = W.load(path, rtol=1e-3, gpu=False)
    assert (wl.rtol, wl.atol) == (1e-3, 1e-9)
    assert wl.tolerance_source == "--rtol, and the workload's TOLERANCE for atol", wl.tolerance_source
    assert W.load(path, rtol=1e-3, atol=1e-7, gpu=False).tolerance_source == "--rtol/--atol"


# --- an out=-style original, and a variant that returns its result instead of writing it ---

DOUBLE_INTO = '''
import numpy as np


def original(x, out):
    np.multiply(x, 2.0, out=out)


def inputs(rng):
    return rng.standard_normal(30), np.zeros(30)


def returns_it(x, out):
    return x * 2.0


variants = {"returns_it": returns_it}
'''


def test_a_variant_that_returns_what_the_original_writes_into_out_says_so(tmp_path):
    # its row said only "FAIL out[0]: 30/30 over tolerance": the numbers were right, in the wrong place
    from optimize_script_helpers import optimize_text

    row = optimize_text(tmp_path, "double_into", DOUBLE_INTO, ["variant"]).results["variant:returns_it"]
    assert row["status"] == "incorrect", row
    assert "returned a result" in row["reason"] and "`out` (argument 1)" in row["reason"], row["reason"]


# --- a Python float made in float64, and a variant that makes it in float32 ---

SUM_OF_SQUARES = '''
import numpy as np


def original(x):
    return float(np.sum(x * x)), np.sum(x)  # a Python float and a NumPy float64, both made in float64


def inputs(rng):
    return (rng.standard_normal(300),)


def in_float32(x):
    y = x.astype(np.float32)
    return float(np.sum(y * y)), np.sum(x)


def reordered(x):
    return float(np.dot(x, x)), np.sum(x[::-1])


def sum_as_a_float32_number(x):  # a Python float stands in for the NumPy float64 (same dtype to NumPy)
    return float(np.sum(x * x)), float(np.sum(x.astype(np.float32)))


variants = {"in_float32": in_float32, "reordered": reordered, "as_number": sum_as_a_float32_number}
'''


def test_a_python_float_made_in_float64_is_not_matched_by_a_float32_one(tmp_path):
    # gpuspeed.check holds a Python float to float32's rtol 1e-5 (it says no precision), so the float32 variant was
    # "correct" and the primary, labelled as written, while the plan said the tolerance was float64's 1e-12; one that
    # float32 cannot hold exactly was made in float64, and is held to float64's rtol now, in the run and in the script
    import subprocess
    import sys

    from optimize_script_helpers import optimize_text, rewrite

    run = optimize_text(tmp_path, "sumsq", SUM_OF_SQUARES, ["variant"])
    rows = run.results
    assert rows["variant:reordered"]["status"] == "ok", rows["variant:reordered"]
    assert rows["variant:in_float32"]["status"] == "incorrect", rows["variant:in_float32"]
    assert "rtol 1e-12" in rows["variant:in_float32"]["reason"], rows["variant:in_float32"]["reason"]
    # a Python float against the original's NumPy float64 was held to float32's rtol too ("the less precise")
    assert rows["variant:as_number"]["status"] == "incorrect", rows["variant:as_number"]
    assert run.choice["primary"] != "variant:in_float32"
    # the emitted script's own check holds it so too: with the float32 variant as its primary, it fails
    script = rewrite(run, "variant:in_float32")
    res = subprocess.run([sys.executable, str(script), "--cpu"], capture_output=True, text=True, cwd=tmp_path,
                         timeout=120)
    assert res.returncode == 1 and "FAIL" in res.stdout, res.stdout + res.stderr


# --- a loop that appends to a list it shares ---


def _sums_of_sines(xs, n):
    import math

    out = []
    for i in range(n):
        acc = 0.0
        for v in xs:
            acc += math.sin(v * i)
        out.append(acc)
    return out


def _rows_made_inside(x):
    total = 0.0
    for i in range(x.shape[0]):
        parts = []
        parts.append(x[i] * 2.0)
        total += parts[0]
    return total


def test_a_loop_that_appends_to_a_shared_list_is_planned_no_prange_candidate():
    # `out.append(acc)` under `for i in range(n)`: as a prange loop the threads append at once (the candidate died of
    # SIGSEGV, or came back in another order, WRONG); its plan row said nothing, and the crash was a row of its own
    from gpuspeed.optimize.candidates import prange_race

    why = prange_race(_sums_of_sines) or ""
    assert "out.append" in why and "race" in why, why
    assert prange_race(_rows_made_inside) is None  # a list each iteration makes for itself is its own


def test_an_atol_alone_gets_a_report(tmp_path):
    # `--atol 1e-6` (or TOLERANCE = dict(atol=1e-6)) without an rtol ended the run in a TypeError traceback as the
    # report was written ("rtol {None:g}"): every candidate measured, no report, no script
    from optimize_script_helpers import optimize_text

    run = optimize_text(tmp_path, "atol_only", "import numpy as np\n\ndef original(x):\n    return np.cumsum(x)\n\n"
                        "def inputs(rng):\n    return (rng.standard_normal(32),)\n", ["variant"], atol=1e-6)
    report = (run.out_dir / "report.md").read_text()
    assert "Tolerance: rtol by dtype (float64 1e-12, float32 1e-5), atol 1e-06 (--atol)" in report, report
    script = (run.out_dir / "optimized_atol_only.py").read_text()
    assert "rtol=None" not in script and "atol=1e-06" in script
