"""gpuspeed optimize and its optimized_<name>.py as a demanding user exercises them (QA pass 12), CPU only: small real
runs (--device cpu, a short bench budget, few backends) and the emitted script run or imported in a subprocess."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from optimize_script_helpers import LOAD_OPTIMIZED, optimize_text, rewrite

RETURNS_ITS_ARGUMENTS = """
    import numpy as np

    TOLERANCE = dict(rtol=1e-4, atol=1e-5)  # loose enough for the float32 candidate


    def original(x, w, out):
        x *= 2.0
        x += w
        np.multiply(x, w, out=out)
        return {"out": out, "x": x, "sum": x.sum()}


    def copies(x, w, out):  # writes what the original writes, but hands back new arrays
        original(x, w, out)
        return {"out": out.copy(), "x": x.copy(), "sum": x.sum()}


    def clobbers(x, w, out):  # right in x and out, but it also writes into w, which the original only reads
        res = original(x, w, out)
        w *= 0.5
        return res


    def reordered(x, w, out):  # the original's, its dict in another order
        res = original(x, w, out)
        return {"sum": res["sum"], "x": res["x"], "out": res["out"]}


    variants = {"copies": copies, "clobbers": clobbers, "reordered": reordered}


    def inputs(rng):
        return rng.standard_normal(300), rng.standard_normal(300) + 3.0, rng.standard_normal(300)
    """


@pytest.fixture(scope="module")
def returns_args(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("returns_args")
    return optimize_text(tmp_path, "scale", RETURNS_ITS_ARGUMENTS, ["numpy", "variant"]), tmp_path


def test_a_candidate_that_writes_an_argument_the_original_only_reads_is_not_correct(returns_args):
    """The original writes x and out and only reads w: a variant that also wrote into w (the caller's array) was
    called correct, because the mutation check was skipped altogether for an original that writes its arguments."""
    run, _ = returns_args
    row = run.results["variant:clobbers"]
    assert row["status"] == "mutates_inputs", (row["status"], row.get("reason"))
    assert "w" in row["reason"], row["reason"]
    assert run.results["original"]["status"] == "ok"


def test_a_candidate_returning_new_arrays_where_the_original_returns_its_arguments_is_not_correct(returns_args):
    """The original returns the caller's own `out` and `x` (written into): a variant handing back copies, equal in
    value, breaks a caller that relies on the result being its array (r is out; a later write to r changes out)."""
    run, _ = returns_args
    row = run.results["variant:copies"]
    assert row["status"] == "incorrect", (row["status"], row.get("reason"))
    assert "returns a new array where" in row["reason"] and "`out` (argument 2)" in row["reason"], row["reason"]
    assert run.results["numpy-fp32"]["status"] == "ok", run.results["numpy-fp32"].get("reason")


def test_a_candidate_returning_the_originals_dict_in_another_order_hands_back_the_same_arguments(returns_args):
    """Outputs are paired by key: the same dict in another order returns the caller's arrays under the same keys (the
    check of the arguments handed back counted leaves in the dict's own order, and rejected it)."""
    run, _ = returns_args
    row = run.results["variant:reordered"]
    assert row["status"] == "ok", (row["status"], row.get("reason"))
    script = rewrite(run, "variant:reordered")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "correctness: PASS" in r.stdout, r.stdout + r.stderr


CALL_RETURNS_ARGS = LOAD_OPTIMIZED + '''
import numpy as np

original = opt.load_workload("_mine").original
rng = np.random.default_rng(11)
for dtype in ("float64", "float32"):
    x, w, out = rng.standard_normal(50).astype(dtype), rng.standard_normal(50).astype(dtype) + 3.0, \\
        rng.standard_normal(50).astype(dtype)
    x0, out0 = x.copy(), out.copy()
    r = fn(x, w, out)
    ref = original(x0, w, out0)
    print(dtype, r["out"] is out, r["x"] is x, x.dtype, out.dtype, np.allclose(out, out0, rtol=1e-4, atol=1e-5),
          np.allclose(x, x0, rtol=1e-4, atol=1e-5), np.isclose(r["sum"], ref["sum"], rtol=1e-4),
          r["sum"].dtype == ref["sum"].dtype)
'''


def test_the_optimized_call_returns_the_callers_own_array_where_the_original_returns_its_argument(returns_args):
    """`def f(x, w, out): x *= 2; ...; return out, x, x.sum()`: the float32 primary wrote the caller's x and out but
    returned new arrays (equal values, `r[0] is out` False), where the caller may rely on the result being its own
    array. It returns the caller's arrays now, holding the result, for float64 and float32 callers alike."""
    run, tmp_path = returns_args
    script = rewrite(run, "numpy-fp32")
    p = tmp_path / "use_returns.py"
    p.write_text(CALL_RETURNS_ARGS)
    r = subprocess.run([sys.executable, str(p), str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.split("\n")
    assert "float64 True True float64 float64 True True True True" in lines, r.stdout
    assert "float32 True True float32 float32 True True True True" in lines, r.stdout
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "correctness: PASS" in r.stdout, r.stdout + r.stderr


def test_the_scripts_call_hands_back_the_callers_arrays_even_from_a_primary_that_returns_copies(returns_args, tmp_path):
    """(QA13) The script's optimized call returns the caller's own array wherever the original hands back that
    argument, whatever its primary returns: a primary returning copies of what it wrote (the run rejects it) gives
    the caller their arrays through the script, and its check passes (its check failed it in round 12)."""
    run, _ = returns_args
    script = rewrite(run, "variant:copies")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "correctness: PASS" in r.stdout, r.stdout + r.stderr
    p = tmp_path / "use_copies.py"
    p.write_text(CALL_RETURNS_ARGS)
    r = subprocess.run([sys.executable, str(p), str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "float64 True True float64 float64 True True True True" in r.stdout.split("\n"), r.stdout


FROM_A_FILE = """
    import numpy as np


    def original(x):
        return np.sqrt(np.abs(x)) * 2.0


    def inputs(rng):
        data = np.load("data.npy")  # relative: found from the folder optimize ran in
        return (data * rng.standard_normal(data.shape),)
    """


def _script_of(tmp_path, name, text, params=None):
    """The optimized script a run in tmp_path writes for the workload `text` when it keeps the original (no run)."""
    import types

    from gpuspeed.optimize import emit, workload

    p = tmp_path / f"{name}.py"
    p.write_text(textwrap.dedent(text))
    wl = workload.load(p, gpu=False)
    row = {"name": "original", "recipe": {"name": "original", "backend": "original"}, "status": "ok",
           "label": "the original (CPU)", "device_time": {"median": 1e-3}}
    run = types.SimpleNamespace(wl=wl, where="cpu", out_dir=tmp_path, choice={"primary": "original"},
                                params={"seeds": [1, 2, 3], "cwd": str(tmp_path)} | (params or {}),
                                results={"original": row})
    script = tmp_path / f"optimized_{name}.py"
    script.write_text(emit.script_text(run))
    return script


def test_the_script_says_in_one_line_that_inputs_failed_when_run_from_another_folder(tmp_path, monkeypatch):
    """inputs() reads a data file by a relative path, found where optimize ran: run from elsewhere, the script's check
    ended in a FileNotFoundError traceback out of make_args (a failing import of the workload already said, in one
    line, to run it from that folder)."""
    np.save(tmp_path / "data.npy", np.random.default_rng(1).standard_normal(50))
    monkeypatch.chdir(tmp_path)  # where optimize runs
    script = _script_of(tmp_path, "fromfile", FROM_A_FILE)
    here = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert here.returncode == 0 and "correctness: PASS" in here.stdout, here.stdout + here.stderr
    (tmp_path / "elsewhere").mkdir()
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path / "elsewhere",
                       timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert "fromfile.py: inputs(rng) raised FileNotFoundError" in r.stderr and str(tmp_path) in r.stderr, r.stderr
