"""`gpuspeed launch`: the launch-overhead sweep and fusion study, or `--explain file.py:fn` (graph breaks)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

import typer


def _ints(text: str | None, what: str) -> list[float] | None:
    """The comma-separated numbers of --ks / --ns (study.check_params refuses fractions and repeats)."""
    from gpuspeed.errors import UserError

    if text is None:
        return None
    words = [t.strip() for t in text.split(",") if t.strip()]
    if not words:  # '' or ',' would silently mean the defaults
        raise UserError(f"--{what} {text!r} names no value: give comma-separated numbers like 1,8,64")
    try:
        values = [float(t) for t in words]
    except ValueError:  # 'abc'
        raise UserError(f"--{what} takes comma-separated numbers like 1,8,64 or 1e3,1e6, got {text!r}") from None
    return [int(v) if v.is_integer() else v for v in values]  # 4 prints as 4 in the errors, not 4.0


def _explain_target(target: str, inputs: str | None = None):
    """graph_breaks.explain() on 'file.py:function', with inputs from --inputs or the file's make_inputs().
    The file is imported once: make_inputs() may set globals the function reads."""
    import inspect

    from gpuspeed.errors import UserError
    from gpuspeed.graph_breaks import explain
    from gpuspeed.loading import _first_line, attribute, load_module, split_target
    from gpuspeed.trees import lazy_kind

    path, attr = split_target(target)
    mod = load_module(path)
    fn = attribute(mod, path, attr)  # refuses a method read from its class
    if (what := lazy_kind(fn)) is not None:
        raise UserError(f"{target} is {what}: a call runs none of its body, so there is nothing to compile; "
                        "name a plain function")
    if inputs:
        in_path, in_attr = split_target(inputs)
        same = Path(in_path).resolve() == Path(path).resolve()
        make = attribute(mod if same else load_module(in_path), in_path, in_attr)
    else:
        make = getattr(mod, "make_inputs", None)
    if make is not None:
        try:
            args = make()
        except (Exception, SystemExit) as exc:  # the user's inputs function failed: one line (--debug: traceback)
            from gpuspeed.profiling.script import raised_at

            at = raised_at(exc) if not isinstance(exc, SystemExit) else None
            raise UserError(f"{getattr(make, '__name__', 'make_inputs')}() raised {_first_line(exc)}"
                            + (f" (at {at})" if at else "")) from exc
        made = (None if isinstance(args, tuple) else
                f"{getattr(make, '__name__', 'make_inputs')}() returned a {type(args).__name__}")
        args = args if isinstance(args, tuple) else (args,)
    else:
        made = None
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if params:
            raise UserError(f"{target} needs arguments: define make_inputs() in its file or pass --inputs "
                            f"file.py:make_inputs")
        args = ()
    try:
        return explain(fn, *args)
    except UserError:
        raise
    except (Exception, SystemExit) as exc:  # the user's function failed on these inputs: one line (--debug: traceback)
        from gpuspeed.profiling.script import raised_at

        at = raised_at(exc) if not isinstance(exc, SystemExit) else None
        # a list of the arguments is one argument, as verify's make_inputs convention has it: say so where it shows
        hint = (f"; {made}, passed as the one argument: return a tuple to pass several"
                if made and isinstance(exc, TypeError) and "argument" in str(exc) else "")
        raise UserError(f"{target} raised {_first_line(exc)}" + (f" (at {at})" if at else "") + hint) from exc


def register(app: typer.Typer) -> None:
    @app.command()
    def launch(
        device: str = typer.Option("auto", help="cpu, cuda or auto."),
        ks: str = typer.Option(None, "--ks", help="K values of the sweep (default 1..4096 on a GPU, 1..256 on CPU)."),
        ns: str = typer.Option(None, "--ns", help="N values of the fusion study (default 1e3..1e8 GPU, ..1e6 CPU)."),
        chain_k: int = typer.Option(8, "--chain-k", help="Elementwise ops in the fusion chain."),
        tiny_k: int = typer.Option(1000, "--tiny-k", help="Ops in the tiny chain replayed as one graph."),
        variants: str = typer.Option(None, help="Fusion variants, comma-separated: eager, compiled, "
                                               "reduce-overhead, captured, captured-compiled (default all)."),
        budget: float = typer.Option(None, help="Seconds per measurement (default 0.5 GPU, 0.2 CPU)."),
        explain: str = typer.Option(None, "--explain", help="Find graph breaks in path/to/file.py:function "
                                                           "instead of running the study."),
        inputs: str = typer.Option(None, "--inputs", help="With --explain: file.py:make_inputs giving the "
                                                         "example arguments (default: make_inputs in the file)."),
        out: Optional[str] = typer.Option(None, "--out", metavar="<path>",
                                         help="Write launch.json, launch.md and launch.png into this folder "
                                            "(with --explain: explain.json)."),
        as_json: bool = typer.Option(False, "--json", help="Print machine-readable output."),
    ):
        """Launch overhead per kernel (eager vs CUDA graph), torch.compile fusion vs launch cost, graph breaks."""
        from gpuspeed.commands import cpu_line, esc, make_console, progress_bar
        from rich.table import Table

        from gpuspeed import launch as study
        from gpuspeed.errors import UserError
        from gpuspeed.launch.fusion import format_n
        from gpuspeed.launch.report import fmt
        from gpuspeed.results import check_out_dir, signals_held, stop_signals

        out = check_out_dir(out)  # a bad --out fails now, not after the whole study
        console = make_console()
        if explain:
            study_flags = {"--device": device != "auto", "--ks": ks is not None, "--ns": ns is not None,
                           "--chain-k": chain_k != 8, "--tiny-k": tiny_k != study.CHAIN_TINY,
                           "--variants": variants is not None, "--budget": budget is not None}
            given = [flag for flag, used in study_flags.items() if used]
            if given:
                raise UserError(f"{given[0]} goes with the launch study, not --explain (the function runs where "
                                "its inputs are)")
            from gpuspeed.profiling.script import print_json_alone, stdout_to_stderr

            with stdout_to_stderr() if as_json else contextlib.nullcontext():  # the user's prints stay off the JSON
                exp = _explain_target(explain, inputs)
            doc = exp.to_dict()
            from gpuspeed.results import strict_json  # NaN and inf as null: stdout parses as strict JSON

            if out:
                from gpuspeed.results import write_text_atomic

                path = write_text_atomic(out / "explain.json", strict_json(doc) + "\n")
            if as_json:
                print_json_alone(strict_json(doc))  # the file's atexit prints go to stderr
            else:
                for line in exp.lines():
                    console.print(line, highlight=False, markup=False)
                if out:
                    console.print(f"wrote {esc(path)}")
            return
        if inputs:
            raise UserError("--inputs goes with --explain")
        from gpuspeed.device import resolve_device

        where = resolve_device(device)
        k_list, n_list = _ints(ks, "ks"), _ints(ns, "ns")
        v_list = [v.strip() for v in variants.split(",") if v.strip()] if variants is not None else None
        if v_list == []:  # '' or ',' would silently mean all of them
            raise UserError(f"--variants {variants!r} names no variant: choose from {', '.join(study.VARIANTS)}")
        k_list, n_list = study.check_params(k_list, n_list, chain_k, tiny_k, budget, v_list)
        study.check_fits(max(n_list or (study.GPU_NS if where == "cuda" else study.CPU_NS)), where)
        if where != "cuda" and not as_json:
            console.print(f"[yellow]{esc(cpu_line())}[/]: running on the CPU at small sizes; launch numbers are "
                          "dispatcher costs and the graph variants run eagerly.")
        from gpuspeed.device import get_device
        from gpuspeed.results import replaces_other_device

        replacing = replaces_other_device(out, get_device(where), "launch", "a launch study")
        if replacing is not None:  # said before anything is measured
            make_console(stderr=as_json).print(f"[yellow]note:[/] {esc(replacing)}")  # --json: stdout stays JSON
        total = study.count_steps(k_list or (study.GPU_KS if where == "cuda" else study.CPU_KS),
                                  n_list or (study.GPU_NS if where == "cuda" else study.CPU_NS),
                                  v_list or study.VARIANTS, where)
        with progress_bar(34, transient=as_json, name="gpuspeed launch") as bar:
            task = bar.add_task("launch", total=total)

            def progress(what: str) -> None:
                bar.update(task, advance=1, description=what)

            with stop_signals():  # SIGTERM: one line and 143; with --out the rows measured are kept there
                doc = study.run_launch(device=device, ks=k_list, ns=n_list, chain_k=chain_k, tiny_k=tiny_k,
                                       variants=v_list, budget_s=budget, progress=progress, out=out)
            bar.update(task, completed=total, description="done")
        with signals_held():  # a Ctrl-C now waits until every file is whole
            paths = study.write_artifacts(doc, out) if out else []
        if as_json:
            from gpuspeed.results import strict_json  # NaN and inf as null, as launch.json has them

            print(strict_json(doc))
            return
        s = doc["summary"]
        t = Table(title=f"launch overhead on {esc(doc['device'].get('name', '?'))}")
        for col in ("summary", "value", "target"):
            t.add_column(col, justify="left" if col == "summary" else "right")
        for key, val in s.items():
            if key.endswith("_target_met"):
                continue
            target = doc["params"]["targets"].get(key, "")
            met = s.get(f"{key}_target_met")
            style = None if met is None else ("green" if met else "red")
            t.add_row(esc(key), esc(fmt(val)), esc(target), style=style)
        console.print(t)
        f = Table(title=f"fusion: {doc['params']['chain_k']} ops over N fp32")
        for col in ("N", "variant", "time", "GB/s", "% copy roof", "x copy", "check", "reliable"):
            f.add_column(col, justify="right")
        for r in doc["rows"]:
            if r["study"] != "fusion":
                continue
            if "error" in r:
                f.add_row(format_n(r['N']), esc(r["variant"]), "[red]error[/]", esc(r["error"][:40]), "", "", "", "")
                continue
            f.add_row(format_n(r['N']), esc(r["variant"]), f"{r['median_us']:.1f} us", fmt(r.get("GBps"), ",.4g"),
                      fmt(r.get("pct_copy_roof"), ".1f"), fmt(r.get("over_copy"), ".2f"),
                      fmt(r.get("check_passed")), "[yellow]no[/]" if r.get("unreliable") else "yes")
        console.print(f)
        for note in doc["notes"]:
            console.print(f"[dim]{esc(note)}[/]")
        for p in paths:
            console.print(f"wrote {esc(p)}")
