"""Run candidates one by one, each in its own process under a time limit, streaming results to JSON lines.

A worker that crashes (segfault, illegal address), runs out of memory, hangs or overruns its limit is
recorded against its candidate and the run goes on. `resume=True` keeps the lines already written and
skips their candidates, so an interrupted run loses nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gpuspeed

WORKER = "gpuspeed.optimize.worker"


def read_jsonl(path: Path) -> list[dict]:
    """Every complete line of a candidates file (a line cut off by a kill is dropped)."""
    rows = []
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class Runner:
    def __init__(self, run_dir: Path, base_spec: dict, resume: bool = False):
        self.dir = Path(run_dir)
        self.work = self.dir / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "candidates.jsonl"
        self.base = base_spec
        self.done: dict[str, dict] = {}
        if resume:
            for row in read_jsonl(self.path):
                self.done[row["name"]] = row
        else:
            self.path.write_text("")

    def results(self) -> list[dict]:
        return list(self.done.values())

    def _append(self, row: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def run(self, recipe: dict, timeout_s: float) -> dict:
        """The candidate's result (from an earlier run when resuming)."""
        name = recipe["name"]
        if name in self.done:
            return self.done[name] | {"resumed": True}
        slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        spec_path, result_path, log_path = (self.work / f"{slug}.spec.json", self.work / f"{slug}.result.json",
                                            self.work / f"{slug}.log")
        result_path.unlink(missing_ok=True)
        spec = self.base | {"recipe": recipe, "result": str(result_path)}
        spec_path.write_text(json.dumps(spec, default=str))
        env = dict(os.environ)
        src = str(Path(gpuspeed.__file__).resolve().parents[1])  # the worker imports this same gpuspeed
        env["PYTHONPATH"] = os.pathsep.join(p for p in [src, env.get("PYTHONPATH")] if p)
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        t0 = time.perf_counter()  # wall time of the worker for the time budget (not a benchmark)
        with open(log_path, "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", WORKER, str(spec_path)], stdout=log, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)
            timed_out = False
            try:
                rc = proc.wait(timeout=max(1.0, timeout_s))
            except subprocess.TimeoutExpired:
                timed_out = True
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # the worker's own group: compile helpers go too
                except ProcessLookupError:
                    pass
                rc = proc.wait()
        wall = time.perf_counter() - t0
        row = {"name": name, "recipe": recipe, "status": "crashed", "stage": "start", "notes": []}
        if result_path.is_file():
            try:
                row = json.loads(result_path.read_text())
            except json.JSONDecodeError:
                pass
        if row.get("status") in ("running", None) or timed_out:
            stage = row.get("stage", "start")
            if timed_out:
                row["status"] = "timeout"
                row["reason"] = f"killed after {timeout_s:.0f} s (time limit) during {stage}"
            else:
                how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
                row["status"] = "crashed"
                row["reason"] = f"process died ({how}) during {stage}"
                tail = log_path.read_text(errors="replace").strip().splitlines()[-3:] if log_path.is_file() else []
                if tail:
                    row["log_tail"] = tail
        row["wall_s"] = wall
        row["timeout_s"] = timeout_s
        row["name"] = name
        row["recipe"] = recipe
        self.done[name] = row
        self._append(row)
        return row
