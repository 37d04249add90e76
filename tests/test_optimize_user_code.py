"""Workloads as users write them, which optimize once judged wrongly or stumbled on: an answer that holds
NaN and Inf, a result buffer reused between calls, unseeded randomness, a chatty module, a profile.py in
the user's folder, a functools.partial, a slow original, a file edited before --resume. CPU only."""

import os
import json
import subprocess
import sys
import textwrap
import time

import pytest

from gpuspeed.errors import UserError
from gpuspeed.optimize.pipeline import optimize

CHATTY_NAN_BUFFER = '''
import numpy as np

print("loading the workload")  # a module that talks: --json output must stay JSON
TOLERANCE = dict(rtol=1e-9, atol=1e-9)
_buf = None


def original(x):
    # the result lives in a buffer reused by every call (a common way to avoid allocations)
    global _buf
    if _buf is None or _buf.shape != x.shape:
        _buf = np.empty_like(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        np.log(x, out=_buf)  # NaN for x < 0, -inf for x == 0
    _buf += 1.0 / np.where(x == 1.0, 0.0, 1.0)  # and +inf where x == 1 (-inf + inf: NaN where both)
    return _buf


def fresh(x):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(x) + 1.0 / np.where(x == 1.0, 0.0, 1.0)


def inputs(rng):
    x = rng.standard_normal(50_000) + 0.5
    x[::97] = 0.0
    x[::101] = 1.0
    return (x,)


variants = {"fresh": fresh}
'''


