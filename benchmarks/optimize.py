"""Run `gpuspeed optimize` over the bundled examples and write results/<gpu>/optimize.json (the summary the
issue lists) plus one report folder per example under results/<gpu>/optimize/<name>/.

    python benchmarks/optimize.py [--out DIR] [--examples a,b] [--gpus N] [--parallel P] [--time-budget S] [--jobs J]
                                  [--limit S]

Each example runs as its own `python -m gpuspeed optimize` process (one failing example does not stop the
others); with --gpus N / --parallel P, P examples run at once spread over N GPUs (CUDA_VISIBLE_DEVICES). Every run
shares one lock, so no two candidates are ever measured at once, across examples too, and nothing
compiles (nor computes an example's references and hotspots) while something is timed. --limit S bounds the
whole call (one device call of 10 minutes): late examples get what is left, stopped ones stop their workers.
The summary is rewritten after each example, so a run cut short keeps what it did. Re-running some examples
(--examples a,b) into a folder whose optimize.json holds others keeps those others' rows (each with its commit).
A row's minutes is its process's wall time as seen from here (start-up to exit: what "under 5 minutes" is judged
on); run_minutes is the run's own, from the call into the pipeline to its script written.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpuspeed.optimize.pipeline import geomean  # noqa: E402
from gpuspeed.optimize.runner import LOCK_ENV  # noqa: E402
from gpuspeed.optimize.workload import bundled_examples  # noqa: E402
from gpuspeed.device import get_device  # noqa: E402
from gpuspeed.errors import UserError  # noqa: E402
from gpuspeed.results import (check_out_dir, default_dir, make_results, measured_elsewhere, read_results,  # noqa: E402
                              write_results)

MIN_EXAMPLE_S = 60.0  # an example is not started with less time than this left in a --limit call
REPORT_S = 20.0  # time an example needs after its budget to write its report and script
SCRATCH = ("refs.pkl",)  # large and rebuilt by any run: not kept with the results


def _stop(proc) -> None:
    """An example stopped now: SIGTERM lets its pipeline stop the workers it started (each in its own
    process group), then its own group is killed."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _row(name: str, folder: Path, rc: int, minutes: float, log: str) -> dict:
    path = folder / f"optimize_{name}.json"
    if rc != 0 or not path.is_file():
        return {"example": name, "ok": False, "rc": rc, "minutes": minutes, "error": log.strip().splitlines()[-1:]}
    doc = json.loads(path.read_text())
    s = doc["summary"]
    ch = doc.get("choice", {})
    return {"example": name, "ok": True, "minutes": minutes, "run_minutes": s.get("minutes"),
            "within_time_budget": s.get("within_time_budget"), "git": doc.get("git"),
            "time_budget_s": doc.get("params", {}).get("time_budget_s"), "primary": s.get("primary"),
            "alternative": s.get("alternative"), "best_dropin": s.get("best_dropin"), "original_s": s.get("original_s"),
            "primary_s": s.get("primary_s"), "primary_e2e_s": s.get("primary_e2e_s"), "speedup": s.get("speedup"),
            "speedup_ci": [s.get("speedup_ci_low"), s.get("speedup_ci_high")], "speedup_e2e": s.get("speedup_e2e"),
            # timed alternately with the original (None: nothing to confirm); replaced: the speedup timed apart
            # disagreed, separate_speedup is what it said
            "confirmed": s.get("confirmed"), "speedup_replaced": s.get("confirmation_replaced"),
            "separate_speedup": (doc.get("confirmation") or {}).get("separate")
            if s.get("confirmation_replaced") else None,
            "over_best_dropin": s.get("over_best_dropin"), "correct": s.get("correct"),
            "within_budget": s.get("within_budget"), "peak_bytes": s.get("peak_bytes"),
            "sequential": bool(doc.get("hotspots", {}).get("sequential")), "why_not_2x": ch.get("why_not_2x"),
            "why_not_gpu": ch.get("why_not_gpu"), "fastest_route": ch.get("fastest_route"),
            "candidates": s.get("candidates"), "candidates_correct": s.get("candidates_correct"),
            "statuses": {r["name"]: r["status"] for r in doc.get("rows", [])}}


def summarize(rows: list[dict]) -> dict:
    ok = [r for r in rows if r.get("ok")]
    helpable = [r for r in ok if not r.get("sequential")]  # a sequential recurrence: the example a GPU cannot help
    over = [r["over_best_dropin"] for r in ok if r.get("over_best_dropin")]
    return {
        "examples": len(rows),
        "examples_correct": sum(1 for r in ok if r.get("correct")),
        "examples_within_budget": sum(1 for r in ok if r.get("correct") and r.get("within_budget")),
        "examples_2x": sum(1 for r in ok if (r.get("speedup") or 0) >= 2),
        "examples_2x_e2e": sum(1 for r in ok if (r.get("speedup_e2e") or 0) >= 2),
        "examples_gpu_can_help": len(helpable),
        "examples_gpu_can_help_2x": sum(1 for r in helpable if (r.get("speedup") or 0) >= 2),
        "examples_with_dropin": len(over),
        "geomean_over_best_dropin": geomean(over),
        "min_over_best_dropin": min(over) if over else None,
        "max_minutes_per_example": max((r["minutes"] for r in rows), default=None),
        "examples_under_5_minutes": sum(1 for r in rows if r.get("ok") and r["minutes"] < 5),
        "geomean_speedup": geomean([r.get("speedup") for r in ok]),
    }


