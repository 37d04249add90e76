"""`gpuspeed roofline`: measure this device's ceilings, the AI sweep and the built-in placements."""

from __future__ import annotations


import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def roofline(
        quick: bool = typer.Option(False, "--quick", help="Smaller sizes, shorter timing (< 1 min on a CPU)."),
        dtype: list[str] = typer.Option(None, "--dtype", help="Only these dtypes in sweep and placements: "
                                                               "fp32, tf32, bf16 (repeat or comma-separate)."),
        device: str = typer.Option("auto", "--device", help="cpu, cuda or auto."),
        out: str = typer.Option(None, "--out", help="Write roofline.json, roofline.md, roofline.png/.svg here."),
        as_json: bool = typer.Option(False, "--json", help="Print the results document as JSON."),
        no_sweep: bool = typer.Option(False, "--no-sweep", help="Skip the arithmetic-intensity sweep."),
        no_place: bool = typer.Option(False, "--no-place", help="Skip the built-in placements."),
    ):
        """Measured roofline: memory and compute ceilings, the AI sweep, built-in workloads placed on it."""
        from gpuspeed.commands import cpu_line, esc, make_console, progress_bar
        from rich.table import Table

        from gpuspeed.results import check_out_dir, signals_held
        from gpuspeed.roofline.report import pct_text
        from gpuspeed.roofline.study import Study, run_steps, write_artifacts

        out = check_out_dir(out)  # a bad --out fails now, not after minutes of measuring
        console = make_console(stderr=as_json)
        study = Study(device=device, quick=quick, dtypes=dtype or None, sweep=not no_sweep, workloads=not no_place)
        if study.kind == "cpu":
            console.print(f"[yellow]{esc(cpu_line())}: measuring the CPU roofline (copy bandwidth, torch.mm per dtype).[/]")
        from gpuspeed.results import replaces_other_device

        if (replacing := replaces_other_device(out, study.info, "roofline", "a roofline")) is not None:
            console.print(f"[yellow]note:[/] {esc(replacing)}")
        steps = study.steps()
        with progress_bar(40, console=console, name="gpuspeed roofline") as bar:
            task = bar.add_task("roofline", total=len(steps))

            def step(label, done):
                bar.update(task, description=label, completed=done)

            doc = run_steps(study, steps, out=out, step=step)  # stopped part-way: the steps done are kept in --out
            bar.update(task, completed=len(steps))
        if out:
            with signals_held():  # a Ctrl-C now waits until every file is whole
                paths = write_artifacts(doc, out)
            console.print("wrote " + ", ".join(esc(p) for p in paths))
            for note in (n for n in doc["notes"] if n.startswith("plot failed:")):  # the numbers are written all the same
                console.print(f"[yellow]{esc(note)}[/]", markup=True)
        if as_json:
            from gpuspeed.results import strict_json  # NaN and inf as null: stdout parses as strict JSON

            print(strict_json(doc))
            return
        gpu = study.kind == "cuda"
        t = Table(title=f"Ceilings: {esc(doc['device']['name'])}")
        for col in ("ceiling", "value", "% datasheet", "how"):
            t.add_column(col)
        for c in study.ceil.rows:
            if c.error:
                t.add_row(esc(c.name), "[red]error[/]", "", esc(c.error[:80]))
            else:
                v = c.value if c.kind == "memory" or gpu else c.value * 1e3
                unit = c.unit if c.kind == "memory" or gpu else "GFLOP/s"
                pct = f"{c.pct_of_datasheet:.1f}" if c.pct_of_datasheet is not None else "-"
                t.add_row(esc(c.name), f"{v:,.1f} {esc(unit)}", pct, esc(c.how))
        console.print(t)
        p = Table(title="Placements")
        for col in ("workload", "FLOP/B", "achieved", "GB/s", "% of roof", "bound"):
            p.add_column(col)
        for r in study.placements:
            if "error" in r:
                p.add_row(esc(r["name"]), "[red]error[/]", esc(r["error"][:60]), "", "", "")
                continue
            ach = f"{r['TFLOPs']:,.3g} TFLOP/s" if gpu else f"{r['TFLOPs'] * 1e3:,.3g} GFLOP/s"
            pct = pct_text(r, cpu=not gpu)
            p.add_row(esc(r["name"]), f"{r['ai']:.3g}", ach, f"{r['GBps']:,.4g}", esc(pct), esc(r.get("bound")))
        if study.placements:
            console.print(p)
        s = Table(title="Summary")
        s.add_column("key")
        s.add_column("value")
        for k, v in doc["summary"].items():
            s.add_row(esc(k), "-" if v is None else f"{v:,.4g}" if isinstance(v, float) else esc(v))
        console.print(s)
        for note in doc["notes"]:  # what was not measured here, and why, as the JSON and Markdown say it
            if not (out and note.startswith("plot failed:")):  # said above, beside the files
                console.print(esc(note), markup=True)
