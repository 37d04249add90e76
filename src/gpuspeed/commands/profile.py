"""`gpuspeed profile`: profile a script, or a function on generated inputs, and report the findings."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

RUNS_HELP = ("A script runs warmup + steps times under the profiler (0 + 1 by default), once more to place "
             "each finding at its source line, and twice more for the Python hotspots (cProfile, then line "
             "times) unless --no-hotspots: 4 runs by default, 2 with --no-hotspots. A function is called the "
             "same way (1 + 5 + 1 + 2 = 9 calls by default).")


def register(app: typer.Typer) -> None:
    # everything after the script's path is the script's own (allow_interspersed_args=False): its --json, --steps...
    @app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                   "allow_interspersed_args": False},
                 help="Profile a script or a function: GPU busy/idle, launch gaps, tiny kernels, host syncs, "
                      "transfers, top kernels and Python hotspots, each at its source line. " + RUNS_HELP +
                      " A script that calls sys.exit(n) with n != 0 still gets its profile, with a note.")
    def profile(
        ctx: typer.Context,
        script: Optional[str] = typer.Argument(None, help="Script to run (its arguments follow it)."),
        function: Optional[str] = typer.Option(None, "--function", "-f", help="path/to/file.py:name to call."),
        inputs: List[str] = typer.Option([], "--input", "-i",
                                         help="NAME=DTYPE[SHAPE] or NAME=int:VALUE / NAME=float:VALUE."),
        steps: Optional[int] = typer.Option(None, help="Profiled calls, at least 1 (default 5 for --function, 1 "
                                                       "for a script)."),
        warmup: Optional[int] = typer.Option(None, help="Calls before profiling (default 1 for --function, 0 "
                                                        "for a script)."),
        seed: int = typer.Option(0, help="Seed of the generated inputs."),
        backend: str = typer.Option("auto", help="Array library of the --function inputs: torch, numpy or cupy; "
                                                 "auto reads it from the function's module (torch if it imports "
                                                 "torch, else cupy, else numpy)."),
        device: str = typer.Option("auto", help="cpu, cuda or auto."),
        hotspots: bool = typer.Option(True, "--hotspots/--no-hotspots", help="Also profile the Python side."),
        out: Optional[str] = typer.Option(None, "--out", metavar="<path>",
                                         help="Write profile.json, profile.md and the trace here."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary and findings as JSON on stdout (the "
                                                           "profiled code's own output goes to stderr)."),
    ):
        from gpuspeed.commands import esc, make_console

        from gpuspeed import device as _device
        from gpuspeed.errors import UserError
        from gpuspeed.inputs import parse_specs
        from gpuspeed.loading import load_function
        from gpuspeed.profiling import profile as run_profile
        from gpuspeed.profiling.backend import infer_backend, make_backend_inputs
        from gpuspeed.profiling.report import print_report, results_doc
        from gpuspeed.profiling.script import ScriptRunner, print_json_alone, stdout_to_stderr
        from gpuspeed.results import check_out_dir, signals_held, stop_signals, write_results, write_text_atomic

        console = make_console(stderr=as_json)
        if device not in ("auto", "cpu", "cuda"):
            raise UserError(f"unknown device {device!r}: use cpu, cuda or auto")
        if backend not in ("auto", "torch", "numpy", "cupy"):
            raise UserError(f"unknown backend {backend!r}: use auto, torch, numpy or cupy")
        if steps is not None and steps < 1:
            raise UserError(f"--steps {steps}: profile at least 1 step")
        if warmup is not None and warmup < 0:
            raise UserError(f"--warmup {warmup}: cannot be negative")
        from gpuspeed.profiling.run import MAX_STEPS, MAX_WARMUP

        if steps is not None and steps > MAX_STEPS:  # said in profile()'s words (steps=20000) after the device note
            raise UserError(f"--steps {steps}: at most {MAX_STEPS} (the profiler holds every step's events in memory)")
        if warmup is not None and warmup > MAX_WARMUP:
            raise UserError(f"--warmup {warmup}: at most {MAX_WARMUP}")
        if script and script.startswith("-") and not Path(script).is_file():  # an unknown option lands here
            raise UserError(f"no such option: {script} (gpuspeed profile --help lists them; a script's own options "
                            "go after its path)")
        if (script is None) == (function is None):
            raise UserError("give either a script to run or --function path/to/file.py:name")
        out = check_out_dir(out)
        where = _device.resolve_device(device)
        kwargs: dict = {}
        notes = []
        runner = None
        if function:
            if ctx.args:
                raise UserError(f"unexpected arguments {' '.join(ctx.args)} (inputs go in --input)")
            specs = parse_specs(inputs)
            with stop_signals(), stdout_to_stderr() if as_json else _nothing():  # SIGTERM: one line, 143
                fn = load_function(function)
            if backend == "auto":
                backend, why = infer_backend(fn)
                notes.append(f"inputs as {backend} arrays: {why} (--backend to choose)")
            from gpuspeed.profiling.run import check_inputs_fit
            from gpuspeed.trees import callable_name

            check_inputs_fit(fn, [sp.name for sp in specs], callable_name(fn), inputs)
            kwargs = make_backend_inputs(specs, backend, seed=seed, device=where)
            steps, warmup = steps or 5, 1 if warmup is None else warmup
        else:
            if inputs:
                raise UserError("--input goes with --function, not with a script")
            if backend != "auto":  # a script makes its own arrays: the option would be silently ignored
                raise UserError("--backend goes with --function, not with a script")
            if seed != 0:
                raise UserError("--seed goes with --function (it seeds the --input arrays), not with a script")
            fn = runner = ScriptRunner(script, ctx.args)
            backend = None
            steps, warmup = steps or 1, 0 if warmup is None else warmup
        if where == "cpu":
            console.print(f"[yellow]note:[/] {_device.why_cpu()}: profiling the host side only (no kernels, gaps or transfers).")
        if as_json:  # the report prints res.notes, which start with these: once is enough
            for n in notes:
                console.print(f"[yellow]note:[/] {esc(n)}")
        from gpuspeed.trees import callable_name

        name = callable_name(fn)  # an nn.Module, a functools.partial or a callable object has no __name__
        trace_path = out / f"{name}.trace.json.gz" if out else None
        # SIGTERM (`timeout`): one line and 143; it killed the run where it stood, leaving the unfinished trace
        with stop_signals(), stdout_to_stderr() if as_json else _nothing():
            try:  # inside: stop_signals' own SystemExit (143, 130) is not the user's
                res = run_profile(fn, steps=steps, warmup=warmup, kwargs=kwargs, device=where,
                                  trace_path=trace_path, hotspots=hotspots)
            except UserError:
                raise
            except (Exception, SystemExit) as exc:  # the user's code failed (its sys.exit too, which ended gpuspeed
                # silently with its code): one line, the traceback under --debug
                if ctx.find_root().params.get("debug"):
                    raise
                from gpuspeed.loading import _first_line
                from gpuspeed.profiling.script import raised_at

                at = raised_at(exc) if not isinstance(exc, SystemExit) else None
                which = runner.failed_run_note(warmup + steps + 1 + 2 * hotspots) if runner is not None else ""
                raise UserError(f"{name} raised {_first_line(exc)}" + (f" (at {at})" if at else "") + which) from exc
        res.notes[:0] = notes
        if runner is not None:
            res.notes.append(f"ran {script} {runner.runs} times ({warmup} warm-up, {steps} profiled, 1 to place "
                             f"source lines{', 2 for Python hotspots' if hotspots else ''})")
            if runner.exit_note():
                res.notes.append(runner.exit_note())
        params = {"target": function or script, "inputs": list(inputs), "seed": seed, "backend": backend,
                  "script_args": list(ctx.args)}
        doc = results_doc(res, params=params)
        if out:
            with signals_held():  # the trace is in --out already: its json and md are written whole beside it
                path = write_results(doc, out)
                md = out / "profile.md"
                write_text_atomic(md, res.markdown())
            console.print(f"wrote {esc(path)}, {esc(md)} and {esc(res.trace_path)}")
        if as_json:
            from gpuspeed.results import strict_json  # NaN and inf as null, as profile.json has them

            # what the script's atexit handlers print goes to stderr: stdout holds the JSON alone
            print_json_alone(strict_json({"summary": doc["summary"], "findings": res.findings,
                                          "hotspots": res.hotspots, "recommendations": res.recommendations,
                                          "notes": res.notes, "params": doc["params"], "trace": res.trace_path},
                                         indent=None))
        else:
            print_report(res, console)


def _nothing():
    import contextlib

    return contextlib.nullcontext()
