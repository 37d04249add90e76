"""`gpuspeed optimize` as a demanding user drives it (QA pass 8), CPU only: the recorded scale of a workload whose
inputs() takes none, a candidate stopped by the run's --time-budget run again by --resume, the end-to-end time of a
float32 candidate on the CPU (its casts included), an unreadable run.json / refs.pkl under --resume, dict outputs paired
by key, bfloat16 outputs held to bfloat16's tolerance, an original that changes the working directory, Numba on what it
cannot compile (a ufunc, a partial, a ufunc's out=) as unavailable, and a kept original not reported as checked."""

import json
import os
import subprocess
import sys
import textwrap

from gpuspeed.optimize import workload as W
from gpuspeed.optimize.pipeline import optimize
from gpuspeed.optimize.runner import Runner


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


NO_SCALE = '''
import numpy as np


def original(x):
    return np.tanh(x) * 2.0


def inputs(rng):
    return (rng.standard_normal(2000),)
'''


def test_a_workload_without_scale_records_scale_1_and_resumes_after_a_scale_flag(tmp_path):
    # without a GPU, a workload whose inputs() takes no `scale` was recorded at scale 0.1 (params, JSON, the script's
    # SCALE) though its inputs were full size; and a run with --scale 2 (ignored, recorded 1) refused --resume
    # without it: "holds a run of another workload or settings"
    p = _write(tmp_path, "noscale.py", NO_SCALE)
    assert W.load(p, gpu=False).scale == 1.0
    assert W.load(p, gpu=False, scale=2.0).scale == 1.0
    out = tmp_path / "out"
    optimize(p, device="cpu", out=out, backends=["numpy"], time_budget=180, bench_budget_s=0.05, scale=2.0)
    run = optimize(p, device="cpu", out=out, backends=["numpy"], time_budget=180, bench_budget_s=0.05, resume=True)
    assert run.params["scale"] == 1.0
    assert json.loads((out / "run.json").read_text())["scale"] == 1.0


def test_resume_runs_again_a_candidate_the_runs_time_budget_stopped(tmp_path):
    # a candidate killed at the run's deadline was kept as "timed out" by --resume: rerun with a larger
    # --time-budget, the original stayed unmeasured and no speedup could ever be had from the resumed run
    out = tmp_path / "out"
    out.mkdir()
    rows = [{"name": "original", "status": "timeout", "at_deadline": True,
             "reason": "stopped at the run's time budget during timing (device-resident)"},
            {"name": "numba", "status": "timeout", "reason": "stopped at the run's time budget during first call"},
            {"name": "numpy-fp32", "status": "timeout", "reason": "killed after 90 s (time limit) during timing"},
            {"name": "variant:x", "status": "ok"}]
    (out / "candidates.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = Runner(out, {}, resume=True).done
    assert sorted(done) == ["numpy-fp32", "variant:x"]  # its own time limit is a result; the run's end is not


SLOW = '''
import time

import numpy as np


def original(x):
    time.sleep(0.4)
    return x * 2.0


def inputs(rng):
    return (rng.standard_normal(100),)
'''


def test_a_resumed_run_with_more_time_measures_the_original_its_deadline_stopped(tmp_path):
    p = _write(tmp_path, "slow.py", SLOW)
    out = tmp_path / "out"
    first = optimize(p, device="cpu", out=out, backends=["numpy"], time_budget=5, bench_budget_s=0.5)
    assert first.results["original"]["status"] == "timeout"
    assert first.results["original"]["at_deadline"] is True
    run = optimize(p, device="cpu", out=out, backends=["numpy"], time_budget=180, bench_budget_s=0.1, resume=True)
    assert run.results["original"]["status"] == "ok"
    assert run.results["original"]["device_time"]["median"] >= 0.4


DEMOTABLE = '''
import numpy as np

TOLERANCE = dict(rtol=1e-5)


def original(x, y):
    return np.sqrt(x * x + y * y)


def inputs(rng):
    return rng.standard_normal(200_000), rng.standard_normal(200_000)
'''


def test_a_cpu_float32_candidates_end_to_end_time_includes_its_casts(tmp_path):
    # numpy-fp32's "end to end" was its device-resident time relabelled: the float64 -> float32 casts of its inputs
    # and the cast of its output back, which every call of the emitted script does, were never timed (the report
    # said 2.54x end to end where the casts made it 1.46x)
    p = _write(tmp_path, "hyp.py", DEMOTABLE)
    run = optimize(p, device="cpu", out=tmp_path / "out", backends=["numpy"], time_budget=180, bench_budget_s=0.1)
    row = run.results["numpy-fp32"]
    assert row["status"] == "ok"
    assert row["e2e_time"]["name"] == "numpy-fp32 (end to end)"
    assert row["e2e_time"]["samples"] != row["device_time"]["samples"]
    # the original's own: nothing to cast, its end to end is its one timing
    assert run.results["original"]["e2e_time"] == run.results["original"]["device_time"]


def test_resume_from_an_unreadable_run_json_or_refs_pkl_is_one_line(tmp_path, capsys):
    # an empty or truncated run.json, or a truncated refs.pkl (a run killed while writing them), was a
    # JSONDecodeError / UnpicklingError traceback under --resume
    from gpuspeed.cli import main

    p = _write(tmp_path, "noscale.py", NO_SCALE)
    out = tmp_path / "out"
    optimize(p, device="cpu", out=out, backends=["numpy"], time_budget=180, bench_budget_s=0.05)
    argv = ["optimize", str(p), "--device", "cpu", "--out", str(out), "--backends", "numpy", "--resume"]
    good_json, good_refs = (out / "run.json").read_text(), (out / "refs.pkl").read_bytes()
    for name, bad in (("run.json", ""), ("run.json", "[1, 2]"), ("refs.pkl", good_refs[:40])):
        (out / "run.json").write_text(good_json)
        (out / "refs.pkl").write_bytes(good_refs)
        (out / name).write_bytes(bad.encode() if isinstance(bad, str) else bad)
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"gpuspeed: error: --resume: {out / name} cannot be read") and "\n" not in err, err
    assert not list(out.glob("*.tmp"))


