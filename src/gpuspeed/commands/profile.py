"""`gpuspeed profile`: profile a script, or a function on generated inputs, and report the findings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer


def _script_runner(script: str, argv: list[str]):
    """A callable that runs the script as __main__ with its own argv."""
    import runpy
    import sys

    p = Path(script)
    if not p.is_file():
        from gpuspeed.errors import UserError

        raise UserError(f"no such file: {p}")

    def run_script():
        old = sys.argv
        sys.argv = [str(p)] + list(argv)
        try:
            runpy.run_path(str(p), run_name="__main__")
        except SystemExit as exc:  # a script's exit(0) is a normal end
            if exc.code not in (0, None):
                raise
        finally:
            sys.argv = old

    run_script.__name__ = p.stem
    return run_script


def register(app: typer.Typer) -> None:
    @app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def profile(
        ctx: typer.Context,
        script: Optional[str] = typer.Argument(None, help="Script to run (its arguments follow it)."),
        function: Optional[str] = typer.Option(None, "--function", "-f", help="path/to/file.py:name to call."),
        inputs: List[str] = typer.Option([], "--input", "-i",
                                         help="NAME=DTYPE[SHAPE] or NAME=int:VALUE / NAME=float:VALUE."),
        steps: Optional[int] = typer.Option(None, help="Profiled calls (default 5 for --function, 1 for a script)."),
        warmup: Optional[int] = typer.Option(None, help="Calls before profiling (default 1 for --function, 0 for a script)."),
        seed: int = typer.Option(0, help="Seed of the generated inputs."),
        backend: str = typer.Option("torch", help="Inputs as torch tensors or numpy arrays."),
        device: str = typer.Option("auto", help="cpu, cuda or auto."),
        hotspots: bool = typer.Option(True, "--hotspots/--no-hotspots", help="Also profile the Python side."),
        out: Optional[Path] = typer.Option(None, "--out", help="Write profile.json, profile.md and the trace here."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary and findings as JSON."),
    ):
        """Profile a script or a function: GPU busy/idle, launch gaps, tiny kernels, host syncs, transfers,
        top kernels and Python hotspots, each at its source line."""
        from rich.console import Console

        from gpuspeed import device as _device
        from gpuspeed.errors import UserError
        from gpuspeed.inputs import make_inputs, parse_specs
        from gpuspeed.loading import load_function
        from gpuspeed.profiling import profile as run_profile
        from gpuspeed.profiling.report import print_report, results_doc
        from gpuspeed.results import write_results

        console = Console(stderr=as_json)
        if device not in ("auto", "cpu", "cuda"):
            raise UserError(f"unknown device {device!r}: use cpu, cuda or auto")
        where = _device.resolve_device(device)
        if (script is None) == (function is None):
            raise UserError("give either a script to run or --function path/to/file.py:name")
        kwargs: dict = {}
        if function:
            if ctx.args:
                raise UserError(f"unexpected arguments {' '.join(ctx.args)} (inputs go in --input)")
            fn = load_function(function)
            specs = parse_specs(inputs)
            kwargs = make_inputs(specs, seed=seed, backend=backend, device=where if backend == "torch" else "cpu")
            steps, warmup = steps or 5, 1 if warmup is None else warmup
        else:
            if inputs:
                raise UserError("--input goes with --function, not with a script")
            fn = _script_runner(script, ctx.args)
            steps, warmup = steps or 1, 0 if warmup is None else warmup
        if where == "cpu":
            console.print("[yellow]note:[/] no CUDA device: profiling the host side only (no kernels, gaps or transfers).")
        trace_path = out / f"{fn.__name__}.trace.json.gz" if out else None
        try:
            res = run_profile(fn, steps=steps, warmup=warmup, kwargs=kwargs, device=where, trace_path=trace_path,
                              hotspots=hotspots)
        except UserError:
            raise
        except Exception as exc:  # the user's code failed: one line, the traceback under --debug
            import sys

            if "--debug" in sys.argv:
                raise
            raise UserError(f"{fn.__name__} raised {type(exc).__name__}: {exc}") from exc
        params = {"target": function or script, "inputs": list(inputs), "seed": seed, "backend": backend,
                  "script_args": list(ctx.args)}
        doc = results_doc(res, params=params)
        if out:
            path = write_results(doc, out)
            md = out / "profile.md"
            md.write_text(res.markdown())
            console.print(f"wrote {path}, {md} and {res.trace_path}")
        if as_json:
            print(json.dumps({"summary": doc["summary"], "findings": res.findings, "hotspots": res.hotspots,
                              "recommendations": res.recommendations, "trace": res.trace_path}, default=str))
        else:
            print_report(res, console)
