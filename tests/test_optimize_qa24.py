"""QA round 24, optimize: a confirmation skipped or stopped for one worker's limit, not for the run's time.

- a confirmation whose estimate fit the time the candidates left but not one worker's limit (a backend's cap, or the
  caller's candidate_limit_s) was labelled cause "time_budget", and the report told the user that a larger
  --time-budget leaves room to confirm it: it would not (the limit is per worker).
"""
from __future__ import annotations

import pytest

from optimize_script_helpers import optimize_text
from test_optimize_qa23b import FAST_ORIGINAL
from test_optimize_qa23b import SLOW_ORIGINAL as SLOW_2S

# the round-23 workload at 1 s a call, not 2
SLOW_ORIGINAL = SLOW_2S.replace("time.sleep(2.0)", "time.sleep(1.0)")


def test_a_confirmation_over_one_workers_limit_is_not_blamed_on_the_time_budget(tmp_path):
    # 1 s a call: three rounds of five calls a side take ~20 s, more than the 10 s one worker may take here, while
    # the 120 s budget leaves far more than that
    run = optimize_text(tmp_path, "slow", SLOW_ORIGINAL, ["variant"], time_budget=120, candidate_limit_s=10)
    assert run.choice["primary"] == "variant:fast"
    conf = run.choice["confirmation"]
    assert conf["status"] == "skipped" and conf["cause"] == "worker_limit", conf
    assert "one worker may take" in conf["reason"], conf
    report = (run.out_dir / "report.md").read_text()
    assert "larger --time-budget leaves room" not in report, report
    assert "one worker" in report, report