def kept_rows(previous: Path, names: list[str], here) -> tuple[list[dict], list[str]]:
    """(rows of an earlier optimize.json for the examples not run now, notes): two calls compose one file, on one
    device. Nothing is kept from a file measured on another device than `here` (or on none recorded), of another
    study, or unreadable: a note says so (its rows' speedups are not this device's)."""
    if not previous.is_file():
        return [], []
    try:
        earlier = read_results(previous)
    except UserError as exc:
        return [], [f"rows of {previous} not kept: {exc}"]
    if earlier["study"] != "optimize":
        return [], [f"rows of {previous} not kept: a {earlier['study']} results document, not an optimize one"]
    theirs = measured_elsewhere(earlier, here)
    if theirs is not None:
        return [], [f"rows of {previous} not kept: measured on {theirs}, this run on {here.name}"]
    return [r for r in earlier["rows"] if isinstance(r, dict) and r.get("example") not in names], []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # the first paragraph: a whole sentence
    ap.add_argument("--out", default=None, help="folder for optimize.json (default results/<gpu>)")
    ap.add_argument("--examples", default=None, help="comma-separated names (default: every bundled example)")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs to spread the examples over (CUDA_VISIBLE_DEVICES)")
    ap.add_argument("--parallel", type=int, default=None, help="examples at once (default: one per GPU); their "
                    "compiles overlap, their measurements take turns under the shared lock")
    ap.add_argument("--time-budget", type=float, default=300.0, help="seconds per example (the default settings)")
    ap.add_argument("--jobs", type=int, default=None, help="candidates built at once per example")
    ap.add_argument("--bench-budget", type=float, default=None, help="seconds bench() spends per candidate")
    ap.add_argument("--scale", type=float, default=None, help="input scale (default: typical sizes on a GPU)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--limit", type=float, default=None, help="seconds for the whole call: an example started late "
                    "gets only what is left as its time budget (it skips its last candidates and still writes its "
                    "report), none starts in the last minute, and at the limit running ones are stopped")
    ap.add_argument("--restamp", action="store_true", help="run nothing: rewrite optimize.json from its rows, each "
                    "stamped with the commit of its example's own optimize_<name>.json")
    a = ap.parse_args(argv)
    out = check_out_dir(a.out) or default_dir(a.device)
    names = [] if a.restamp else a.examples.split(",") if a.examples else bundled_examples()
    lock = out / "optimize" / ".device.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **{LOCK_ENV: str(lock)})
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT / "src"), env.get("PYTHONPATH")] if p)
    previous = out / "optimize.json"
    if a.restamp:  # the file's own rows, under its own stamp (rewritten below)
        kept, kept_notes = json.loads(previous.read_text()).get("rows", []), []
    else:  # rows of examples an earlier call ran and this one does not (two calls compose one file)
        kept, kept_notes = kept_rows(previous, names, get_device(a.device))
    for r in kept:  # rows from before rows carried their commit: their example's own results file has it
        own = out / "optimize" / r["example"] / f"optimize_{r['example']}.json"
        if r.get("ok") and "git" not in r and own.is_file():
            doc = json.loads(own.read_text())
            r["git"], r["time_budget_s"] = doc.get("git"), doc.get("params", {}).get("time_budget_s")
    if a.restamp:  # the file keeps the device, versions, commit and command of the call that wrote it
        doc = json.loads(previous.read_text())
        doc["rows"] = kept
        commits = sorted({r["git"] for r in kept if r.get("git")})
        doc["notes"] = [n for n in doc["notes"] if not n.startswith("the rows come from several commits")]
        if len(commits) > 1:
            doc["notes"].append(f"the rows come from several commits (each row's git): {commits}")
        print(f"restamped {write_results(doc, previous)}")
        return 0
    kept_minutes = 0.0
    if kept:
        try:
            kept_minutes = float(json.loads(previous.read_text())["summary"].get("wall_minutes") or 0.0)
        except (json.JSONDecodeError, OSError, KeyError, TypeError, ValueError):
            kept_minutes = 0.0
    pending = list(names)
    cut: dict = {}  # examples given less than --time-budget (started late in a --limit call)
    running: list[tuple] = []
    rows: list[dict] = []
    n_gpus = max(1, a.gpus)
    free = [i % n_gpus for i in range(max(1, a.parallel or n_gpus))]  # one slot per example at once
    t_all = time.perf_counter()  # wall clock of the whole benchmark, for the minutes per example

    def left():
        return None if a.limit is None else a.limit - (time.perf_counter() - t_all)

    def launch(name, gpu):
        folder = out / "optimize" / name
        # never more than --time-budget; a late start gets what is left of --limit (at least MIN_EXAMPLE_S)
        budget = a.time_budget if left() is None else min(a.time_budget, max(MIN_EXAMPLE_S, left() - REPORT_S))
        cmd = [sys.executable, "-m", "gpuspeed", "optimize", name, "--out", str(folder), "--json",
               "--time-budget", f"{budget:.0f}", "--device", a.device]
        if a.jobs:
            cmd += ["--jobs", str(a.jobs)]
        if a.scale:
            cmd += ["--scale", str(a.scale)]
        if a.bench_budget:
            cmd += ["--bench-budget", str(a.bench_budget)]
        e = dict(env)
        if n_gpus > 1:
            e["CUDA_VISIBLE_DEVICES"] = str(gpu)
        log = open(out / "optimize" / f"{name}.log", "w")
        # its own process group: stopped at the limit with every worker it started
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=e, start_new_session=True)
        print(f"{name}: started on GPU {gpu}" + (f", time budget {budget:.0f} s" if budget != a.time_budget else ""),
              flush=True)
        if budget != a.time_budget:
            cut[name] = budget
        return (name, gpu, proc, log, folder, time.perf_counter())

    def write():
        notes = ["each example is one `gpuspeed optimize` run with default settings unless the params say otherwise",
                 "speedups are device-resident (data kept on the GPU) against the original on the CPU, both through "
                 "gpuspeed.bench; *_e2e include the transfers"]
        if len(free) + len(running) > 1:
            notes.append(f"{max(1, a.parallel or n_gpus)} examples ran at once on {n_gpus} GPU(s); one shared lock kept "
                         "every measurement alone (nothing compiled, measured or computed on the host for "
                         "references and hotspots beside it)")
        notes.extend(kept_notes)
        if kept:
            notes.append(f"rows kept from an earlier call: {', '.join(r['example'] for r in kept)}")
        commits = sorted({r["git"] for r in kept + rows if r.get("git")})
        if len(commits) > 1:
            notes.append(f"the rows come from several commits (each row's git): {commits}")
        if cut:
            notes.append("given less than --time-budget to fit the call's --limit of {:g} s: {}".format(
                a.limit, ", ".join(f"{k} ({v:.0f} s)" for k, v in cut.items())))
        if len(free) + len(running) > 1:
            notes.append("minutes are each example's wall time beside the others (waiting its turn for the lock "
                         "included); wall_minutes is the wall time of the call(s) that made this file")
        all_rows = kept + rows
        summary = summarize(all_rows) | {"wall_minutes": (time.perf_counter() - t_all) / 60 + kept_minutes}
        doc = make_results("optimize", params={"examples": [r["example"] for r in all_rows], "gpus": a.gpus,
                                               "parallel": a.parallel,
                                               "time_budget_s": a.time_budget, "jobs": a.jobs, "scale": a.scale,
                                               "bench_budget_s": a.bench_budget, "limit_s": a.limit},
                           summary=summary, rows=all_rows, notes=notes, device=a.device)
        return write_results(doc, out)

    while pending or running:
        while pending and free and (left() is None or left() > MIN_EXAMPLE_S + REPORT_S):
            running.append(launch(pending.pop(0), free.pop(0)))
        if pending and not running:  # too little time left to start another
            for name in pending:
                rows.append({"example": name, "ok": False, "rc": None, "minutes": 0.0,
                             "error": [f"not started: the call's --limit of {a.limit:g} s was nearly spent"]})
            pending.clear()
            break
        time.sleep(0.2)  # a row's minutes are its process's wall time: read it to a fifth of a second
        over = left() is not None and left() <= 0
        for item in list(running):
            name, gpu, proc, log, folder, t0 = item
            if over and proc.poll() is None:
                _stop(proc)
                print(f"{name}: stopped at the call's --limit of {a.limit:g} s", flush=True)
            if proc.poll() is None:
                continue
            log.close()
            minutes = (time.perf_counter() - t0) / 60
            rows.append(_row(name, folder, proc.returncode, minutes, (out / "optimize" / f"{name}.log").read_text()))
            for scratch in SCRATCH:
                (folder / scratch).unlink(missing_ok=True)
            for spec in (folder / "work").glob("*.spec.json"):
                spec.unlink()
            running.remove(item)
            free.append(gpu)
            r = rows[-1]
            print(f"{name}: {'ok' if r.get('ok') else 'FAILED'} in {minutes:.1f} min, primary {r.get('primary')}, "
                  f"speedup {r.get('speedup')}, over best drop-in {r.get('over_best_dropin')}", flush=True)
            path = write()
    path = write()
    print(f"wrote {path} ({(time.perf_counter() - t_all) / 60:.1f} min)")
    print(json.dumps(summarize(kept + rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
