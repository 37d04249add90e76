"""`gpuspeed kernel FILE.py:NAME`: tuning notes for a Triton or Numba CUDA kernel launcher (gpuspeed.kernel_report)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def kernel(
        ctx: typer.Context,
        target: str = typer.Argument(..., help="path/to/file.py:launcher (dotted names reach into dicts: "
                                               "file.py:variants.triton)."),
        inputs: List[str] = typer.Option([], "--input", "-i", help="NAME=DTYPE[SHAPE] or NAME=int:VALUE / "
                                                                   "NAME=float:VALUE (default: the file's inputs(rng))."),
        seed: int = typer.Option(0, help="Seed of the generated inputs."),
        backend: str = typer.Option("auto", help="Array library of --input arrays: torch, numpy, cupy or auto (read "
                                                 "from the launcher's module)."),
        device: str = typer.Option("auto", help="cpu, cuda or auto (cpu: run the kernels under the interpreters)."),
        flops: Optional[float] = typer.Option(None, help="FLOPs per call (default: none counted; the kernel is then "
                                                         "held to the memory roof)."),
        # a float, so that 4e9 is taken as --flops 2e9 is; a fraction of a byte is refused below
        nbytes: Optional[float] = typer.Option(None, "--bytes", help="Bytes moved per call (default: inputs read once "
                                                                   "+ outputs written once; for several launches "
                                                                   "whose arguments add up to more, each launch's "
                                                                   "arguments once)."),
        ceilings: Optional[str] = typer.Option(None, "--ceilings", metavar="<path>",
                                               help="The roof: a roofline.json of this GPU (gpuspeed roofline --out "
                                                    "DIR) (default: results/<gpu>/roofline.json, else measured now)."),
        # a str, not a Path: typer makes --out '' Path("."), which check_out_dir could no longer tell from the cwd
        out: Optional[str] = typer.Option(None, "--out", metavar="<path>", help="Write kernel_report.json into this folder."),
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    ):
        """Launch geometry, registers, spills, shared memory, occupancy, autotuning, roof position and a verdict."""
        from gpuspeed.commands import esc, make_console

        from gpuspeed.device import resolve_device
        from gpuspeed.errors import UserError
        from gpuspeed.inputs import parse_spec
        from gpuspeed.kernel import kernel_report
        from gpuspeed.kernel.report import given_ceilings
        from gpuspeed.kernel.target import (interpreters_left_on, launcher_error_hint, load_target, make_args,
                                            reference_check, unwrap_lazy, use_interpreters)
        from gpuspeed.results import check_out_dir, signals_held, stop_signals, write_results

        if device not in ("auto", "cpu", "cuda"):
            raise UserError(f"unknown device {device!r}: use cpu, cuda or auto")
        if backend not in ("auto", "torch", "numpy", "cupy"):
            raise UserError(f"unknown backend {backend!r}: use auto, torch, numpy or cupy")
        if flops is not None and not 0 < flops < float("inf"):  # NaN too; inf would be recorded as null
            raise UserError(f"--flops must be a positive finite number, got {flops:g}")
        if nbytes is not None and not (0 < nbytes < float("inf") and nbytes == int(nbytes)):
            raise UserError(f"--bytes must be a positive whole number of bytes, got {nbytes:g}")
        nbytes = None if nbytes is None else int(nbytes)
        if backend != "auto" and not inputs:  # the file's inputs(rng) makes its own arrays: it would be ignored
            raise UserError("--backend goes with --input (the array library of the --input arrays)")
        if seed < 0:
            raise UserError(f"--seed must be >= 0, got {seed}")
        out = check_out_dir(out)
        where = resolve_device(device)
        if (said := interpreters_left_on(os.environ, where == "cuda")) is not None:
            raise UserError(said)
        given_ceilings(ceilings, where == "cuda")  # a bad roof is refused before the user's file is even imported
        console = make_console(stderr=as_json)
        if where != "cuda":
            use_interpreters()  # before the file is imported: its kernels are defined under the interpreters
        from gpuspeed.profiling.script import print_json_alone, stdout_to_stderr

        # the user's prints stay off the JSON; SIGTERM (`timeout`) is one line and 143, not a silent kill
        with stop_signals(), stdout_to_stderr() if as_json else contextlib.nullcontext():
            fn, module, name = load_target(target)
            args, kwargs, notes, host_args = make_args(fn, module, list(inputs), seed=seed, backend=backend, device=where)
            checking = reference_check(module, name, host_args, Path(target.rpartition(":")[0]).name)
            if host_args is None and name.startswith("variants.") and callable(getattr(module, "original", None)):
                notes.append("not checked against original(): the inputs came from --input (the file's inputs(rng) "
                             "would make them for the check)")
            fn, swapped = unwrap_lazy(fn, where)
            notes += swapped
            if where != "cuda":
                console.print("no GPU: the launcher runs under TRITON_INTERPRET=1 / NUMBA_ENABLE_CUDASIM=1, which is "
                              "slow (Numba's simulator can take minutes on large inputs)", highlight=False)
            try:
                rep = kernel_report(fn, *args, flops=flops, bytes=nbytes, name=name, device=where, kwargs=kwargs,
                                    ceilings=ceilings, **checking)
            except UserError:
                raise
            except (Exception, SystemExit) as exc:  # the user's launcher failed: one line, the traceback under --debug
                if ctx.find_root().params.get("debug"):
                    raise
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                # the library was guessed for --input arrays only: int:/float: scalars make none to blame it on
                arrays_given = any(parse_spec(s).kind == "array" for s in inputs)
                hint = launcher_error_hint(fn, host_args, exc, guessed=backend == "auto" and arrays_given,
                                           gpu=where == "cuda",
                                           numbers_given=any(parse_spec(s).kind != "array" for s in inputs))
                raise UserError(f"{name} raised {type(exc).__name__}: {first}{hint}") from exc
        rep.notes[:0] = notes
        if out:
            doc = rep.to_results(params={"target": target, "inputs": list(inputs), "seed": seed, "flops": flops,
                                         "bytes": nbytes, "ceilings": ceilings}, device=where)
            with signals_held():
                path = write_results(doc, out)
            console.print(f"wrote {esc(path)}")
        if as_json:
            from gpuspeed.results import strict_json  # NaN and inf as null: stdout parses as strict JSON

            print_json_alone(strict_json(rep.to_dict()))  # the file's atexit prints go to stderr
        else:
            for line in rep.lines():
                console.print(line, highlight=False, markup=False, soft_wrap=True)
        if rep.check and not rep.check["passed"]:
            raise typer.Exit(1)  # a wrong answer: the report is out, the exit status says so