DICT_OUT = '''
import numpy as np

TOLERANCE = dict(rtol=1e-9)


def original(x):
    return {"labels": np.argmax(x, axis=1), "centers": x.mean(axis=0)}


def by_hand(x):
    centers = x.sum(axis=0) / x.shape[0]
    return {"centers": centers, "labels": x.argmax(axis=1)}  # the same answer, its keys in another order


def renamed(x):
    return {"label": np.argmax(x, axis=1), "center": x.mean(axis=0)}


variants = {"by_hand": by_hand, "renamed": renamed}


def inputs(rng):
    return (rng.standard_normal((500, 3)),)
'''


def test_a_variant_returning_the_same_dict_in_another_key_order_is_correct(tmp_path):
    # its leaves were paired by position: 'output 0: shape (3,), the original's (500,)', a correct variant
    # rejected as WRONG shape/dtype; keys that differ are still wrong
    p = _write(tmp_path, "dicts.py", DICT_OUT)
    run = optimize(p, device="cpu", out=tmp_path / "out", backends=["variant"], time_budget=180, bench_budget_s=0.05)
    assert run.results["variant:by_hand"]["status"] == "ok", run.results["variant:by_hand"].get("reason")
    assert run.results["variant:renamed"]["status"] == "incorrect"
    assert "keys differ" in run.results["variant:renamed"]["reason"]
    # the emitted script pairs them by key too (it said 'seed 101 output 0: int64[500] against float64[3]'), and a
    # dict with other keys fails its check (its values, in order, had passed)
    from gpuspeed.optimize import emit

    for name, passes in (("variant:by_hand", True), ("variant:renamed", False)):
        run.choice = {"primary": name}
        script = tmp_path / "out" / "optimized_dicts.py"
        script.write_text(emit.script_text(run))
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert (r.returncode == 0) is passes and ("correctness: PASS" in r.stdout) is passes, r.stdout + r.stderr
        if not passes:
            assert "keys 'center', 'label' against the original's 'centers', 'labels'" in r.stdout, r.stdout


BF16 = '''
import torch


def original(x, y):
    return torch.tanh(x * 1.7 + y) * torch.sigmoid(y - x) + x * y


def fused(x, y):  # computed in float32 and rounded once, as a fused kernel (Inductor's, a hand kernel) does
    x32, y32 = x.float(), y.float()
    return (torch.tanh(x32 * 1.7 + y32) * torch.sigmoid(y32 - x32) + x32 * y32).to(torch.bfloat16)


variants = {"fused": fused}


def inputs(rng):
    g = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    return (torch.randn(2048, 64, generator=g, dtype=torch.bfloat16),
            torch.randn(2048, 64, generator=g, dtype=torch.bfloat16))
'''


