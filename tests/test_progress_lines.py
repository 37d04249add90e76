"""The commands' progress off a terminal (a log, a pipe, CI): rich's bar is hidden there, so each step is said in a
plain line on stderr (commands.progress_bar / StepLines). `gpuspeed optimize`, `roofline` and `launch` printed
nothing for their minutes when piped; decode had its own lines (test_decode_qa13)."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

from gpuspeed.cli import main
from gpuspeed.commands import progress_bar

LINE = re.compile(r"^gpuspeed (\w+) \[ *\d+ s\] (\d+)/(\d+) (.+): (\d+\.\d) s(; now (.+))?$")


def _steps(err: str, command: str) -> list[tuple]:
    """(done, total, step, next) of each progress line of `command` in stderr."""
    out = []
    for line in err.splitlines():
        m = LINE.match(line)
        if m and m.group(1) == command:
            out.append((int(m.group(2)), int(m.group(3)), m.group(4), m.group(7)))
    return out


def test_a_hidden_bar_says_each_step_once_and_its_total(capsys):
    console = Console(file=io.StringIO())  # not a terminal
    with progress_bar(console=console, name="gpuspeed study") as bar:
        task = bar.add_task("study", total=2)
        bar.update(task, description="first")
        bar.update(task, advance=1, description="first")  # said again: the same step
        bar.update(task, advance=1, description="second", total=3)
        bar.update(task, advance=1, description="third")
        bar.update(task, completed=3, description="done")
    assert console.file.getvalue().strip() == ""  # no bar, no blank line where it stood
    assert _steps(capsys.readouterr().err, "study") == [(1, 3, "first", "second"), (2, 3, "second", "third"),
                                                        (3, 3, "third", None)]


def test_a_step_that_stops_the_run_prints_no_line_of_its_own(capsys):
    console = Console(file=io.StringIO())
    with pytest.raises(ValueError), progress_bar(console=console, name="gpuspeed study") as bar:
        task = bar.add_task("study", total=2)
        bar.update(task, description="loading")
        bar.update(task, advance=1, description="measuring")
        raise ValueError("the run stops here")
    assert _steps(capsys.readouterr().err, "study") == [(1, 2, "loading", "measuring")]  # not "measuring: ..."


def test_on_a_terminal_the_bar_shows_and_no_line_is_printed(capsys):
    console = Console(file=io.StringIO(), force_terminal=True, force_interactive=True, width=100)
    with progress_bar(console=console, name="gpuspeed study") as bar:
        task = bar.add_task("study", total=1)
        bar.update(task, advance=1, description="only")
    assert _steps(capsys.readouterr().err, "study") == []


def test_optimize_in_a_pipe_says_its_steps_on_stderr_and_json_stays_on_stdout(tmp_path, capsys):
    p = tmp_path / "wl.py"
    p.write_text("import numpy as np\n\ndef original(x):\n    return np.sin(x) * 2.0 + x\n\n\n"
                 "def inputs(rng):\n    return (rng.standard_normal(1000),)\n")
    rc = main(["optimize", str(p), "--device", "cpu", "--backends", "numpy", "--out", str(tmp_path / "o"), "--json",
               "--bench-budget", "0.05"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert json.loads(cap.out)["summary"]  # stdout is the JSON alone
    steps = _steps(cap.err, "optimize")
    assert len(steps) >= 2 and steps[-1][3] is None, cap.err  # the last step's end is said too
    assert any("original" in s[2] for s in steps), steps  # the candidates by name