def test_a_lock_file_removed_as_this_run_opened_it_is_not_taken_for_the_folders_lock(tmp_path, monkeypatch):
    # a run ending removes its lock file while holding it; a run that had opened that file just before could then
    # lock the removed file while a third run locks the new one: two runs in one --out. The file locked must be the
    # one at the path
    import contextlib
    import fcntl

    import pytest

    from gpuspeed.errors import UserError
    from gpuspeed.optimize import pipeline

    path = tmp_path / pipeline.LOCK_NAME
    real_flock, third = fcntl.flock, []

    def flock(f, op):
        if not third:  # the first run ends and a third starts, between this run's open and its lock
            path.unlink()
            third.append(open(path, "a"))
            real_flock(third[0], fcntl.LOCK_EX | fcntl.LOCK_NB)
        return real_flock(f, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    path.touch()  # the first run's file
    with contextlib.ExitStack() as stack:
        token = pipeline._HELD.set({"stack": stack, "locked": set()})
        try:
            with pytest.raises(UserError, match="another gpuspeed optimize is running there"):
                pipeline._hold_folder(tmp_path)
        finally:
            pipeline._HELD.reset(token)
    third[0].close()


def _rounds(*ratios):
    """A confirmation worker's rounds whose ratios (original over candidate) are these."""
    return {"rounds": [{"original": 1.0, "device_time": 1.0 / r} for r in ratios], "ways": ["device_time"]}


SEPARATE = {"name": "numba", "speedup": {"speedup": 1.24, "ci_low": 1.2, "ci_high": 1.3, "verdict": "faster"}}


def test_rounds_that_disagree_with_each_other_do_not_confirm_a_speedup_they_do_not_show():
    # a loaded machine: report.md said "numba is 0.00551x [0.00546, 1.26] ...: it agrees with the separate timings
    # (1.24x)". Its range met the separate CI only through one round of three; its median says another thing
    from gpuspeed.optimize import confirm as K

    conf = K.judge(dict(SEPARATE), _rounds(0.00546, 0.00551, 1.26), "device")
    assert conf["status"] != "ok" and not conf["agreed"] and not conf["replaced"], conf
    assert "rounds disagree" in conf["reason"], conf
    assert "agrees" not in K.line(conf) and "not confirmed" in K.line(conf), K.line(conf)


@pytest.mark.parametrize(("ratios", "agreed"), [((1.22, 1.25, 1.27), True), ((0.9, 1.25, 1.6), True),
                                                ((2.9, 3.0, 3.1), False)])
def test_consistent_rounds_agree_or_replace_as_before(ratios, agreed):
    from gpuspeed.optimize import confirm as K

    conf = K.judge(dict(SEPARATE), _rounds(*ratios), "device")
    assert conf["status"] == "ok" and conf["agreed"] == agreed and conf["replaced"] == (not agreed), conf


def test_report_table_is_in_the_order_the_run_ranked_by(tmp_path):
    # ranked end to end (the CPU's default), the table was sorted by device-resident time: a float32 candidate whose
    # casts make it the slower end to end stood above the one ranked first
    from gpuspeed.optimize import report

    class Run:
        params = {"rank_by": "e2e", "seeds": [1, 2, 3]}
        results = {"a": {"status": "ok", "device_time": {"median": 1.0}, "e2e_time": {"median": 3.0}},
                   "b": {"status": "ok", "device_time": {"median": 2.0}, "e2e_time": {"median": 2.5}}}

    assert report.table_order(Run()) == ["b", "a"]
    Run.params = {"rank_by": "device"}
    assert report.table_order(Run()) == ["a", "b"]


def test_two_names_that_differ_only_by_punctuation_get_their_own_work_files(tmp_path):
    # variants "a b" and "a_b" shared work/variant_a_b.*: under --jobs 2 their results mixed (the right one read WRONG)
    from gpuspeed.optimize.runner import work_stem

    stems = {work_stem(n) for n in ("variant:a b", "variant:a_b", "variant:a.b", "variant:a-b", "confirm:variant:a b")}
    assert len(stems) == 5, stems
    assert work_stem("numba") == "numba" and work_stem("torch-compile-fp32") == "torch-compile-fp32"


def test_a_plot_that_fails_loses_neither_the_report_nor_the_json_and_leaves_no_half_written_png(tmp_path, monkeypatch):
    # the plot was drawn first and saved straight to its path: a failed save (a full disk, a broken backend) ended
    # the run before report.md and the JSON were written, and left a partial PNG
    import matplotlib.figure

    def failing_save(self, fname, *args, **kwargs):
        with open(fname, "wb") as f:
            f.write(b"\x89PNG partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", failing_save)
    run = optimize_text(tmp_path, "fast", FAST_ORIGINAL, ["variant"], time_budget=60)
    out = run.out_dir
    assert (out / "report.md").is_file() and (out / "optimize_fast.json").is_file()
    assert not (out / "optimize_fast.png").exists()
    assert not [p for p in out.iterdir() if "tmp" in p.name], list(out.iterdir())
    assert any("plot failed" in n for n in run.notes), run.notes



SCALED_FROM_A_FILE = """
    import numpy as np


    def original(x):
        return np.sqrt(np.abs(x)) * 2.0


    def inputs(rng, scale=1.0):
        data = np.load("data.npy")  # relative: found from the folder optimize ran in
        return (data[: max(1, int(50 * scale))] * rng.standard_normal(1),)
    """


def test_the_scripts_inputs_failure_names_the_call_with_its_scale(tmp_path, monkeypatch):
    # the script calls inputs(rng, scale=SCALE) where the workload's takes one; its error said "inputs(rng) raised",
    # a call that was not made
    import subprocess
    import sys

    import numpy as np

    from test_optimize_qa12 import _script_of

    np.save(tmp_path / "data.npy", np.random.default_rng(1).standard_normal(50))
    monkeypatch.chdir(tmp_path)
    script = _script_of(tmp_path, "scaled", SCALED_FROM_A_FILE)
    (tmp_path / "elsewhere").mkdir()
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path / "elsewhere",
                       timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "scaled.py: inputs(rng, scale=" in r.stderr and ") raised FileNotFoundError" in r.stderr, r.stderr
