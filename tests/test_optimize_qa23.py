"""QA round 23, optimize: the primary's confirmation has time left for it.

The confirmation ran after every candidate, on whatever time they had left. On the H200 the bundled examples fill
their 5 minutes with candidates (4.7-4.9 min each), so an original of seconds a call (five calls a side a round) was
left unconfirmed. The candidates' limits now leave the confirmation's time aside, estimated from the original's
rough time a call before any candidate starts (the original itself runs to the deadline: every speedup divides it).
"""
from __future__ import annotations

import textwrap

import pytest

from optimize_script_helpers import optimize_text

FILLS_THE_BUDGET = '''
import time

import numpy as np


def original(x):
    return np.sort(np.sort(np.sort(x)))


def inputs(rng):
    return (rng.standard_normal(20000),)


def sorted_once(x):
    return np.sort(x)


def sorted_slowly(x):  # right, but each call takes longer than the whole run
    time.sleep(600)
    return np.sort(x)


variants = {"sorted_once": sorted_once, "sorted_slowly": sorted_slowly}
'''


def test_a_candidate_that_would_run_to_the_deadline_leaves_the_confirmation_its_time(tmp_path):
    # a 45 s run keeps 15 s for the report: without the reserve sorted_slowly ran to the deadline and the primary
    # was left unconfirmed ("under 8 s of --time-budget 60 s was left"); now it stops that much earlier. 45 s, not
    # less: 40 % of the ~28 s span left is over a candidate's least 8 s, under which no reserve is kept at all
    budget = 45
    run = optimize_text(tmp_path, "fills", FILLS_THE_BUDGET, ["variant"], time_budget=budget, jobs=1)
    slow = run.results["variant:sorted_slowly"]
    assert slow["status"] == "timeout" and "kept for confirming the fastest candidate" in slow["reason"], slow
    name = "variant:sorted_once"
    assert run.choice["primary"] == name
    conf = run.choice["confirmation"]
    assert conf["status"] == "ok" and conf["rounds"] == 5, conf
    reserve = run.params["confirm_reserve_s"]
    assert 0 < reserve <= 0.4 * budget, reserve
    assert run.elapsed_s < budget, run.elapsed_s


def test_the_reserve_grows_with_the_original_and_stops_at_its_share_of_the_budget():
    from gpuspeed.optimize import confirm as K

    fast = K.reserve_s(0.001, 1.5, 300)
    slow = K.reserve_s(3.3, 1.5, 300)  # row_stats' original on the H200: five rounds of five calls and a start
    assert K.START_GUESS_S < fast < slow == pytest.approx(20 + 5 * (5 * 3.3 + 2 * 0.3))
    # pairwise_distance's 6.2 s: five rounds do not fit 40 % of 300 s, so it stops there, where three rounds fit
    slowest = K.reserve_s(6.2, 1.5, 300)
    assert slowest == pytest.approx(K.RESERVE_SHARE * 300)
    three = K.estimate_s({"device_time": {"median": 6.2}}, {"device_time": {"median": 1e-3}}, K.FEWEST_ROUNDS, 1.5)
    assert three + K.START_GUESS_S <= slowest
    assert K.reserve_s(3.3, 1.5, 10) == pytest.approx(4.0)


def test_the_estimate_counts_end_to_end_only_where_the_candidate_was_timed_that_way():
    from gpuspeed.optimize import confirm as K

    original = {"device_time": {"median": 0.2}}
    device = {"median": 0.01}
    one_way = {"device_time": device, "e2e_time": dict(device)}  # the worker copies device_time where they agree
    two_way = {"device_time": device, "e2e_time": {"median": 0.05}}
    assert not K.two_way(one_way) and K.two_way(two_way)
    # a round: the original's 5 calls (1 s) and the candidate's least calls or its share of the bench budget
    assert K.estimate_s(original, one_way, 5, 1.5) == pytest.approx(5 * (1.0 + 0.3))
    assert K.estimate_s(original, two_way, 5, 1.5) == pytest.approx(5 * (1.0 + 0.3 + 0.3))


SORTS = '''
import numpy as np


def original(x):
    return np.sort(np.sort(x))


def inputs(rng):
    return (rng.standard_normal(5000),)
'''


def test_a_second_run_into_a_folder_another_run_holds_is_refused_in_one_line(tmp_path):
    # a --resume started while the first run still ran read its half-written files, appended to its
    # candidates.jsonl, and the first run's confirmation read "crashed (exit code 0)"
    import fcntl
    import subprocess
    import sys

    from gpuspeed.optimize.pipeline import LOCK_NAME

    p = tmp_path / "sorts.py"
    p.write_text(textwrap.dedent(SORTS))
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("kept")
    with open(out / LOCK_NAME, "a") as held:  # what a running optimize holds
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        cp = subprocess.run([sys.executable, "-m", "gpuspeed", "optimize", str(p), "--device", "cpu", "--out", str(out),
                             "--time-budget", "30"], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 2, cp.stderr
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and "another gpuspeed optimize is running there" in lines[0], cp.stderr
    assert sorted(f.name for f in out.iterdir()) == sorted([LOCK_NAME, "mine.txt"])  # nothing of its own written


def test_a_run_leaves_no_lock_behind_and_the_next_run_there_goes_ahead(tmp_path):
    from gpuspeed.optimize.pipeline import LOCK_NAME, optimize

    p = tmp_path / "sorts.py"
    p.write_text(textwrap.dedent(SORTS))
    kw = dict(device="cpu", out=tmp_path / "out", backends=["numpy"], time_budget=40, bench_budget_s=0.05)
    optimize(p, **kw)
    assert not (tmp_path / "out" / LOCK_NAME).exists()
    run = optimize(p, resume=True, **kw)  # in the same process: the first run's hold is gone with it
    assert run.results["original"]["status"] == "ok"
    assert not (tmp_path / "out" / LOCK_NAME).exists()


SLOW_ORIGINAL = '''
import time

import numpy as np


def original(x):
    time.sleep(1.5)  # five calls a side a round: three rounds cannot fit what a 60 s run may keep
    return np.sort(x)


def inputs(rng):
    return (rng.standard_normal(20000),)


def sorted_fast(x):
    return np.sort(x)


def sorted_slowly(x):
    time.sleep(600)
    return np.sort(x)


variants = {"sorted_fast": sorted_fast, "sorted_slowly": sorted_slowly}
'''


def test_no_time_is_kept_for_a_confirmation_that_could_not_fit_it(tmp_path):
    # H100, pairwise_distance (6.1 s a call): 104 s were kept, the confirmation needed ~140 s and was skipped all the
    # same, and the last candidates lost those 104 s for nothing
    run = optimize_text(tmp_path, "slow_original", SLOW_ORIGINAL, ["variant"], time_budget=60, jobs=1)
    assert run.params["confirm_reserve_s"] == 0.0
    slow = run.results["variant:sorted_slowly"]
    assert slow["status"] == "timeout" and slow.get("at_deadline"), slow
    assert "kept for confirming" not in slow["reason"], slow["reason"]
    conf = run.choice["confirmation"]
    assert conf["status"] == "skipped" and "rounds would take about" in conf["reason"], conf