@pytest.mark.slow
def test_nan_inf_and_a_reused_buffer_are_the_originals_answer(tmp_path):
    (tmp_path / "wl.py").write_text(textwrap.dedent(CHATTY_NAN_BUFFER))
    # a user's own profile.py beside the workload and in the folder they run from: gpuspeed imports cProfile
    # (which imports `profile`), and so do torch and its workers, and must not get this one
    (tmp_path / "profile.py").write_text("raise RuntimeError('the user profile.py was imported')\n")
    # run as the `gpuspeed` console script runs (its own folder first on sys.path, not the current one)
    script = "import sys; sys.path.pop(0); from gpuspeed.cli import main; sys.exit(main())"
    proc = subprocess.run([sys.executable, "-c", script, "optimize", "wl.py", "--device", "cpu", "--backends",
                           "variant", "--out", "out", "--time-budget", "120", "--bench-budget", "0.1", "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)["summary"]  # stdout holds the JSON alone; the module's print went to stderr
    assert "loading the workload" in proc.stderr
    rows = {json.loads(line)["name"]: json.loads(line) for line in (tmp_path / "out" / "candidates.jsonl").open()}
    assert rows["original"]["status"] == "ok", rows["original"].get("reason")
    assert rows["variant:fresh"]["status"] == "ok", rows["variant:fresh"].get("reason")
    assert summary["candidates_correct"] == 1
    assert summary["within_budget"] is None  # no GPU: no GPU memory was held against the budget
    script = tmp_path / "out" / "optimized_wl.py"
    run = subprocess.run([sys.executable, str(script), "--cpu"], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path / "out")
    assert run.returncode == 0 and "correctness: PASS" in run.stdout, run.stdout + run.stderr


NONDETERMINISTIC = '''
import numpy as np


def original(x):
    return x + 0.1 * np.random.standard_normal(x.shape)  # unseeded


def same(x):
    return x + 0.1 * np.random.standard_normal(x.shape)


def inputs(rng):
    return (rng.standard_normal(10_000),)


variants = {"same": same}
'''


@pytest.mark.slow
def test_an_unseeded_original_is_named_nondeterministic_and_nothing_passes(tmp_path):
    p = tmp_path / "rand_wl.py"
    p.write_text(textwrap.dedent(NONDETERMINISTIC))
    run = optimize(p, device="cpu", out=tmp_path / "out", backends=["variant"], time_budget=120, bench_budget_s=0.1)
    orig = run.results["original"]
    assert orig.get("nondeterministic") and orig.get("device_time")  # flagged, and still timed
    assert run.results["variant:same"]["status"] == "unverifiable"  # not "incorrect": nothing says it is wrong
    assert any("not deterministic" in w for w in run.choice["why_not_2x"])
    md = (tmp_path / "out" / "report.md").read_text()
    assert "The original is not deterministic" in md and "Not verifiable" in md and "Correct on" not in md
    assert "| original | not reproducible |" in md
    doc = json.loads((tmp_path / "out" / "optimize_rand_wl.json").read_text())
    assert doc["summary"]["correct"] is None  # not verifiable, neither true nor false
    # the emitted script says so too: its docstring does not claim a check, and its failed check names the cause
    script = tmp_path / "out" / "optimized_rand_wl.py"
    assert "Not checked: the original is not deterministic" in script.read_text()
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 1 and "correctness: FAIL" in r.stdout and "is not deterministic" in r.stdout, r.stdout[-2000:]


def test_bad_jobs_fails_before_anything_is_written(tmp_path):
    p = tmp_path / "wl.py"
    p.write_text("import numpy as np\ndef original(x):\n    return x * 2\ndef inputs(rng):\n"
                 "    return (rng.standard_normal(10),)\n")
    with pytest.raises(UserError, match="--jobs"):
        optimize(p, device="cpu", out=tmp_path / "out", jobs=0)
    assert not (tmp_path / "out").exists()


def test_references_past_half_the_time_budget_stop_the_run_early(tmp_path):
    p = tmp_path / "slow.py"
    p.write_text("import time\ndef original(x):\n    time.sleep(30)\n    return x * 2\ndef inputs(rng):\n"
                 "    return (rng.standard_normal(10),)\n")
    t0 = time.perf_counter()
    with pytest.raises(UserError, match="reference call 1 of 3 within 1 s"):
        optimize(p, device="cpu", out=tmp_path / "out", time_budget=2)
    assert time.perf_counter() - t0 < 15  # interrupted, not slept through
    assert not (tmp_path / "out").exists()
    p.write_text("import time\ndef original(x):\n    time.sleep(0.6)\n    return x * 2\ndef inputs(rng):\n"
                 "    return (rng.standard_normal(10),)\n")
    with pytest.raises(UserError, match="takes .* s a call: its 3 reference calls need"):
        optimize(p, device="cpu", out=tmp_path / "out", time_budget=2.5)  # 3 x 0.6 s > 1.25 s: stops after one


@pytest.mark.slow
def test_resume_refuses_a_workload_edited_since_and_a_partial_original_gets_a_report(tmp_path):
    p = tmp_path / "part.py"
    p.write_text("import functools\nimport numpy as np\ndef f(x, alpha):\n    return np.tanh(alpha * x)\n"
                 "original = functools.partial(f, alpha=2.0)\ndef inputs(rng):\n"
                 "    return (rng.standard_normal(1000),)\n")
    run = optimize(p, device="cpu", out=tmp_path / "out", backends=["numpy"], time_budget=180, bench_budget_s=0.1)
    assert run.results["original"]["status"] == "ok"
    assert "no source to show" in (tmp_path / "out" / "report.md").read_text()
    p.write_text(p.read_text().replace("alpha=2.0", "alpha=3.0"))
    with pytest.raises(UserError, match="changed since the run"):
        optimize(p, device="cpu", out=tmp_path / "out", backends=["numpy"], time_budget=180, resume=True)


HANGS = '''
import time

import numpy as np


def original(x):
    return np.sin(x)


def hangs(x):
    time.sleep(600)
    return np.sin(x)


variants = {"hangs": hangs}


def inputs(rng):
    return (rng.standard_normal(1000),)
'''


def _workers_of(folder, name="hangs") -> list[int]:
    """The optimize workers running in this folder on a candidate whose name holds `name`."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = open(f"/proc/{entry}/cmdline", "rb").read().decode(errors="replace")
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            if cwd == str(folder) and "die_with_parent" in cmd and name in cmd:
                pids.append(int(entry))
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_run_leaves_no_worker_behind(tmp_path):
    """kill -9 of the optimize process: its workers die with it (they would hold the run's lock, and GPU memory)."""
    (tmp_path / "hang_wl.py").write_text(textwrap.dedent(HANGS))
    proc = subprocess.Popen([sys.executable, "-m", "gpuspeed", "optimize", "hang_wl.py", "--device", "cpu",
                             "--backends", "variant", "--out", "out", "--time-budget", "300"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not _workers_of(tmp_path) and time.time() < deadline:
            time.sleep(0.5)
        assert _workers_of(tmp_path), "no worker started"
        time.sleep(1)  # the worker is in the variant's sleep
    finally:
        proc.kill()
        proc.wait()
    deadline = time.time() + 10
    while _workers_of(tmp_path) and time.time() < deadline:
        time.sleep(0.2)
    left = _workers_of(tmp_path)
    for pid in left:
        os.kill(pid, 9)
    assert not left, "a worker outlived the killed run"
