"""QA round 13b: interrupted and failing runs of `gpuspeed roofline`, `launch`, `profile`, `kernel` and `bench`, as a
user hits them on a CPU-only machine: Ctrl-C or SIGTERM (`timeout 20 gpuspeed roofline --out DIR`) part-way through,
sent to a real child process once its first progress lines are out. Nothing is left half-written in --out, one line
says what happened, the exit code is 130 (Ctrl-C) or 143 (SIGTERM), and the steps already measured are kept where the
study's steps are independent (roofline)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(q for q in [str(ROOT / "src"), env.get("PYTHONPATH")] if q)
    env.pop("COLUMNS", None)
    return env


def stopped(args: list[str], sig: int, after: str, cwd: Path, times: int = 1) -> tuple[int, str, str]:
    """Run `python -m gpuspeed *args` and send it `sig` once `after` has appeared `times` times in its stderr.
    Returns (exit code, stdout, stderr)."""
    p = subprocess.Popen([sys.executable, "-m", "gpuspeed", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=_env(), cwd=cwd)
    err = []
    seen = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        err.append(line)
        if after in line:
            seen += 1
            if seen == times:
                p.send_signal(sig)
                break
    out, rest = p.communicate(timeout=120)
    return p.returncode, out, "".join(err) + rest


def _no_temp(folder: Path) -> None:
    left = [p.name for p in folder.iterdir() if p.name.startswith(".") or p.name.endswith(".tmp")]
    assert not left, left


def _one_line(err: str, word: str) -> str:
    assert "Traceback" not in err, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("gpuspeed: ")]
    assert len(lines) == 1 and word in lines[0], err[-3000:]
    return lines[0]


def test_roofline_stopped_by_sigterm_keeps_the_steps_it_measured(tmp_path):
    # `timeout 20 gpuspeed roofline --out DIR`: SIGTERM killed it where it stood (exit -15, not a word), the empty
    # --out folder it had made stayed, and the ceilings it had measured for its minutes were lost
    out = tmp_path / "res"
    rc, stdout, err = stopped(["roofline", "--quick", "--no-place", "--out", str(out)], signal.SIGTERM,
                              "gpuspeed roofline [", tmp_path, times=2)
    assert rc == 143, (rc, err[-3000:])
    line = _one_line(err, "stopped by SIGTERM")
    assert "stopped after 2 of" in line and "partial" in line, line
    doc = json.loads((out / "roofline.json").read_text())
    assert doc["params"]["partial"] is True and doc["notes"][0].startswith("partial: stopped after 2 of")
    ceilings = [r for r in doc["rows"] if r["section"] == "ceiling"]
    assert [r["name"] for r in ceilings][:1] == ["copy"] and ceilings[0]["value"] > 0  # what it measured, kept
    assert doc["summary"]["copy_GBps"] > 0 and doc["summary"]["fp32_TFLOPs"] is None  # not run: null
    assert "partial" in (out / "roofline.md").read_text() and (out / "roofline.png").is_file()
    _no_temp(out)
    # a partial roof is not taken for a whole one (kernel reports, place(), notebook 01)
    from gpuspeed.errors import UserError
    from gpuspeed.roofline.study import ceilings_from_results

    try:
        ceilings_from_results(doc)
    except UserError as exc:
        assert "partial" in str(exc)
    else:
        raise AssertionError("a partial roofline document was taken as a roof")


def test_roofline_ctrl_c_before_a_step_ends_leaves_nothing(tmp_path):
    # interrupted during its first step: nothing measured, nothing written, no empty folder, the CLI's line, 130
    out = tmp_path / "res"
    rc, _, err = _ctrl_c_at_start(out, tmp_path)
    assert rc == 130, (rc, err[-3000:])
    _one_line(err, "interrupted")
    assert not out.exists()


def _ctrl_c_at_start(out: Path, cwd: Path):
    """Ctrl-C a roofline run right after it started measuring (its --out made, no step ended)."""
    p = subprocess.Popen([sys.executable, "-m", "gpuspeed", "roofline", "--quick", "--no-place", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=cwd)
    deadline = time.monotonic() + 60
    while not out.exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.02)
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    stdout, err = p.communicate(timeout=120)
    return p.returncode, stdout, err
