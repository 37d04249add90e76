"""`gpuspeed optimize`, end to end: load and check the workload, the original's outputs on fresh seeds,
hotspots, the plan, every candidate in its own process, the budget (chunked re-runs), the choice, the
target-card projection, the report and the standalone script."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from gpuspeed import device as _device
from gpuspeed.errors import UserError
from gpuspeed.memory import HEADROOM, parse_budget
from gpuspeed.optimize import analysis, budget as _budget, candidates as C, workload as W
from gpuspeed.optimize.report import STATUS_WORDS
from gpuspeed.optimize.runner import LOCK_ENV, Runner
from gpuspeed.trees import nbytes

DEFAULT_TARGET = "RTX 4070 Laptop"  # the brief's 8 GB RTX 4070
DEFAULT_BUDGET = "8GiB"
DEFAULT_TIME_BUDGET_S = 300.0
N_SEEDS = 3
TIMING_SEED = 0
COMPILE_LIMIT_S = 180.0
PLAIN_LIMIT_S = 90.0
LOOP_DROPIN_LIMIT_S = 40.0  # a drop-in over Python loops launches per iteration: it gets less time
MIN_LIMIT_S = 8.0
# of --time-budget, kept for what follows the deadline: stopping the workers still running, the choice, the report,
# its plot, the emitted script and the process's exit (a few seconds on the H200), and the interpreter's start-up
# before optimize() is called (under a second): `gpuspeed optimize` with the default 300 s ends within 5 minutes
REPORT_RESERVE_S = 15.0
REFERENCE_SHARE = 0.5  # of --time-budget: the most the original's reference calls (one a seed) may take
HOST_WAIT_FRACTION = 0.2  # of --time-budget: the longest the run's start waits for another run's measurement
DEFAULT_GPU_JOBS = 3  # candidates built and checked at once (timing is still one at a time)


@dataclass
class OptimizeRun:
    wl: W.Workload
    where: str
    out_dir: Path
    params: dict
    hot: dict = field(default_factory=dict)
    plan_rows: list = field(default_factory=list)
    results: dict = field(default_factory=dict)  # name -> worker result row
    chunking: dict = field(default_factory=dict)
    choice: dict = field(default_factory=dict)
    projection: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    paths: dict = field(default_factory=dict)
    elapsed_s: float = 0.0


def _limit(rec: dict, loop_bound: bool, remaining: float) -> float:
    compiled = rec["backend"] in ("torch_compile", "jax", "numba") or rec.get("mode") not in (None, "eager")
    cap = COMPILE_LIMIT_S if compiled else PLAIN_LIMIT_S
    if loop_bound and rec["backend"] in ("cupy", "torch_compile", "jax", "torch"):
        cap = min(cap, LOOP_DROPIN_LIMIT_S)
    return min(cap, remaining)


_HELD: contextvars.ContextVar = contextvars.ContextVar("gpuspeed_optimize_held")
LOCK_NAME = ".optimize.lock"


def _holding(fn):
    """optimize() with an ExitStack it may enter into (_HELD), closed when it returns or raises: its --out folder's
    lock is held for the whole run, however it ends."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with contextlib.ExitStack() as held:
            token = _HELD.set({"stack": held, "locked": set()})
            try:
                return fn(*args, **kwargs)
            finally:
                _HELD.reset(token)
    return wrapper


