"""A sequential recurrence (ema_filter's kind of code) is planned from the hotspot analysis: Numba's compiled
CPU loop first, the element-by-element GPU drop-ins skipped with the reason, and a report that says why a GPU
is not the route; a loop of array steps (a stencil's time steps) stays on the GPU backends. And the time
budget bounds the whole run even while another run holds the shared lock."""

from __future__ import annotations

import json
import sys
import time

import pytest

from gpuspeed.optimize import analysis, candidates as C, workload

SEQ_WITH_VARIANT = """
import numpy as np
TOLERANCE = dict(rtol=1e-9, atol=1e-12)
def original(x, dt, tau):
    y = np.empty_like(x)
    acc = 0.0
    for i in range(x.shape[0]):
        acc = acc * np.exp(-dt[i] / tau) + x[i]  # an array call per element: still a scalar recurrence
        y[i] = acc
    return y
def inputs(rng):
    return rng.standard_normal(20000), rng.random(20000), 3.0
def same(x, dt, tau):
    return original(x, dt, tau)
variants = {"same": same}
"""

STENCIL_STEPS = """
import numpy as np
TOLERANCE = dict(rtol=1e-6, atol=1e-8)
def original(grid, steps):
    u = grid.copy()
    for _ in range(steps):  # ordered time steps, each a whole-grid array update
        u[1:-1, 1:-1] = u[1:-1, 1:-1] + 0.2 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:]
                                               - 4.0 * u[1:-1, 1:-1])
    return u
def inputs(rng):
    return rng.random((256, 256)), 300
"""


def _hot(wl):
    args = wl.make_args(0)
    t = time.perf_counter()
    wl.original(*args)
    return analysis.analyze(wl, args, time.perf_counter() - t)


def test_a_sequential_recurrence_plans_numba_first_and_skips_the_gpu_drop_ins_with_the_reason(tmp_path, monkeypatch):
    # every backend installed and a GPU present: the decision comes from the hotspot analysis (a hot loop-carried
    # recurrence walked element by element), not from what is installed nor the example's name
    monkeypatch.setattr(C, "installed", lambda name: True)
    p = tmp_path / "decay.py"
    p.write_text(SEQ_WITH_VARIANT)
    wl = workload.load(p, gpu=True)
    hot = _hot(wl)
    assert hot["sequential"] and hot["loop_bound"], hot["hot_loops"]
    for where in ("cuda", "cpu"):
        rows, recs = C.plan(wl, where, hot)
        rows = {r["key"]: r for r in rows}
        names = [r["name"] for r in recs]
        assert names[0] == "numba", names  # the fast route first, before the user's variants
        assert "variant:same" in names and "numba-prange" not in names  # ordered iterations: no prange
        assert not {"cupy", "torch-compile", "jax"} & set(names), names
        for key in ("cupy", "torch_compile", "jax"):  # the reason that holds on any machine, not "no GPU here"
            assert rows[key]["decision"] == "skipped" and "sequential" in rows[key]["why"], rows[key]
        assert "sequential" in rows["numba"]["why"] and rows["sequential"]["decision"] == "note"


def test_ema_filter_is_sequential_and_its_plan_keeps_it_off_the_gpu(monkeypatch):
    monkeypatch.setattr(C, "installed", lambda name: True)
    wl = workload.load("ema_filter", scale=0.05, gpu=True)
    hot = _hot(wl)
    loop = next(lp for lp in hot["hot_loops"] if lp["kind"] == "sequential-loop")
    assert hot["sequential"] and not loop["on_arrays"] and loop["step_s"] < analysis.STEP_LAUNCH_S, loop
    rows, recs = C.plan(wl, "cuda", hot)
    assert [r["name"] for r in recs] == ["numba", "numba-serial"]


def test_time_steps_over_array_slices_are_stepwise_and_stay_on_the_gpu_backends(tmp_path, monkeypatch):
    # 300 ordered steps (more than the 256 that made any carried loop "sequential"), each a 256x256 array update:
    # the GPU runs each step's work in parallel, so the drop-ins are tried (time-capped as loop-bound code)
    monkeypatch.setattr(C, "installed", lambda name: True)
    p = tmp_path / "stencil.py"
    p.write_text(STENCIL_STEPS)
    wl = workload.load(p, gpu=True)
    hot = _hot(wl)
    loop = hot["hot_loops"][0]
    assert loop["kind"] == "sequential-loop" and loop["on_arrays"] and loop["iterations"] >= 256, loop
    assert not hot["sequential"] and hot["stepwise"], hot["implications"]
    rows, recs = C.plan(wl, "cuda", hot)
    names = [r["name"] for r in recs]
    assert {"cupy", "torch-compile"} <= set(names), names
    assert names.index("cupy") < names.index("numba")


