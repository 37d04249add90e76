"""`gpuspeed optimize`: hotspots, plan, isolated candidates, budget, report A-E and a standalone script."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def optimize(
        workload: str = typer.Argument(..., help="WORKLOAD.py (defines original and inputs), or a bundled example's "
                                                 "name, e.g. black_scholes."),
        func: str = typer.Option("original", "--func", help="The function to speed up."),
        inputs: List[str] = typer.Option([], "--input", "-i", help="NAME=DTYPE[SHAPE] or NAME=int:VALUE / "
                                                                   "NAME=float:VALUE, in place of inputs(rng) (NumPy "
                                                                   "arrays)."),
        budget: str = typer.Option("8GiB", "--budget", help="GPU memory budget (15 % headroom kept)."),
        rtol: Optional[float] = typer.Option(None, "--rtol", help="Relative tolerance (default: TOLERANCE or by dtype)."),
        atol: Optional[float] = typer.Option(None, "--atol", help="Absolute tolerance."),
        backends: List[str] = typer.Option([], "--backends", help="Only these: cupy, torch_compile, torch, numba, "
                                                                 "jax, numpy, variant (comma-separated or repeated)."),
        device: str = typer.Option("auto", "--device", help="auto, cuda or cpu."),
        target_gpu: str = typer.Option("RTX 4070 Laptop", "--target-gpu", help="Card to project the primary onto."),
        time_budget: float = typer.Option(300.0, "--time-budget", help="Seconds for the whole run."),
        scale: Optional[float] = typer.Option(None, "--scale", help="Input size factor for inputs(rng, scale) "
                                                                    "(default 1 with a GPU, 0.1 without)."),
        rank_by: Optional[str] = typer.Option(None, "--rank-by", help="device (data kept on the GPU; the default "
                                              "with one) or e2e (with transfers and casts; the default without)."),
        bench_budget: Optional[float] = typer.Option(None, "--bench-budget", help="Seconds bench() may spend timing "
                                                     "each candidate (default 1.5 with a GPU, 0.5 without)."),
        jobs: Optional[int] = typer.Option(None, "--jobs", help="Candidates built and checked at once (default 3 with "
                                                                "a GPU, 1 without); timing is always one at a time."),
        out: Optional[str] = typer.Option(None, "--out", metavar="<path>", help="Folder for the report (default "
                                                               "results/<gpu>/optimize/<name>)."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
        resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run in --out."),
    ):
        """Speed up WORKLOAD's original(): hotspots, a plan over every backend, each candidate checked and timed in
        its own process, the 8 GiB budget with chunking, report A-E and optimized_<name>.py."""
        from gpuspeed.commands import make_console, progress_bar
        from gpuspeed.optimize.pipeline import optimize as run_optimize
        from gpuspeed.profiling.script import stdout_to_stderr
        from gpuspeed.results import check_out_dir

        console = make_console(stderr=True)
        out = check_out_dir(out)
        from gpuspeed.results import stop_signals

        def kept():  # where a stopped run's candidates are: each is in candidates.jsonl as soon as it is measured
            if out is None or (Path(out) / "run.json").is_file():
                return "the candidates measured are kept; the same command with --resume goes on from them"
            return None

        # with --json, stdout holds the JSON alone: what the workload prints while it is loaded and run goes to stderr
        quiet = stdout_to_stderr() if as_json else contextlib.nullcontext()
        # stopped from outside (a benchmark's --limit, `timeout`, Ctrl-C): the run unwinds, so the runner stops its
        # workers too; one line says so, exit 143 (130)
        with stop_signals(kept), quiet, progress_bar(console=console, name="gpuspeed optimize") as bar:
            task = bar.add_task("loading", total=3)

            def progress(label, done, total):
                bar.update(task, description=label, completed=done - 1, total=total)

            run = run_optimize(workload, func=func, inputs=inputs, budget=budget, rtol=rtol, atol=atol,
                               backends=backends, device=device, target_gpu=target_gpu, time_budget=time_budget,
                               out=out, resume=resume, scale=scale, rank_by=rank_by, jobs=jobs, bench_budget_s=bench_budget,
                               progress=progress)
        from gpuspeed.optimize.report import results_doc

        summary = results_doc(run)["summary"]
        if as_json:
            from gpuspeed.results import strict_json  # NaN and inf as null: stdout parses as strict JSON

            print(strict_json({"summary": summary, "paths": run.paths}, indent=None))
            return
        _print(run, console=make_console())

    return optimize



def _print(run, console) -> None:
    from rich.table import Table

    from gpuspeed.commands import cpu_line, esc
    from gpuspeed.optimize.report import _fmt_t, _fmt_x, _t, peak_text, status_word

    if run.where != "cuda":
        console.print(f"[yellow]note:[/] {esc(cpu_line())}: GPU backends are skipped; CPU candidates only.")
    for n in run.notes:
        console.print(f"[yellow]note:[/] {esc(n)}")
    t = Table(title=f"gpuspeed optimize {esc(run.wl.name)}")
    e2e = run.choice.get("rank_by") == "e2e"  # the speedup the primary was chosen by
    for col in ("candidate", "status", "device-resident", "end to end",
                "speedup, end to end" if e2e else "speedup, device-resident", "peak", "note"):
        t.add_column(col)
    for name, r in run.results.items():
        style = "bold green" if name == run.choice.get("primary") else None
        t.add_row(esc(name), status_word(r), _fmt_t(_t(r)), _fmt_t(_t(r, "e2e_time")),
                  _fmt_x(r.get("speedup_e2e" if e2e else "speedup")), peak_text(r),
                  esc((r.get("reason") or "")[:100]), style=style)
    console.print(t)
    ch = run.choice
    if ch.get("primary"):
        console.print(f"primary: [bold]{esc(ch['primary'])}[/] ({esc(run.results[ch['primary']].get('label'))})"
                      + (f", alternative: {esc(ch['alternative'])}" if ch.get("alternative") else ""))
    for caveat in ch.get("caveats", []):
        console.print(f"[yellow]timing caveat:[/] {esc(caveat)}", markup=True)
    for why in ch.get("why_not_2x", []):
        console.print(f"below 2x: {esc(why)}")
    console.print(f"report: {esc(run.paths.get('report'))}")
    console.print(f"script: {esc(run.paths.get('script'))}")
