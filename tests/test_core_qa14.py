"""QA round 14, core: the instruments and the CLI shell as a demanding user meets them on a CPU-only machine.
Interrupted runs that must not destroy a good measurement, signals that arrive before a command is ready for them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_interrupt_qa13 import _env, _no_temp, _one_line, stopped

ROOT = Path(__file__).resolve().parents[1]


def _gpuspeed(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuspeed", *args], capture_output=True, text=True, env=_env(),
                          cwd=cwd, timeout=300)


# -- 1. an interrupted run keeps a complete file already in --out ------------------------------------------------

def test_roofline_stopped_keeps_the_complete_roofline_json_already_there(tmp_path):
    # a whole `gpuspeed roofline --out DIR` ran; a second one into the same folder was stopped by `timeout`: its partial
    # roofline.json replaced the good one (the roof kernel reports and notebooks read), which was lost
    out = tmp_path / "res"
    done = _gpuspeed("roofline", "--quick", "--no-place", "--no-sweep", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    whole = (out / "roofline.json").read_text()
    assert not json.loads(whole)["params"].get("partial")
    rc, _, err = stopped(["roofline", "--quick", "--no-place", "--out", str(out)], signal.SIGTERM,
                         "gpuspeed roofline [", tmp_path, times=2)
    assert rc == 143, (rc, err[-3000:])
    line = _one_line(err, "stopped by SIGTERM")
    assert str(out / "roofline.partial.json") in line and f"{out / 'roofline.json'} is kept" in line, line
    assert (out / "roofline.json").read_text() == whole  # the complete one, untouched
    part = json.loads((out / "roofline.partial.json").read_text())
    assert part["params"]["partial"] is True and part["summary"]["copy_GBps"] > 0
    assert (out / "roofline.partial.md").is_file() and (out / "roofline.partial.png").is_file()
    _no_temp(out)
    from gpuspeed.results import read_results
    from gpuspeed.roofline.study import ceilings_from_results

    assert ceilings_from_results(read_results(out / "roofline.json")).rows  # still the roof it was


def test_launch_stopped_keeps_the_complete_launch_json_already_there(tmp_path):
    out = tmp_path / "res"
    args = ["launch", "--ks", "1,2,4", "--ns", "1000", "--variants", "eager", "--tiny-k", "10", "--budget", "0.05",
            "--out", str(out)]
    done = _gpuspeed(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    whole = (out / "launch.json").read_text()
    rc, _, err = stopped(args, signal.SIGTERM, "; now fusion N=1e+03 copy", tmp_path)
    assert rc == 143, (rc, err[-3000:])
    line = _one_line(err, "stopped by SIGTERM")
    assert str(out / "launch.partial.json") in line and f"{out / 'launch.json'} is kept" in line, line
    assert (out / "launch.json").read_text() == whole
    part = json.loads((out / "launch.partial.json").read_text())
    assert part["params"]["partial"] is True and part["summary"]["eager_us_per_launch"] > 0
    assert (out / "launch.partial.md").is_file() and (out / "launch.partial.png").is_file()
    _no_temp(out)


def test_a_partial_run_still_replaces_a_partial_one(tmp_path):
    # nothing complete to keep: the partial file goes where it always went (a rerun that is stopped again)
    out = tmp_path / "res"
    for _ in range(2):
        rc, _, err = stopped(["launch", "--ks", "1,2,4", "--ns", "1000", "--variants", "eager", "--tiny-k", "10",
                              "--budget", "0.05", "--out", str(out)], signal.SIGTERM, "; now fusion N=1e+03 copy",
                             tmp_path)
        assert rc == 143, (rc, err[-3000:])
        assert str(out / "launch.json") in _one_line(err, "stopped by SIGTERM")
    assert json.loads((out / "launch.json").read_text())["params"]["partial"] is True
    assert not (out / "launch.partial.json").exists()
