"""Run candidates, each in its own process under a time limit, streaming results to JSON lines.

A worker that crashes (segfault, illegal address), runs out of memory, hangs or overruns its limit is
recorded against its candidate and the run goes on. Up to `jobs` workers run at once: they build,
compile and check concurrently; a measurement (memory, timing) has the machine to itself: nothing else
is timed, compiled or checked meanwhile (worker._slot has the lock; time spent waiting for it does not
count against a worker's limit). `resume=True` keeps the lines already written and skips their candidates,
so an interrupted run loses nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import gpuspeed

WORKER = "gpuspeed.optimize.worker"
# `python -m` would put the current folder first on sys.path, where a user's profile.py or numpy.py would hide the
# library gpuspeed imports; last, it still serves imports of the user's own packages from there
BOOT = ("import runpy, sys; sys.path.append(sys.path.pop(0)); from gpuspeed.optimize.runner import die_with_parent; "
        f"die_with_parent(); runpy.run_module({WORKER!r}, run_name='__main__')")
PARENT_ENV = "GPUSPEED_OPTIMIZE_PARENT"  # the optimize process's pid, for die_with_parent()
POLL_S = 0.2
MAX_WAIT_S = 900.0  # a worker waiting for the lock longer than this (a stuck holder) is stopped anyway
LOCK_ENV = "GPUSPEED_OPTIMIZE_LOCK"  # one lock shared by runs in parallel (benchmarks/optimize.py on several GPUs)


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


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def work_stem(name: str) -> str:
    """A candidate's work files' name: its name with what a file name should not hold made "_", and where anything was,
    a short hash of the name (variants "a b" and "a_b" shared their files, and under --jobs 2 mixed their results)."""
    import hashlib

    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return stem if stem == name else f"{stem}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


@dataclass
class _Job:
    recipe: dict
    proc: subprocess.Popen
    log: object
    result_path: Path
    log_path: Path
    limit_s: float
    started: float
    last: float
    waited: float = 0.0
    stage: str = "start"


def die_with_parent() -> None:
    """In a worker, first thing: be killed when the optimize process that started it dies, even by SIGKILL (a
    killed run must not leave a worker holding the run's lock, or GPU memory). Linux's PR_SET_PDEATHSIG;
    elsewhere a no-op (the run's own cleanup covers Ctrl-C and errors)."""
    parent = int(os.environ.get(PARENT_ENV) or 0)
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:  # 1: PR_SET_PDEATHSIG
            return
    except (OSError, AttributeError):
        return
    if parent and os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stopped_at_deadline(row: dict) -> bool:
    """A candidate the run's --time-budget stopped (rather than its own time limit): it never had its turn."""
    return row.get("status") == "timeout" and (bool(row.get("at_deadline")) or
                                              str(row.get("reason") or "").startswith("stopped at the run's time budget"))


class Runner:
    def __init__(self, run_dir: Path, base_spec: dict, resume: bool = False, file: str = "candidates.jsonl"):
        self.dir = Path(run_dir).absolute()  # a worker's paths hold wherever the user's code moves it
        self.work = self.dir / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / file
        self.base = base_spec | {"lock": os.environ.get(LOCK_ENV) or str(self.work / "device.lock")}
        self.done: dict[str, dict] = {}
        # the run's end (perf_counter): a worker still running then is stopped, lock waits included, the original's
        # too, so --time-budget bounds the whole run; None for no end
        self.deadline: float | None = None
        # seconds before the deadline a recipe's worker is stopped: time kept for what follows it (the confirmation)
        self.reserve: Callable[[dict], float] = lambda recipe: 0.0
        if resume:
            for row in read_jsonl(self.path):
                if _stopped_at_deadline(row):  # interrupted by the run's end, not done: a resumed run runs it again
                    self.done.pop(row["name"], None)
                    continue
                self.done[row["name"]] = row
        else:
            self.path.write_text("")

    def _append(self, row: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _launch(self, recipe: dict, limit_s: float) -> _Job:
        slug = work_stem(recipe["name"])
        spec_path, result_path, log_path = (self.work / f"{slug}.spec.json", self.work / f"{slug}.result.json",
                                            self.work / f"{slug}.log")
        result_path.unlink(missing_ok=True)
        spec = self.base | {"recipe": recipe, "result": str(result_path)}
        spec_path.write_text(json.dumps(spec, default=str))
        env = dict(os.environ)
        src = str(Path(gpuspeed.__file__).resolve().parents[1])  # the worker imports this same gpuspeed
        env["PYTHONPATH"] = os.pathsep.join(p for p in [src, env.get("PYTHONPATH")] if p)
        env[PARENT_ENV] = str(os.getpid())
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        # several workers compile at once: a few Inductor compile processes each, not one per core each
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "4")
        if recipe.get("backend") == "jax":  # JAX's own pool hides its arrays from peak_memory; cudaMalloc shows them
            env.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
        log = open(log_path, "w")
        proc = subprocess.Popen([sys.executable, "-c", BOOT, str(spec_path)], stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
        now = time.perf_counter()  # wall clock of the worker, for its time limit (not a benchmark)
        return _Job(recipe, proc, log, result_path, log_path, max(1.0, limit_s), now, now)

    def _finish(self, job: _Job, timed_out: bool, at_deadline: bool = False) -> dict:
        if timed_out:
            _kill_group(job.proc.pid)
        rc = job.proc.wait()
        _kill_group(job.proc.pid)  # compile helpers the worker left behind (its own process group)
        job.log.close()
        name = job.recipe["name"]
        # no result file: the worker died before it wrote one (an import failed): the branch below says how
        row = _read(job.result_path) or {"name": name, "status": None, "stage": job.stage, "notes": []}
        if row.get("status") in ("running", None) or timed_out:
            stage = row.get("stage", job.stage)
            if timed_out:
                row["status"] = "timeout"
                row["at_deadline"] = at_deadline
                row["reason"] = (f"stopped at the run's time budget during {stage}" if at_deadline else
                                 f"killed after {job.limit_s:.0f} s (time limit) during {stage}")
            else:
                how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
                row["status"] = "crashed"
                row["reason"] = f"process died ({how}) during {stage}"
                tail = job.log_path.read_text(errors="replace").strip().splitlines()[-3:] if job.log_path.is_file() else []
                if tail:
                    row["log_tail"] = tail
                    row["reason"] += f": {tail[-1][:200]}"  # the error's own last line, where the report shows it
        row["wall_s"] = time.perf_counter() - job.started
        row["waited_s"] = job.waited
        row["timeout_s"] = job.limit_s
        row["name"] = name
        row["recipe"] = job.recipe
        self.done[name] = row
        self._append(row)
        return row

    def run_many(self, recipes: list[dict], limit: Callable[[dict], float | None], jobs: int = 1,
                 on_start: Callable[[dict], None] | None = None) -> dict[str, dict]:
        """Run every recipe (up to `jobs` at once); limit(recipe) gives its time limit in seconds, or None
        to skip it (the time budget is spent). Returns name -> result row, in the recipes' order."""
        out: dict[str, dict] = {}
        queue = []
        for rec in recipes:
            if rec["name"] in self.done:
                out[rec["name"]] = self.done[rec["name"]] | {"resumed": True}
            else:
                queue.append(rec)
        active: list[_Job] = []
        try:
            self._loop(queue, active, out, limit, jobs, on_start)
        finally:  # an interrupt (Ctrl-C) or an error here leaves no worker running
            for job in active:
                _kill_group(job.proc.pid)
                job.proc.wait()
                job.log.close()
        return {rec["name"]: out[rec["name"]] for rec in recipes if rec["name"] in out}

    def _loop(self, queue, active, out, limit, jobs, on_start) -> None:
        while queue or active:
            while queue and len(active) < max(1, jobs):
                rec = queue.pop(0)
                lim = limit(rec)
                if lim is None:
                    out[rec["name"]] = {"name": rec["name"], "recipe": rec, "status": "skipped",
                                        "reason": "the time budget is spent"}
                    continue
                if on_start:
                    on_start(rec)
                active.append(self._launch(rec, lim))
            if not active:
                break
            time.sleep(POLL_S)
            now = time.perf_counter()
            for job in list(active):
                row = _read(job.result_path)
                if row and row.get("stage"):
                    job.stage = row["stage"]
                if job.stage.startswith("waiting"):
                    job.waited += now - job.last
                job.last = now
                rc = job.proc.poll()
                busy = now - job.started - job.waited
                at_deadline = self.deadline is not None and now > self.deadline - self.reserve(job.recipe)
                if (rc is not None or busy > job.limit_s or now - job.started > job.limit_s + MAX_WAIT_S
                        or at_deadline):
                    active.remove(job)
                    out[job.recipe["name"]] = self._finish(job, timed_out=rc is None, at_deadline=at_deadline)

    def run(self, recipe: dict, timeout_s: float) -> dict:
        """One candidate's result (from an earlier run when resuming)."""
        return self.run_many([recipe], lambda _: timeout_s)[recipe["name"]]