def test_bfloat16_outputs_are_checked_at_bfloat16s_tolerance(tmp_path):
    # NumPy has no bfloat16: the outputs reached gpuspeed.check as float32 and were held to float32's rtol 1e-5, so
    # a candidate one bfloat16 rounding away (torch.compile, a fused kernel, the GPU's own ops) was WRONG
    p = _write(tmp_path, "bf.py", BF16)
    run = optimize(p, device="cpu", out=tmp_path / "out", backends=["variant"], time_budget=180, bench_budget_s=0.05)
    row = run.results["variant:fused"]
    assert row["status"] == "ok", row.get("reason")
    assert row["max_abs_err"] > 0  # not bit-identical: float32's default would have failed it
    assert run.params["rtol"] == 1e-2 and "bfloat16" in run.params["tolerance_source"]
    assert json.loads((tmp_path / "out" / "run.json").read_text())["bf16_outputs"] is True
    run.choice = {"primary": "variant:fused"}
    from gpuspeed.optimize import emit

    script = tmp_path / "out" / "optimized_bf.py"
    script.write_text(emit.script_text(run))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and "correctness: PASS" in r.stdout, r.stdout + r.stderr
    # a stated tolerance still rules
    (tmp_path / "bf_tol.py").write_text("TOLERANCE = dict(rtol=1e-5)\n" + textwrap.dedent(BF16))
    run = optimize(tmp_path / "bf_tol.py", device="cpu", out=tmp_path / "out2", backends=["variant"], time_budget=180,
                   bench_budget_s=0.05)
    assert run.results["variant:fused"]["status"] == "incorrect"


CHDIR = '''
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def original(x):
    os.chdir(os.path.join(HERE, "data"))  # code that moves to its data folder (and stays there)
    return np.sin(x) * 2.0


def inputs(rng):
    return (rng.standard_normal(1000),)
'''


def test_an_original_that_changes_the_working_directory_does_not_move_the_report(tmp_path, monkeypatch):
    # the reference calls ran in the optimize process: the relative --out (and the run's work files) then resolved
    # in the folder the original moved to, and `report: out/report.md` named a file that was not there
    p = _write(tmp_path, "cd.py", CHDIR)
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    run = optimize("cd.py", device="cpu", out="out", backends=["numpy"], time_budget=180, bench_budget_s=0.05)
    assert run.results["original"]["status"] == "ok", run.results["original"].get("reason")
    assert (tmp_path / "out" / "report.md").is_file() and (tmp_path / "out" / "optimized_cd.py").is_file()
    assert not (tmp_path / "data" / "out").exists()
    assert os.getcwd() == str(tmp_path)
    assert any("changes the working directory" in n for n in run.notes)
    assert p.is_file()


def test_numba_of_an_original_that_is_no_python_function_is_unavailable_not_failed(tmp_path):
    # `from numpy import sin as original` (a ufunc) or a functools.partial: numba.njit's TypeError made the candidate
    # 'failed' (a crash, as the report's 'why below 2x' read it) where Numba simply does not apply
    p = _write(tmp_path, "uf.py", '''
        import functools

        import numpy as np
        from numpy import sin as original


        def scaled(x, k):
            return np.sin(x) * k


        partial_one = functools.partial(scaled, k=2.0)


        def inputs(rng):
            return (rng.standard_normal(1000),)
    ''')
    for func in ("original", "partial_one"):
        run = optimize(p, func=func, device="cpu", out=tmp_path / func, backends=["numba"], time_budget=180,
                       bench_budget_s=0.05)
        row = run.results["numba"]
        assert row["status"] == "unavailable", row
        assert "Numba compiles Python functions" in row["reason"]


def test_numba_that_cannot_lower_a_ufuncs_out_argument_is_unavailable_not_failed(tmp_path):
    # np.sin(x, out=out), the usual in-place idiom: Numba's lowering raises the builtin NotImplementedError ('unsupported
    # keyword arguments when calling Function(<ufunc 'sin'>)'), which made the candidate 'failed' (a crash)
    p = _write(tmp_path, "outarg.py", '''
        import numpy as np


        def original(x, out):
            np.sin(x, out=out)
            out *= 2.0


        def inputs(rng):
            return rng.standard_normal(1000), np.zeros(1000)
    ''')
    run = optimize(p, device="cpu", out=tmp_path / "out", backends=["numba"], time_budget=180, bench_budget_s=0.05)
    row = run.results["numba"]
    assert row["status"] == "unavailable", row
    assert "cannot compile original" in row["reason"] and "unsupported keyword arguments" in row["reason"]


def test_a_kept_original_is_not_reported_correct_on_three_fresh_seeds(tmp_path):
    # the summary said 'Correct on 3 fresh seeds: max abs error 0' of the original itself, which is the reference
    # and was called once, on one seed, against its own output
    p = _write(tmp_path, "noscale.py", NO_SCALE)
    run = optimize(p, device="cpu", out=tmp_path / "out", backends=["numpy"], time_budget=180, bench_budget_s=0.05)
    assert run.choice["primary"] == "original"
    text = (tmp_path / "out" / "report.md").read_text()
    assert "Correct on 3 fresh seeds" not in text
    assert "The original is the reference every candidate was checked against" in text