def test_a_sequential_run_says_why_a_gpu_is_not_the_route_and_names_numba(tmp_path):
    from gpuspeed.optimize.pipeline import optimize

    run = optimize("ema_filter", device="cpu", scale=0.02, out=tmp_path / "o", time_budget=90, bench_budget_s=0.1)
    ch = run.choice
    assert run.hot["sequential"]
    assert "sequential dependence" in ch["why_not_gpu"] and "line 15" in ch["why_not_gpu"]
    assert "Numba" in ch["fastest_route"]
    report = (tmp_path / "o" / "report.md").read_text()
    rows = {r["key"]: r for r in run.plan_rows}
    if C.installed("numba"):
        assert ch["primary"] in ("numba", "numba-serial") and "Not 2x on the GPU" in report, report[:2000]
    else:
        assert rows["numba"]["why"] == "numba is not installed" and "not installed" in ch["fastest_route"]
        assert any("not installed: numba" in w for w in ch["why_not_2x"]), ch["why_not_2x"]
        assert any("sequential dependence" in w for w in ch["why_not_2x"]) and "Below 2x because" in report
    doc = json.loads((tmp_path / "o" / "optimize_ema_filter.json").read_text())
    assert doc["choice"]["why_not_gpu"] == ch["why_not_gpu"]


def test_the_whole_run_ends_within_its_time_budget_while_another_run_holds_the_lock(held_lock_run):
    # benchmarks/optimize.py runs examples side by side under one lock: a run whose start (references, hotspots)
    # and whose original wait for another run's measurement still ends within --time-budget, report written
    import subprocess

    budget = 20  # the lock stays held (a measurement of another run that outlasts this whole run)
    t0 = time.perf_counter()
    proc, out = held_lock_run.start(budget)
    try:
        _, err = proc.communicate(timeout=budget + 25)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the run did not end within its {budget} s budget (+25 s) while the lock was held")
    wall = time.perf_counter() - t0
    held_lock_run.release()
    assert proc.returncode == 0, err
    assert wall < budget + 2, wall  # the whole process: interpreter start-up, report and script included
    doc = json.loads((out / "optimize_w.json").read_text())
    orig = next(r for r in doc["rows"] if r["name"] == "original")
    assert orig["status"] == "timeout" and "time budget" in orig["reason"], orig
    assert doc["summary"]["within_time_budget"] and doc["summary"]["minutes"] * 60 <= wall
    assert any("without the shared lock" in n for n in doc["notes"]), doc["notes"]
    assert (out / "report.md").is_file() and (out / "optimized_w.py").is_file()


def test_benchmark_rerun_of_some_examples_keeps_the_other_rows_and_counts_sequential_ones_out(tmp_path):
    # re-measuring a few examples on the H200 merges into the committed optimize.json: the other rows stay as
    # they were, and the re-run sequential example (ema_filter) is no longer counted as one a GPU can help
    import shutil
    import subprocess
    from pathlib import Path

    from gpuspeed.device import get_device

    root = Path(__file__).resolve().parents[1]
    shutil.copy(root / "results" / "nvidia-h200" / "optimize.json", tmp_path / "optimize.json")
    # rows are merged only into a file of the same device: the H200's file as if it were this CPU's
    earlier = json.loads((tmp_path / "optimize.json").read_text())
    earlier["device"] = get_device("cpu").to_dict() | {"slug": "cpu"}
    (tmp_path / "optimize.json").write_text(json.dumps(earlier))
    before = {r["example"]: r for r in earlier["rows"]}
    assert "ema_filter" in before and len(before) > 1
    r = subprocess.run([sys.executable, "benchmarks/optimize.py", "--out", str(tmp_path), "--device", "cpu",
                        "--examples", "ema_filter", "--scale", "0.02", "--time-budget", "60", "--bench-budget", "0.1"],
                       capture_output=True, text=True, timeout=180, cwd=root)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "optimize.json").read_text())
    rows = {row["example"]: row for row in doc["rows"]}
    assert set(rows) == set(before)
    assert all(rows[k] == v for k, v in before.items() if k != "ema_filter")  # kept untouched
    ema = rows["ema_filter"]
    assert ema["ok"] and ema["sequential"] and "sequential dependence" in ema["why_not_gpu"]
    assert ema["minutes"] < 1 and ema["run_minutes"] <= ema["minutes"] and ema["within_time_budget"]
    helpable = [k for k, v in rows.items() if v.get("ok") and not v.get("sequential")]
    assert doc["summary"]["examples_gpu_can_help"] == len(helpable) and "ema_filter" not in helpable
    assert any("kept from an earlier call" in n for n in doc["notes"])
