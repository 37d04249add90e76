"""`gpuspeed bench`: the timing demo on the bundled example (softmax, NumPy vs torch)."""

from __future__ import annotations

from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def bench(
        device: str = typer.Option("auto", help="cpu, cuda or auto."),
        rows: int = typer.Option(0, help="Rows of the input (0: 8192 on a GPU, 1024 on the CPU)."),
        cols: int = typer.Option(0, help="Columns of the input (0: 8192 on a GPU, 2048 on the CPU)."),
        budget: float = typer.Option(2.0, help="Seconds each measurement may take at most."),
        out: Optional[str] = typer.Option(None, "--out", metavar="<path>", help="Write bench_demo.json into this folder."),
        as_json: bool = typer.Option(False, "--json", help="Print the results document as JSON."),
    ):
        """Time a NumPy row softmax and its torch version: bench(), check() and compare() at work."""
        from gpuspeed.commands import esc, make_console
        from rich.table import Table

        from gpuspeed.demo import run_demo
        from gpuspeed.errors import UserError
        from gpuspeed.results import check_out_dir, signals_held, stop_signals, write_results
        from gpuspeed.stats import flags
        from gpuspeed.timing import format_speedup, format_time

        out = check_out_dir(out)  # a bad --out fails now, before the measuring
        if (rows > 0) != (cols > 0) or rows < 0 or cols < 0:
            raise UserError("--rows and --cols go together and must be positive")
        if not 0 < budget < float("inf"):  # NaN too
            raise UserError(f"--budget is seconds per measurement and must be positive and finite, got {budget:g}")
        with stop_signals():  # SIGTERM (`timeout`): one line and 143, not a silent kill leaving an empty --out
            doc = run_demo(device=device, shape=(rows, cols) if rows else None, budget_s=budget)
        with signals_held():
            path = write_results(doc, out) if out else None
        if as_json:
            from gpuspeed.results import strict_json  # NaN and inf as null: stdout parses as strict JSON

            print(strict_json(doc))
            return
        console = make_console()
        t = Table(title=f"softmax {tuple(doc['params']['shape'])} fp32 on {esc(doc['device']['name'])}")
        for col in ("version", "median", "noise", "IQR/median", "n", "mode", "GB/s"):
            t.add_column(col, justify="left" if col == "version" else "right")
        for r in doc["rows"]:
            t.add_row(esc(r["name"]), format_time(r["median_s"]), f"±{100 * r['rel_noise']:.2f}%",
                      f"{100 * r['rel_iqr']:.1f}%", str(r["n"]), r["mode"] + flags(r), f"{r['GBps']:.3g}",
                      style="yellow" if r.get("unreliable") else None)
        console.print(t)
        s = doc["summary"]
        console.print(f"speedup {esc(format_speedup(s['speedup'], s['speedup_ci_low'], s['speedup_ci_high']))} "
                      f"({esc(s['verdict'])}); check {'PASS' if s['check_passed'] else 'FAIL'}, "
                      f"rel L2 error {s['rel_l2_err']:.2e}"
                      + ("; [yellow]a timing is unreliable (see the notes): rerun with a larger --budget[/]"
                         if s.get("unreliable") else ""))
        for note in doc["notes"]:
            console.print(f"[dim]{esc(note)}[/]")
        if path:
            console.print(f"wrote {esc(path)}")