def _hold_folder(out_dir: Path) -> None:
    """This run's hold on its --out folder (an existing one), to its end: a second run there at once (a --resume
    started while the first still runs) read the other's half-written files and appended to its candidates.jsonl,
    and its confirmation read as crashed. The second run is refused in one line instead."""
    held = _HELD.get(None)
    if held is None or not out_dir.is_dir() or out_dir.resolve() in held["locked"]:
        return
    try:
        import fcntl
    except ImportError:  # not on this OS: no lock, as before
        return
    path = out_dir / LOCK_NAME
    busy = UserError(f"--out {out_dir}: another gpuspeed optimize is running there now (wait for it to end, or give "
                     "another --out)")
    for _ in range(3):
        f = open(path, "a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            raise busy from None
        if _same_file(f, path):
            break
        # a run ending removed the file this one had just opened: locked, it would hold nothing (another run may
        # have made and locked the new one); the file now at the path is the lock
        f.close()
    else:
        raise busy

    def release():
        path.unlink(missing_ok=True)  # while still held: a run starting now makes its own file
        f.close()

    held["stack"].callback(release)
    held["locked"].add(out_dir.resolve())


def _same_file(f, path: Path) -> bool:
    """Whether the open file f is the one at path now (not removed, nor replaced)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    own = os.fstat(f.fileno())
    return (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino)


@_holding
def optimize(target, *, func: str = "original", inputs=(), budget: str = DEFAULT_BUDGET, rtol=None, atol=None,
             backends=None, device: str = "auto", target_gpu: str = DEFAULT_TARGET,
             time_budget: float = DEFAULT_TIME_BUDGET_S, out=None, resume: bool = False, scale: float | None = None,
             bench_budget_s: float | None = None, rank_by: str | None = None, candidate_limit_s: float | None = None,
             jobs: int | None = None,
             progress: Callable[[str, int, int], None] | None = None) -> OptimizeRun:
    """Run the whole pipeline; returns what the report is written from (also written under out)."""
    from gpuspeed.results import check_out_dir, default_dir

    t_start = time.perf_counter()  # the pipeline's own wall clock, for --time-budget (not a benchmark)
    # the run's own start-up (device queries that may create a CUDA context, references, hotspots) never runs
    # beside another run's measurement; released before its first worker starts (or at exit, on an error). The
    # wait for it is bounded: past a fifth of the budget the run goes on without it (its deadline counts from here)
    host = contextlib.ExitStack()
    early_notes: list = []
    host.enter_context(_host_work(until=t_start + HOST_WAIT_FRACTION * max(time_budget, 0.0), notes=early_notes))
    home = _Home(early_notes)  # the user's code runs in this process too: a chdir there must not move the run
    where = _device.resolve_device(device)
    requested = _backends(backends)
    total = (_device.get_device("cuda").mem_bytes or 0) if where == "cuda" else 0
    if where != "cuda" and str(budget).strip().endswith("%"):
        parse_budget(budget, 2**40)  # its form and range still checked
        budget_bytes = None  # a share of a GPU's memory: no GPU, so no size to take it of (and no VRAM used)
        early_notes.append(f"no GPU: --budget {budget} is a share of a GPU's memory; no byte budget applies here")
    else:
        budget_bytes = parse_budget(budget, total or None)  # "80%" is of the GPU's memory
    if where == "cuda":
        if total and budget_bytes > total:
            raise UserError(f"--budget {budget} is more than this GPU's {total / 2**30:.1f} GiB")
    if _device.datasheet_for(target_gpu) is None:
        raise UserError(f"no datasheet entry for --target-gpu {target_gpu!r} (see `gpuspeed doctor` for the table)")
    if not 0 < time_budget < math.inf:  # NaN too; inf would reach the reference calls' timer (setitimer overflows)
        raise UserError(f"--time-budget must be a positive finite number of seconds, got {time_budget:g}")
    if bench_budget_s is not None and not bench_budget_s > 0:
        raise UserError(f"--bench-budget is seconds and must be positive, got {bench_budget_s:g}")
    if rank_by is None:  # without a GPU no data stays anywhere: the script's caller pays every cast, so rank with them
        rank_by = "device" if where == "cuda" else "e2e"
        if where != "cuda":
            early_notes.append("no GPU: candidates ranked end to end (--rank-by e2e), with the casts of a float32 "
                               "candidate's inputs and outputs: the optimized script's callers pass the original's "
                               "arrays")
    if rank_by not in ("device", "e2e"):
        raise UserError("--rank-by must be device or e2e")
    n_jobs = jobs if jobs is not None else (DEFAULT_GPU_JOBS if where == "cuda" else 1)
    if n_jobs < 1:
        raise UserError("--jobs must be at least 1")
    with home:
        wl = W.load(target, func=func, input_specs=inputs, rtol=rtol, atol=atol, scale=scale, gpu=where == "cuda")
    out_dir = Path(out) if out is not None else default_dir(where) / "optimize" / wl.name
    _hold_folder(out_dir)  # a folder that exists: before a --resume reads it
    run_file = out_dir / "run.json"
    refs_file = out_dir / "refs.pkl"
    # the device by name too: --resume reuses finished candidates' times, and another GPU's (or CPU's) are not these
    key = {"workload": str(wl.path), "func": func, "scale": wl.scale, "input_specs": wl.input_specs, "device": where,
           "device_name": _device.get_device(where).name, "tolerance": [wl.rtol, wl.atol]}
    # the file's contents too: a resumed run reuses the references and the rows of the code it was started on
    source_hash = hashlib.sha256(wl.path.read_bytes()).hexdigest()
    if resume:
        if not run_file.is_file() or not refs_file.is_file():
            raise UserError(f"--resume: no interrupted run in {out_dir} (run.json / refs.pkl missing)")
        try:
            saved = json.loads(run_file.read_text())
            if not isinstance(saved, dict):
                raise ValueError(f"a JSON {type(saved).__name__}, not the run's settings")
        except (OSError, UnicodeDecodeError, ValueError) as exc:  # cut short by a kill, or edited by hand
            raise UserError(f"--resume: {run_file} cannot be read ({type(exc).__name__}: {W._first_line(exc)}): "
                            "run without --resume") from None
        if saved.get("workload_sha256") not in (None, source_hash) and {k: saved.get(k) for k in key} == key:
            raise UserError(f"--resume: {wl.path.name} changed since the run in {out_dir} began: its references and "
                            "results are of the old code (run without --resume)")
        if {k: saved.get(k) for k in key} != key or saved.get("workload_sha256") is None:
            differ = "; ".join(f"{k} {saved.get(k)!r} there, {v!r} now" for k, v in key.items() if saved.get(k) != v)
            raise UserError(f"--resume: {out_dir} holds a run of another workload or settings"
                            + (f" ({differ}): rerun with that run's settings, or without --resume" if differ else ""))
        seeds = saved.get("seeds")
        if not isinstance(seeds, list) or not seeds:
            raise UserError(f"--resume: {run_file} names no seeds: run without --resume")
        try:
            refs = W.load_refs(refs_file)
            if any(seed not in refs for seed in seeds):
                raise ValueError("it does not hold the outputs of the run's seeds")
            first_ref = refs[seeds[0]]
        except Exception as exc:  # noqa: BLE001 - a truncated or foreign pickle: unpickling raises many kinds
            raise UserError(f"--resume: {refs_file} cannot be read ({type(exc).__name__}: {W._first_line(exc)}): "
                            "run without --resume") from None
        mutates = saved.get("original_mutates", False)
        in_place = saved.get("in_place")
        wl.in_place_returns = bool(saved.get("in_place_returns"))
        wl.returns_args = list(saved.get("returns_args") or [])
        wl.returns_views = saved.get("returns_views")  # None from an older run.json: not checked
        wl.bf16_outputs = bool(saved.get("bf16_outputs"))
        reference_s = saved.get("reference_s")
    else:
        seeds = [random.SystemRandom().randrange(1, 2**31) for _ in range(N_SEEDS)]
        t_ref = time.perf_counter()  # a rough time per call (inputs made too) for planning, not a benchmark
        # a failing original stops here, before anything is written; so do references that would take more than
        # half the time budget (the original's own timing and every candidate need the rest)
        with home:
            refs, mutates, in_place = W.reference(wl, seeds, limit_s=REFERENCE_SHARE * time_budget,
                                                  why=f" ({REFERENCE_SHARE:.0%} of --time-budget {time_budget:g} s)")
        reference_s = (time.perf_counter() - t_ref) / len(seeds)
    wl.in_place = in_place
    spec_rtol = rtol
    if wl.bf16_outputs and wl.rtol is None:
        # its bfloat16 outputs reach the check as float32 (NumPy has none): held to bfloat16's default, not float32's
        from gpuspeed.verify import TOLERANCES

        wl.rtol = spec_rtol = TOLERANCES["bfloat16"]
        wl.tolerance_source = "gpuspeed.verify's default for its bfloat16 outputs"
    check_out_dir(out_dir)
    _hold_folder(out_dir)  # a folder made just now
    if not resume:
        from gpuspeed.optimize.report import outputs

        # the last run's results: none left beside this run's
        for stale in ["candidates.jsonl", "confirmations.jsonl", *outputs(wl.name)]:
            (out_dir / stale).unlink(missing_ok=True)
        W.save_refs(refs_file, refs)
        first_ref = refs[seeds[0]]  # the workers read the others from refs.pkl: this process keeps one seed's, not all
        del refs
        tmp = run_file.with_suffix(".json.tmp")  # whole or not at all: a kill mid-write leaves the old one
        tmp.write_text(json.dumps(key | {"workload_sha256": source_hash, "seeds": seeds, "timing_seed": TIMING_SEED,
                                         "original_mutates": mutates, "in_place": in_place,
                                         "in_place_returns": wl.in_place_returns, "returns_args": wl.returns_args,
                                         "returns_views": wl.returns_views,
                                         "bf16_outputs": wl.bf16_outputs, "reference_s": reference_s}, indent=1))
        tmp.replace(run_file)
    params = {"workload": str(wl.path), "func": func, "scale": wl.scale, "input_specs": wl.input_specs,
              "budget": budget, "budget_bytes": budget_bytes, "rtol": wl.rtol, "atol": wl.atol,
              "tolerance_source": wl.tolerance_source, "device": where, "target_gpu": target_gpu,
              "time_budget_s": time_budget, "seeds": seeds, "backends": sorted(requested), "rank_by": rank_by,
              "in_place": in_place, "in_place_returns": wl.in_place_returns, "returns_args": wl.returns_args,
              "cwd": os.getcwd(), "reference_s": reference_s}
    run = OptimizeRun(wl=wl, where=where, out_dir=out_dir, params=params, notes=list(wl.notes) + early_notes)
    home.notes = run.notes  # a later move (the hotspot pass's calls) is said in the run's notes
    if in_place and wl.in_place_returns:
        names = W.param_names(wl, in_place)
        run.notes.append(f"{wl.func} returns its result and also changes {names}: both are its output, checked in "
                         "every candidate; each timed call works on the last one's arguments; the optimized script "
                         "writes them back into yours")
    elif in_place:
        names = W.param_names(wl, in_place)
        run.notes.append(f"{wl.func} returns None and writes its result into {names}: those arguments after the call "
                         "are its output, checked in every candidate; each timed call works on the last one's result "
                         "(a step loop's use); the optimized script writes them back into yours")
    elif mutates:
        run.notes.append(f"{wl.func} changes its own input arrays: candidates are allowed to as well")
    unchecked = _non_finite_note(wl.func, first_ref, seeds[0])
    if unchecked:
        run.notes.append(unchecked)
    base_spec = {"workload": str(wl.path), "func": func, "input_specs": wl.input_specs, "scale": wl.scale,
                 "rtol": spec_rtol, "atol": atol, "device": where, "seeds": seeds, "timing_seed": TIMING_SEED,
                 "refs": str(refs_file.absolute()), "out_dtypes": W.out_dtypes(first_ref), "original_mutates": mutates,
                 "in_place": in_place, "in_place_returns": wl.in_place_returns, "returns_args": wl.returns_args,
                 "returns_views": wl.returns_views,
                 "budget_bytes": budget_bytes if where == "cuda" else None,
                 "bench_budget_s": bench_budget_s or (1.5 if where == "cuda" else 0.5),
                 "bench_warmup_s": 0.3 if where == "cuda" else 0.1, "bench_min_samples": 5}
    runner = Runner(out_dir, base_spec, resume=resume)
    params["jobs"] = n_jobs
    # the whole run, report included, ends within --time-budget: candidates start only while time is left and
    # one still running at the deadline is stopped (the original too), however long it waited for the lock; the
    # references and hotspots before them count against it (t_start is the call's start)
    deadline = t_start + max(time_budget - REPORT_RESERVE_S, 0.5 * time_budget)
    runner.deadline = deadline

    def remaining():
        return deadline - time.perf_counter()

    step = [0]
    total = [3]  # hotspots, the original, the report

    def tick(label):
        step[0] += 1
        if progress:
            progress(label, step[0], total[0])

    # hotspots and the plan need only a rough time per call (the reference runs'): the original's own
    # worker then runs alongside the first candidates instead of before them (its timing still holds the
    # measure slot alone)
    tick("hotspots")
    with home:
        run.hot = analysis.analyze(wl, wl.make_args(TIMING_SEED), reference_s, gpu=where == "cuda")
        run.hot["intensity"] = _intensity(wl, first_ref, reference_s)
    run.plan_rows, recipes = C.plan(wl, where, run.hot, requested)
    total[0] += len(recipes)

    from gpuspeed.optimize import confirm as K

    # the fastest candidate is confirmed after all of them: they stop that much before the deadline (the original
    # does not: every speedup divides its time); run.params records it
    confirm_reserve = K.reserve_s(reference_s or 0.0, base_spec["bench_budget_s"], remaining(), least_s=MIN_LIMIT_S)
    params["confirm_reserve_s"] = confirm_reserve
    kept: dict[str, float] = {}  # the reserve each candidate left aside when its limit was set (the runner's, too)
    started: set[str] = set()
    runner.reserve = lambda rec: kept.get(rec["name"], 0.0)

    span = remaining()

    def confirm_need() -> float | None:
        """The confirmation's own estimate at its fewest rounds once the original and a correct candidate are timed:
        of the fastest of them so far, the likely primary (the guess before it is START_GUESS_S and the original's
        rough time a call)."""
        orig = runner.done.get("original") or {}
        way = "e2e_time" if rank_by == "e2e" else "device_time"
        timed = [r for n, r in runner.done.items() if n != "original" and r.get("status") == "ok"
                 and (r.get(way) or {}).get("median")]
        if orig.get("status") != "ok" or not (orig.get("device_time") or {}).get("median") or not timed:
            return None
        best = min(timed, key=lambda r: r[way]["median"])
        bb = base_spec["bench_budget_s"]
        return K.estimate_s(orig, best, K.FEWEST_ROUNDS, bb) + K.WORKER_START_S

    def reserve_now(left: float) -> float:
        """The reserve a candidate starting with `left` seconds leaves aside. None once the confirmation's own
        estimate, the original and a candidate timed, would not fit the most kept even at its fewest rounds (on an
        H100 pairwise_distance's 6.1 s original needed ~140 s: the 104 s kept took the last candidates' time and it
        was skipped all the same). Else all of it once one could be confirmed (one running, or one correct); before,
        only what still leaves this one its least limit (with none, there is nothing to confirm)."""
        need = confirm_need()
        if need is not None and need > K.RESERVE_SHARE * max(span, 0.0):
            params["confirm_reserve_s"] = 0.0
            return 0.0
        running = any(n not in runner.done for n in started)
        if running or any(n != "original" and r.get("status") == "ok" for n, r in runner.done.items()):
            return confirm_reserve
        return min(confirm_reserve, max(left - MIN_LIMIT_S, 0.0))

    def worker_cap(rec) -> float:
        """The most one worker may take, whatever is left: its backend's cap, or the caller's candidate_limit_s."""
        return min(_limit(rec, run.hot.get("loop_bound", False), math.inf), candidate_limit_s or math.inf)

    def limit(rec):
        left = remaining()
        if rec["name"] == "original":  # the baseline every speedup divides: it gets all that is left
            return max(left, 1.0)
        keep = reserve_now(left)
        kept[rec["name"]] = keep
        left -= keep
        if left < MIN_LIMIT_S:
            return None
        started.add(rec["name"])
        return min(left, worker_cap(rec))

    def try_all(recs, extra_jobs=0):
        recs = [r for r in recs if r["name"] not in run.results]
        for rec in recs:
            if rec["name"] in runner.done:
                tick(f"candidate {rec['name']} (resumed)")
        rows = runner.run_many(recs, limit, jobs=n_jobs + extra_jobs, on_start=lambda rec: tick(f"candidate {rec['name']}"))
        for rec in recs:
            row = rows.get(rec["name"])
            keep = kept.get(rec["name"], 0.0)
            if row is not None and row.get("status") == "skipped":
                row["reason"] = (f"not started: under {MIN_LIMIT_S:g} s of --time-budget {time_budget:g} s was left "
                                 f"for it (the last {min(REPORT_RESERVE_S, 0.5 * time_budget):g} s are kept for the "
                                 "report" + (f", and {keep:.0f} s before them for confirming the fastest candidate's "
                                             "speedup)" if keep else ")"))
            elif (row is not None and rec["name"] != "original" and row.get("at_deadline") and keep
                  and not row.get("resumed")):
                row["reason"] = (f"{row.get('reason')} (its last {keep:.0f} s, before the report's, are kept "
                                 "for confirming the fastest candidate's speedup)")
            run.results[rec["name"]] = row

    # the original's worker is one more at once: mostly single-threaded NumPy, it would take a builder's place
    host.close()
    try_all([C.recipe("original", "original")] + recipes, extra_jobs=1 if n_jobs > 1 else 0)
    orig = run.results["original"]
    original_s = (orig.get("device_time") or {}).get("median")
    if orig.get("status") == "timeout" and remaining() <= 0:
        run.notes.append(f"the original's own timing did not finish within --time-budget {time_budget:g} s "
                         f"({orig.get('reason')}): no speedups; raise --time-budget")
    elif orig.get("status") != "ok":
        run.notes.append(f"the original failed in its worker: {orig.get('reason')}")
    if orig.get("nondeterministic"):
        run.notes.append(f"{orig['nondeterministic']}; no candidate can be checked against outputs the original does "
                         "not reproduce itself: seed its random numbers (or take a Generator argument) and rerun")
    # budget: a candidate that ran out of memory or over the budget is re-run chunked
    over = [r for r in run.results.values() if r.get("status") in ("oom", "over_budget")]
    if over and remaining() < MIN_LIMIT_S:
        run.chunking = {"axes": None, "note": f"not tried: the time budget of {time_budget:g} s is spent"}
        for r in over:
            r["reason"] = (r.get("reason") or "") + f"; not re-run chunked: {run.chunking['note']}"
    elif over and in_place:
        run.chunking = {"axes": None, "note": f"not tried: {wl.func} writes its result into its arguments"}
        for r in over:
            r["reason"] = (r.get("reason") or "") + f"; not re-run chunked: {run.chunking['note']}"
    elif over:
        with _host_work(until=deadline - MIN_LIMIT_S, notes=run.notes):
            with home:
                run.chunking = _budget.propose_axes(wl, original_s=original_s)
        chunk_recs = []
        for r in over:
            if run.chunking.get("axes") is not None:
                rec = dict(r["recipe"]) | {"name": r["name"] + "+chunked",
                                           "chunk": {"axes": run.chunking["axes"], "out_axes": run.chunking["out_axes"]}}
                chunk_recs.append(rec)
            else:
                r["reason"] = (r.get("reason") or "") + f"; cannot be chunked: {run.chunking['note']}"
        total[0] += len(chunk_recs)
        try_all(chunk_recs)
    more = C.derived(run.results, wl, where, requested)
    total[0] += len(more)
    try_all(more)
    _roof_shares(run)
    if run.results.get("original", {}).get("nondeterministic"):
        _not_checkable(run.results)
    else:
        _why_wrong(run)
    # the confirmations' own lines, kept for --resume: candidates.jsonl holds candidates alone
    confirmer = Runner(out_dir, base_spec, resume=resume, file="confirmations.jsonl")
    confirmer.deadline = deadline
    _confirm_primary(run, confirmer, rank_by, remaining, worker_cap, tick, total)
    run.choice = choose(run, rank_by)
    run.projection = project(run, target_gpu)
    run.elapsed_s = time.perf_counter() - t_start
    tick("report")
    from gpuspeed.optimize import emit, report
    from gpuspeed.results import write_results

    run.paths = report.write(run)
    run.paths["script"] = str(emit.write(run))
    # the results' minutes are the whole run's, its report and script included: rewritten once they are written
    run.elapsed_s = time.perf_counter() - t_start
    write_results(report.results_doc(run), out_dir)
    return run


def _confirm_primary(run: OptimizeRun, runner: Runner, rank_by: str, remaining, cap, tick, total) -> None:
    """Before the verdict, the fastest candidate's speedup timed again with the original, alternately in one worker
    (confirm.py); one that disagrees is replaced. A candidate that is not the primary after it (the rounds show it
    slower than the original, or no faster within noise) gives way to the next, confirmed in turn. Each confirmation
    is said in one line of the notes."""
    from gpuspeed.optimize import confirm as K

    original = run.results.get("original") or {}
    if original.get("status") != "ok" or not original.get("device_time"):
        return
    for _ in range(K.MAX_CONFIRMED):
        name = _to_confirm(run, rank_by)
        if name is None:
            break
        row = run.results[name]
        try:
            conf = _confirm_one(run, runner, row, rank_by, remaining, cap, tick, total)
        except Exception as exc:  # noqa: BLE001 - the candidates' results stand, unconfirmed
            conf = {"candidate": name, "status": "error", "reason": f"{type(exc).__name__}: {W._first_line(exc)}"}
        row["confirmation"] = conf
        run.notes.append(K.line(conf))
        if choose(run, rank_by).get("primary") == name:
            return
    name = choose(run, rank_by).get("primary")
    if name and name != "original" and not run.results[name].get("confirmation"):
        run.results[name]["confirmation"] = conf = {
            "candidate": name, "status": "skipped",
            "reason": f"{K.MAX_CONFIRMED} faster-timed candidates were confirmed first (each lost its place to the "
                      "original, or was no faster than it within noise)"}
        run.notes.append(K.line(conf))


def _to_confirm(run: OptimizeRun, rank_by: str) -> str | None:
    """The candidate to confirm next: the fastest timed apart that no confirmation has timed yet, a tie with the
    original included (its rounds, the more precise, may establish it faster); None where the original or a
    confirmed primary comes first."""
    ok, not_faster, _ = _ranked(run, rank_by)
    for r in ok:
        if r["name"] == "original":
            return None
        if not r.get("confirmation"):
            return r["name"]
        if r["name"] not in not_faster:  # the primary, confirmed
            return None
    return None


def _confirm_one(run: OptimizeRun, runner: Runner, row: dict, rank_by: str, remaining, cap, tick, total) -> dict:
    from gpuspeed.optimize import confirm as K

    name, original = row["name"], run.results["original"]
    why = K.unconfirmable(original, row)
    if why:
        return {"candidate": name, "status": "skipped", "reason": why, "cause": "caches_results"}
    rec = K.recipe(row, rank_by, K.ROUNDS)
    if (runner.done.get(rec["name"]) or {}).get("status") != "ok":  # a crashed one recorded: confirmed anew
        runner.done.pop(rec["name"], None)
    # what is left of the candidates' span, within one worker's cap: its own estimate must fit it (not a candidate's
    # least limit: a fast pair needs a second or two where a candidate is given 8 s at least)
    left = remaining()
    lim = min(left, cap(rec))
    capped = lim < left  # then more --time-budget would not help: the limit is per worker
    cause = "worker_limit" if capped else "time_budget"
    within = (f"one worker may take here, of the {left:.0f} s left" if capped else
              f"left of --time-budget {run.params['time_budget_s']:g} s")
    if rec["name"] not in runner.done:  # a resumed run keeps a recorded confirmation, whatever time is left now
        bench_budget_s = runner.base["bench_budget_s"]

        def need(rounds):  # the worker's own start (its interpreter, its imports) comes before its first stage
            return K.estimate_s(original, row, rounds, bench_budget_s) + K.WORKER_START_S

        rounds = next((n for n in (K.ROUNDS, K.FEWEST_ROUNDS) if need(n) <= lim), None)
        if rounds is None:
            return {"candidate": name, "status": "skipped", "cause": cause,
                    "reason": f"{K.FEWEST_ROUNDS} rounds would take about {need(K.FEWEST_ROUNDS):.0f} s, more than the "
                              f"{max(lim, 0.0):.0f} s {within}"}
        rec["rounds"] = rounds
    total[0] += 1
    got = runner.run_many([rec], lambda _: lim, on_start=lambda r: tick(f"confirming {name}"))[rec["name"]]
    if got.get("status") != "ok" or not got.get("rounds"):
        out = {"candidate": name, "status": got.get("status") or "error",
               "reason": f"{STATUS_WORDS.get(got.get('status'), got.get('status'))}: {got.get('reason')}"}
        # stopped for time (the run's deadline, or its worker's limit): more of that time confirms it, a larger
        # --bench-budget (longer rounds) does not
        return out | ({"cause": cause} if got.get("status") == "timeout" else {})
    conf = K.judge(row, got, rank_by) | ({"resumed": True} if got.get("resumed") else {})
    K.apply(row, conf)
    return conf


class _Home:
    """Around the user's code run in this process (import, reference calls, hotspots, the axis check): the working
    directory it leaves is put back, so a relative --out and the run's files stay where the run began (workers
    are given absolute paths: their own calls may move them too). The first move is said in a note."""

    def __init__(self, notes: list):
        self.path, self.notes = os.getcwd(), notes

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        try:
            moved = os.getcwd() != self.path
        except FileNotFoundError:  # it removed the folder it was in
            moved = True
        if moved:
            os.chdir(self.path)
            if not any(n.startswith("the workload changes the working directory") for n in self.notes):
                self.notes.append(f"the workload changes the working directory: gpuspeed goes back to {self.path} "
                                  "after its calls (each candidate's calls still start from there)")


def _host_work(until: float | None = None, notes: list | None = None):
    """The compile side of a lock shared by several runs (benchmarks/optimize.py sets LOCK_ENV) while this
    run works on the host outside its workers (references, hotspots, the axis check): another run's
    measurement never has it running beside it. Alone, a run needs no lock for that (its workers wait).
    With `until` (perf_counter), the wait ends then and the work goes on without the lock (said in notes)."""
    path = os.environ.get(LOCK_ENV)
    if not path:
        return contextlib.nullcontext()
    return _compile_side(path, until, notes if notes is not None else [])


@contextlib.contextmanager
def _compile_side(path: str, until: float | None, notes: list):
    """worker._slot's compile side (through the turnstile, then the lock shared), waiting until `until` at most."""
    import fcntl

    t0 = time.perf_counter()
    with open(path + ".turnstile", "a+") as turn, open(path, "a+") as lock:
        got = _flock_until(turn, fcntl.LOCK_SH, until)
        got = got and _flock_until(lock, fcntl.LOCK_SH, until)
        fcntl.flock(turn, fcntl.LOCK_UN)  # passed through: a measurement queued behind goes next
        if not got:
            fcntl.flock(lock, fcntl.LOCK_UN)
            notes.append(f"host work (references, hotspots or the axis check) waited {time.perf_counter() - t0:.0f} s "
                         "for another run's measurement and went on without the shared lock (--time-budget)")
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _flock_until(f, mode: int, until: float | None) -> bool:
    import fcntl

    if until is None:
        fcntl.flock(f, mode)
        return True
    while True:
        try:
            fcntl.flock(f, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.perf_counter() >= until:
                return False
            time.sleep(0.05)


NON_FINITE_SHARE = 0.1  # of the original's floating output elements: past it, the check tests little of the code


def _non_finite_note(func: str, ref, seed: int) -> str | None:
    """A note where the original's outputs are largely NaN or inf on the run's inputs (random --input arrays outside
    its domain: a negative time under a square root): a candidate matches there by giving NaN too, whatever its
    arithmetic, so the check tests only the rest."""
    import numpy as np

    from gpuspeed.trees import leaves

    bad = total = 0
    for leaf in leaves(ref):
        try:
            if hasattr(leaf, "is_floating_point"):  # a torch tensor: bfloat16 has no NumPy form, integers skip
                if not (leaf.is_floating_point() or leaf.is_complex()):
                    continue
                leaf = leaf.detach().cpu()
                leaf = leaf.float() if leaf.is_floating_point() else leaf
            a = np.asarray(leaf)
        except Exception:  # an output NumPy cannot read: not counted
            continue
        if a.dtype.kind in "fc" and a.size:
            bad += int(a.size - np.count_nonzero(np.isfinite(a)))
            total += a.size
    if not total or bad < NON_FINITE_SHARE * total:
        return None
    return (f"{bad / total:.0%} of the floating output elements of {func} are NaN or inf on the run's inputs (seed {seed}): "
            "a candidate matches them by giving NaN or inf too, whatever its arithmetic, so the check tests only the "
            "rest; inputs inside the function's domain (a workload file's inputs(rng), or --input scalars) test more")


def _not_checkable(results: dict) -> None:
    """Candidates that differed from the outputs of an original that does not reproduce its own: their status is
    "unverifiable", not "incorrect" (they differ from it as it differs from itself: nothing says they are wrong,
    nor right). A wrong structure, or a new array where the original hands back its argument, stays a fault."""
    for r in results.values():
        if r.get("status") == "incorrect" and str(r.get("reason") or "").startswith(("seed ", "result read right")):
            r["status"] = "unverifiable"
            r["reason"] = f"not checkable: the original does not reproduce its own output ({r['reason']})"


def _why_wrong(run: OptimizeRun) -> None:
    """WRONG rows whose cause the original's source shows: a slice updated in place from an overlapping slice (NumPy
    buffers it, Numba and CuPy do not), or seeded random numbers (Numba parallel=True draws per thread, CuPy and torch
    run other generators: the run also says once that such candidates cannot match)."""
    wrong = [r for r in run.results.values() if r.get("status") == "incorrect" and
             str(r.get("reason") or "").startswith("seed ")]
    draw = analysis.random_draws(run.wl.original) if wrong else None
    overlap = analysis.overlapping_update(run.wl.original) if wrong else None
    for r in wrong if overlap else ():
        r["reason"] += (f"; the original updates a slice in place from an overlapping slice of the same array "
                        f"({overlap}): NumPy buffers the overlap and reads the old values, this backend updates element "
                        "by element and reads what it already wrote (`a[1:] = a[1:] + a[:-1]`, a new array assigned, "
                        "reads the old values everywhere)")
    if draw is None:
        return
    for r in wrong:
        r["reason"] += (f"; the original draws random numbers ({draw}): this backend's generator may draw others from "
                        "the same seed (another algorithm, stream or order), which alone would make it differ")
    run.notes.append(f"the original draws random numbers ({draw}): a candidate whose generator draws other numbers "
                     f"than the original's ({', '.join(r['name'] for r in wrong)} differed) cannot match it; pass the "
                     "random numbers in as an argument (made in inputs()) to compare the computation itself")


def _roof_shares(run: OptimizeRun) -> None:
    """Each GPU candidate's least traffic per call over its device time, as % of this GPU's datasheet
    bandwidth (a lower bound on how close it runs to the memory roof)."""
    if run.where != "cuda":
        return
    sheet = _device.get_device("cuda").datasheet
    if not sheet:
        return
    for r in run.results.values():
        t = _median(r, "device_time")
        if r.get("traffic_bytes") and t:
            r["GBps"] = r["traffic_bytes"] / t / 1e9
            r["pct_of_bw_roof"] = 100 * r["GBps"] / sheet.mem_GBps


def _backends(backends) -> set:
    if not backends:
        return set(C.ALL_BACKENDS)
    names = set()
    for b in backends:
        names |= {x.strip().replace("-", "_") for x in str(b).split(",") if x.strip()}
    names = {"variant" if n == "variants" else n for n in names}
    bad = sorted(names - set(C.ALL_BACKENDS))
    if bad:
        raise UserError(f"unknown backend {bad[0]!r}: use {', '.join(C.ALL_BACKENDS)}")
    return names


def family(rec: dict) -> str:
    return rec["backend"]


def _median(row: dict, which: str) -> float | None:
    m = row.get(which) or {}
    return m.get("median")


def _ranked(run: OptimizeRun, rank_by: str) -> tuple[list[dict], set[str], set[str]]:
    """The correct candidates, the original included, fastest first by the times the run ranks on, each given its
    speedups over the original; the names of those not established faster than it (ties, and slower); and of those
    its confirmation found slower (behind the original, whatever their time taken apart said)."""
    from gpuspeed.timing import Measurement, compare

    key = "device_time" if rank_by == "device" else "e2e_time"
    orig = run.results.get("original", {})
    base = Measurement.from_dict(orig["device_time"]) if orig.get("status") == "ok" and orig.get("device_time") else None
    ok = [r for r in run.results.values() if r.get("status") == "ok" and _median(r, key)]
    for r in ok:
        for which, label in (("device_time", "speedup"), ("e2e_time", "speedup_e2e")):
            if base is not None and r.get(which) and not (r.get(label) or {}).get("confirmed"):
                c = compare(base, Measurement.from_dict(r[which]))
                r[label] = {"speedup": c.speedup, "ci_low": c.ci_low, "ci_high": c.ci_high, "verdict": c.verdict}
    _rescale_others(run, ok)
    # timed alternately with the original, slower than it: behind it, whatever its time taken apart said
    demoted = {r["name"] for r in ok if (r.get("confirmation") or {}).get("demoted")}
    ok.sort(key=lambda r: (r["name"] in demoted, _median(r, key)))
    label = "speedup" if rank_by == "device" else "speedup_e2e"
    not_faster = {r["name"] for r in ok if r["name"] != "original" and _verdict(r, label) not in (None, "faster")}
    return ok, not_faster, demoted


def _verdict(row: dict, label: str) -> str | None:
    """A candidate's verdict against the original on the times it was ranked by (label: speedup or speedup_e2e): its
    confirmation's rounds' where they were timed (alternately: the more precise), whether they replaced the separate
    timings or agreed with them within the slack allowed two timings apart (a 1.31x timed apart agreed with rounds of
    1.01x [0.86, 1.07], the same code); else the separate timings'. None where there is no original to compare with."""
    from gpuspeed.optimize import confirm as K

    sp = row.get(label) or {}
    if not sp:
        return None
    conf = row.get("confirmation") or {}
    if conf.get("status") == "ok" and conf.get("ratios"):
        return K.rounds_verdict(conf["ratios"])
    return sp.get("verdict")


def choose(run: OptimizeRun, rank_by: str = "device") -> dict:
    """Primary: the fastest correct candidate within budget established faster than the original (the original
    when none is: a candidate the same within noise brings a new backend for no established gain; `closest` names
    the fastest of those); alternative: the fastest correct one from another backend, established faster too."""
    key = "device_time" if rank_by == "device" else "e2e_time"
    orig = run.results.get("original", {})
    ok, not_faster, demoted = _ranked(run, rank_by)
    ranked = [r for r in ok if r["name"] not in not_faster]
    primary = ranked[0] if ranked else None
    orig_t = _median(orig, key) if orig.get("status") == "ok" else None
    # an alternative slower than the original is nothing to offer: it must beat the original too
    alternative = next((r for r in ranked[1:] if family(r["recipe"]) != family(primary["recipe"])
                        and r["name"] != "original" and r["name"] not in demoted
                        and not _rescaled_slower(r, "speedup" if rank_by == "device" else "speedup_e2e")
                        and (orig_t is None or _median(r, key) < orig_t)),
                       None) if ranked else None
    # timed faster than the original and not established so (the demoted sort behind it): what it kept its place against
    closest = ok[0] if primary and primary["name"] == "original" and ok[0]["name"] != "original" else None
    dropins = [run.results[n] for n in ("cupy", "torch-compile", "torch-cuda") if n in run.results
               and run.results[n].get("status") == "ok"]
    best_dropin = min(dropins, key=lambda r: _median(r, key)) if dropins else None
    out = {"rank_by": rank_by, "primary": primary["name"] if primary else None,
           "alternative": alternative["name"] if alternative else None,
           "best_dropin": best_dropin["name"] if best_dropin else None,
           "kept_original": bool(primary and primary["name"] == "original")}
    if primary and best_dropin:
        out["over_best_dropin"] = _median(best_dropin, key) / _median(primary, key)
    if primary and primary.get("speedup"):
        out["speedup"] = primary["speedup"]["speedup"]
        out["speedup_ci"] = [primary["speedup"]["ci_low"], primary["speedup"]["ci_high"]]
        out["speedup_e2e"] = (primary.get("speedup_e2e") or {}).get("speedup")
    reasons = []
    sp = (out.get("speedup_e2e") if rank_by == "e2e" else out.get("speedup")) or 0.0
    tried = [n for n, r in run.results.items() if n != "original" and r.get("status") != "skipped"]
    missing = [r["why"].split(" is not installed")[0] for r in run.plan_rows if r.get("decision") == "skipped" and
               "is not installed" in (r.get("why") or "")]
    out_of_time = [n for n, r in run.results.items() if n != "original" and r.get("status") == "skipped"]
    if run.results.get("original", {}).get("nondeterministic"):
        reasons.append("the original is not deterministic: it does not reproduce its own output on the same inputs")
    if not tried and out_of_time:
        reasons.append(f"too little of the time budget was left for any candidate ({', '.join(out_of_time)} not "
                       f"started: each needs {MIN_LIMIT_S:g} s, and the last part of the budget is kept for the report): "
                       "raise --time-budget")
    elif not tried:
        why = ["no GPU here"] if run.where != "cuda" else []
        why += [f"not installed: {', '.join(missing)}"] if missing else ["no other backend applies"]
        reasons.append(f"no candidate could run here ({'; '.join(why)})")
    elif not any(r["name"] != "original" for r in ok):
        # say what became of them: "could not be built" (numba on untyped code) is not "wrong", nor "timed out"
        fates: dict[str, list[str]] = {}
        for n in tried:
            fates.setdefault(STATUS_WORDS.get(run.results[n].get("status"), str(run.results[n].get("status"))), []).append(n)
        reasons.append("no candidate gave a correct result here ("
                       + "; ".join(f"{fate}: {', '.join(names)}" for fate, names in fates.items()) + ")")
    if closest:
        out["closest"] = _closest(closest, rank_by)
        reasons.append(out["closest"]["why"])
    if run.hot.get("sequential"):
        out["why_not_gpu"] = _sequential_why(run.hot)
    if primary and sp < 2:
        if run.hot.get("sequential"):
            reasons.append(out["why_not_gpu"])
        if run.where != "cuda" and tried:
            reasons.append("no GPU here: only CPU candidates ran")
        # against the device-resident one, whatever ranked; of the closest candidate where the original stays (a
        # float32 one 5x on inputs already cast and a tie with the casts: what it would take is to keep the data cast)
        lead = closest or primary
        e2e, dev = (lead.get("speedup_e2e") or {}).get("speedup"), (lead.get("speedup") or {}).get("speedup")
        if e2e is not None and dev and e2e < 0.5 * dev:
            reasons.append(f"transfer-bound: end to end {e2e:.2f}x against {dev:.2f}x device-resident; keep the data "
                           "on the GPU between calls" if run.where == "cuda" else
                           f"conversion-bound: end to end {e2e:.2f}x against {dev:.2f}x on inputs already cast; keep "
                           "the data in the candidate's precision between calls")
        if _median(primary, key) < 50e-6 and run.where == "cuda":
            reasons.append("the work is tiny: launch overhead dominates; batch more work per call")
        if not reasons:
            reasons.append("the original is already efficient array code for this size")
    out["why_not_2x"] = reasons
    out["caveats"] = _timing_caveats(run, primary, key)
    made = [r["confirmation"] for r in run.results.values() if r.get("confirmation")]
    # the primary's, or where the original stays, that of the candidate that lost its place to it (the closest one's
    # where it was confirmed)
    out["confirmation"] = (primary or {}).get("confirmation") or (closest or {}).get("confirmation") or (
        made[-1] if made and primary is not None and primary["name"] == "original" else None)
    out["fastest_route"] = primary["label"] if primary else None
    if run.hot.get("sequential") and (not primary or primary["name"] == "original"):
        out["fastest_route"] = _numba_route(run)
    return out


def _closest(row: dict, rank_by: str) -> dict:
    """The choice's record of the fastest candidate the original kept its place against, no faster than it within
    noise: its ratio and interval (its confirmation's where one was timed: the more precise), and the reason said."""
    from gpuspeed.optimize.report import _fmt_x, _ratio

    label = "speedup" if rank_by == "device" else "speedup_e2e"
    sp, verdict = row.get(label) or {}, _verdict(row, label)
    conf = row.get("confirmation") or {}
    way = " end to end" if rank_by == "e2e" else ""
    if conf.get("status") == "ok":  # replaced or agreed: its rounds are the measurement that counts
        ratio, ci = conf["ratio"], [conf["low"], conf["high"]]
        timed = "alternately"
        said = (f"{_ratio(ratio)}x [{_ratio(ci[0])}, {_ratio(ci[1])}]{way} timed alternately with the original "
                f"({conf['rounds']} rounds; {'same within noise' if verdict == 'same' else verdict})")
    else:
        ratio, ci, timed = sp.get("speedup"), [sp.get("ci_low"), sp.get("ci_high")], "apart"
        said = f"{_fmt_x(sp)}{way}"
    return {"name": row["name"], "label": row.get("label"), "speedup": ratio, "ci": ci, "timed": timed,
            "why": f"no candidate is established faster than the original: the fastest, {row['name']} "
                   f"({row.get('label')}), is {said}, so the original stays (that candidate would bring a new backend "
                   "for no established gain)"}


def _rescale_others(run: OptimizeRun, ok: list[dict]) -> None:
    """A replaced confirmation that found the original's own time moved (timed apart against alternately): every
    ratio over its separate time is off by that factor, so the other candidates' speedups are rescaled to its time
    in the confirmation (else the table and the PNG put a 1.5x candidate at 200x beside a primary confirmed at 3x).
    Where only the candidate's side moved, the others' speedups stand."""
    from gpuspeed.optimize import confirm as K

    original = run.results.get("original") or {}
    separate_s = (original.get("device_time") or {}).get("median")
    conf = next((r["confirmation"] for r in ok if (r.get("confirmation") or {}).get("replaced")), None)
    if not conf or not separate_s or not conf.get("original_s"):
        return
    factor = conf["original_s"] / separate_s
    if 1 / (1 + K.SLACK) <= factor <= 1 + K.SLACK:
        return
    for r in ok:
        own = (r.get("confirmation") or {}).get("status") == "ok"
        for label in ("speedup", "speedup_e2e"):
            if r["name"] != "original" and not own and r.get(label) and not r[label].get("confirmed"):
                r[label] = K.rescaled(r[label], factor)


def _rescaled_slower(row: dict, label: str) -> bool:
    """Whether the row's speedup, rescaled by a replaced confirmation, says it is no faster than the original."""
    sp = row.get(label) or {}
    return bool(sp.get("rescaled")) and sp["speedup"] <= 1


def _timing_caveats(run, primary, key: str) -> list[str]:
    """What keeps the primary's speedup from being established: a timing bench flagged unreliable (its
    note says why), or a comparison whose CI does not exclude 'no faster'."""
    if not primary or primary["name"] == "original":
        return []
    said = []
    for name in ("original", primary["name"]):
        m = run.results.get(name, {}).get(key) or {}
        if m.get("unreliable"):
            why = next((n for n in m.get("notes") or [] if n.startswith("unreliable")), "unreliable")
            said.append(f"{name}'s timing is {why}")
    label = "speedup" if key == "device_time" else "speedup_e2e"  # the times it was ranked by
    sp = primary.get(label) or {}
    if sp and _verdict(primary, label) != "faster":  # its confirmation's rounds may have established it
        said.append(f"the speedup {sp['speedup']:.3g}x [{sp['ci_low']:.3g}, {sp['ci_high']:.3g}] is not established "
                    f"(the comparison says {sp.get('verdict')!r})")
    noisy = bool(said)  # an unreliable timing or an unestablished comparison
    conf = primary.get("confirmation") or {}
    unconfirmed = bool(conf) and conf.get("status") != "ok"
    if unconfirmed:
        said.append(f"not confirmed by timing it alternately with the original ({conf.get('reason')})")
    # a confirmation skipped for its cache (said below) or for time: a larger --bench-budget would not bring one
    if noisy or (unconfirmed and not conf.get("cause")):
        said.append("rerun with a larger --bench-budget on a quiet machine before trusting it")
    if conf.get("cause") == "time_budget":
        said.append("a larger --time-budget leaves room to confirm it")
    elif conf.get("cause") == "worker_limit":  # a larger --time-budget would not: the limit is per worker
        said.append("confirming it takes longer than one worker may; an original that takes less a call (a smaller "
                    "--scale, where inputs() takes one) can be confirmed")
    for name in ("original", primary["name"]):
        cached = run.results.get(name, {}).get("caches_results")
        if cached:  # the worker timed it again on inputs it had not seen (worker._fresh_inputs_probe)
            said.append(f"{name} caches its results by input ({_fmt_s(cached['repeated_median'])} a call on the same "
                        f"arguments again, {_fmt_s(cached['fresh_median'])} on fresh ones): its time is that of a few "
                        "calls on fresh inputs, not a repeated call's")
    return said


def _fmt_s(seconds: float) -> str:
    from gpuspeed.stats import format_time

    return format_time(seconds)


def _sequential_why(hot: dict) -> str:
    loop = next((lp for lp in hot.get("hot_loops") or [] if lp.get("kind") == "sequential-loop" or
                 "sequential" in (lp.get("verdict") or "")), None)
    where = f"the loop at line {loop['line']}" if loop and loop.get("line") else "the hot loop"
    steps = f" ({loop['iterations']:,} steps at the hotspot pass's size)" if loop and loop.get("iterations") else ""
    return (f"sequential dependence: each iteration of {where}{steps} needs the previous one's result, so a GPU can "
            "run its steps only one at a time (a launch or a single thread per step) and no GPU candidate can reach "
            "2x (only a rewrite as a parallel scan would use one, where the step is associative, as a linear "
            "recurrence's is)")


def _numba_route(run) -> str:
    """The fastest achievable route for a sequential loop when nothing beat the original here: Numba on the CPU,
    with why it did not run or did not win here."""
    tried = [run.results[n] for n in ("numba", "numba-serial") if n in run.results]
    ok = [r for r in tried if r.get("status") == "ok"]
    r = min(ok, key=lambda r: (r.get("e2e_time") or {}).get("median") or float("inf")) if ok else \
        (tried[0] if tried else None)  # the faster of parallel=True and the serial njit
    plan = next((p for p in run.plan_rows if p.get("key") == "numba"), {})
    if r is None:
        return f"Numba @njit on the CPU (not tried here: {plan.get('why') or 'not planned'})"
    if r.get("status") != "ok":
        return f"Numba @njit on the CPU (here: {r.get('status')}: {r.get('reason') or '?'})"
    return f"Numba @njit on the CPU ({r.get('label')})"


def _intensity(wl, ref, original_s) -> dict:
    """The original's arithmetic intensity (counted at a small scale) and its FLOPs at the full size."""
    from gpuspeed.optimize import flops as F

    try:
        if wl.scale_used:
            small = _budget_small_args(wl)
        elif original_s is not None and original_s < 2.0:
            small = wl.make_args(TIMING_SEED)
        else:
            return {"ai": None, "note": "FLOPs not counted: no small inputs and a slow original"}
        res = F.intensity(wl.original, small, W.import_workload(wl.path, unique=True))
    except Exception as exc:  # advice only: no intensity leaves the projection memory-bound
        return {"ai": None, "note": f"FLOPs not counted: {type(exc).__name__}: {exc}"}
    full_bytes = nbytes(wl.make_args(TIMING_SEED)) + nbytes(ref)
    if res.get("ai"):
        res["flops_full"] = res["ai"] * full_bytes
    res["bytes_full"] = full_bytes
    return res


def _budget_small_args(wl):
    import numpy.random as npr

    out = wl.module.inputs(npr.default_rng(0), scale=min(wl.scale, _budget.SMALL_SCALE))
    return out if isinstance(out, tuple) else tuple(out) if isinstance(out, list) else (out,)


def _unit(row: dict, float64: bool) -> str:
    p = row["recipe"].get("precision")
    return "tf32" if p == "tf32" else "fp64" if float64 and p != "float32" else "fp32"


def project(run: OptimizeRun, target_gpu: str) -> dict:
    """The primary's time on the target card from its roofline placement: its FLOPs (the original's
    counted intensity) and least traffic give its intensity; it keeps the fraction of the roof it reaches
    here, under the target's datasheet roof at that intensity (bandwidth, or the compute peak of its
    precision: FP64's cliff on consumer cards). Without counted FLOPs: the bandwidth ratio. A projection."""
    name = run.choice.get("primary")
    sheet_t = _device.datasheet_for(target_gpu)
    out = {"target": sheet_t.name if sheet_t else target_gpu, "label": "projection, not a measurement"}
    if not name:
        out["note"] = "no primary candidate to project"
        return out
    row = run.results[name]
    t = _median(row, "device_time")
    here = _device.get_device(run.where)
    sheet_h = here.datasheet
    peak = row.get("peak_bytes")
    cap = run.params["budget_bytes"]
    out["fits_target_memory"] = None if peak is None or cap is None else bool(peak <= cap * (1 - HEADROOM))
    if run.where != "cuda" or row["recipe"]["backend"] in ("numba", "numpy", "original") or not sheet_h:
        out["note"] = ("the primary runs on the CPU: the target GPU would run it the same" if run.where == "cuda"
                       else "measured without a GPU: no device time to scale")
        return out
    bw_ratio = sheet_h.mem_GBps / sheet_t.mem_GBps
    out["memory_bound_s"] = t * bw_ratio
    out["bandwidth_ratio"] = bw_ratio
    unit = _unit(row, run.hot.get("float64", False))
    out["unit"] = unit
    flops = (run.hot.get("intensity") or {}).get("flops_full")
    traffic = row.get("traffic_bytes")
    if not flops or not traffic or not t:
        out["note"] = "FLOPs not counted: scaled by the bandwidth ratio (a memory-bound projection)"
        return out
    ai = flops / traffic
    peak_h, peak_t = (sheet_h.peak(unit) or sheet_h.fp32_TFLOPs) * 1e12, (sheet_t.peak(unit) or sheet_t.fp32_TFLOPs) * 1e12
    roof_h = min(ai * sheet_h.mem_GBps * 1e9, peak_h)
    roof_t = min(ai * sheet_t.mem_GBps * 1e9, peak_t)
    achieved = flops / t
    frac = achieved / roof_h
    out |= {"ai": ai, "flops": flops, "achieved_TFLOPs": achieved / 1e12, "roof_here_TFLOPs": roof_h / 1e12,
            "pct_of_roof_here": 100 * frac, "roof_target_TFLOPs": roof_t / 1e12,
            "bound_here": "memory" if ai * sheet_h.mem_GBps * 1e9 < peak_h else "compute",
            "bound_target": "memory" if ai * sheet_t.mem_GBps * 1e9 < peak_t else "compute",
            "projected_s": flops / (frac * roof_t) if frac > 0 else None}
    out["note"] = (f"{unit} at {ai:.2f} FLOP/B: {out['bound_here']}-bound here at {100 * frac:.0f} % of the datasheet "
                   f"roof, {out['bound_target']}-bound on the target; FLOPs: "
                   f"{(run.hot.get('intensity') or {}).get('source', '?')}")
    if unit == "fp64" and out["bound_target"] == "compute":
        out["note"] += f"; FP64 runs at {sheet_t.fp64_TFLOPs:g} TFLOP/s there: the float32 candidate avoids the cliff"
    return out


def geomean(values) -> float | None:
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None
