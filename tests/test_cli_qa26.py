"""QA round 26, the CLI as a whole: what happens around a command, as a demanding user meets it on a CPU machine.

- stdout on a full disk (`gpuspeed doctor --json > /dev/full`, `> results.json` with the disk full) ended in a
  30-line OSError traceback, or in "Exception ignored ... OSError" and exit 120 where the text was still buffered;
- a reader that has gone (`gpuspeed --version | head -0`) gave "Exception ignored ... BrokenPipeError" and exit 120
  where the output was still buffered as Python exited;
- `gpuspeed.cli.main([...])` from a script or notebook raised SystemExit(130) where a Ctrl-C had kept a command's
  results, instead of returning 130 as it does for any other Ctrl-C (a SIGTERM still ends the caller: 143);
- on a terminal that is not interactive (TERM=dumb: Emacs' shell, a CI runner's pty; TTY_INTERACTIVE=0) rich draws
  no progress bar, and no step line was printed either: a run of minutes was silent;
- a MemoryError (host out of memory) ended in a traceback, not one line and exit 2;
- an EOFError raised inside a command (a truncated pickle, input() at the end of stdin) was reported as
  "gpuspeed: interrupted" and exit 130, as if the user had pressed Ctrl-C;
- `gpuspeed --help` broke a command's summary in the middle of its line where its docstring wraps.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from gpuspeed.cli import main
from gpuspeed.commands import progress_bar

SRC = Path(__file__).resolve().parents[1] / "src"


def _env(buffered: bool = True) -> dict:
    """The environment of `python -m gpuspeed` as a user's shell gives it: stdout buffered unless asked otherwise."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(q for q in [str(SRC), os.environ.get("PYTHONPATH")] if q))
    env.pop("PYTHONUNBUFFERED", None)
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    return env


def _gpuspeed(args: list[str], stdout, buffered: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuspeed", *args], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, env=_env(buffered), timeout=180)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux), a device that is always full")
@pytest.mark.parametrize("buffered", [True, False])
@pytest.mark.parametrize("args", [["--version"], ["doctor", "--json"], ["doctor"]])
def test_stdout_on_a_full_disk_is_one_line_and_exit_2(args, buffered):
    with open("/dev/full", "w") as full:
        r = _gpuspeed(args, full, buffered)
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("gpuspeed: error: ") and "No space left" in lines[0], lines


@pytest.mark.parametrize("args", [["--version"], ["doctor"], ["doctor", "--json"]])
def test_a_reader_that_has_gone_ends_the_run_quietly(args):
    # `gpuspeed --version | head -0`: the pipe's reader is gone before gpuspeed writes
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = _gpuspeed(args, write_end)
    finally:
        os.close(write_end)
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])  # as typer's own closed-pipe exit: nothing more said
    assert r.stderr.strip() == "", r.stderr


def test_a_sigterm_ends_a_python_caller_too(monkeypatch, capsys, tmp_path):
    import gpuspeed.demo

    def terminated(**_kw):
        os.kill(os.getpid(), signal.SIGTERM)  # `timeout` or a scheduler, while the command measures
        raise AssertionError("SIGTERM did not stop the command")

    monkeypatch.setattr(gpuspeed.demo, "run_demo", terminated)
    with pytest.raises(SystemExit) as stop:  # not a return: the process was told to end (Jupyter's kernel shutdown)
        main(["bench", "--device", "cpu", "--out", str(tmp_path / "res")])
    assert stop.value.code == 143
    assert capsys.readouterr().err.strip() == "gpuspeed: stopped by SIGTERM"
    assert not (tmp_path / "res").exists()  # its empty --out taken back


def test_main_returns_130_for_a_ctrl_c_that_kept_the_results(monkeypatch, capsys, tmp_path):
    import gpuspeed.optimize.pipeline

    def interrupted(workload, *, out=None, **_kw):
        Path(out, "run.json").write_text("{}")  # a run that has started: its candidates are kept for --resume
        raise KeyboardInterrupt

    monkeypatch.setattr(gpuspeed.optimize.pipeline, "optimize", interrupted)
    assert main(["optimize", "black_scholes", "--out", str(tmp_path / "res")]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("gpuspeed: interrupted: the candidates measured are kept"), err


@pytest.mark.parametrize("env", [{"TERM": "dumb"}, {"TERM": "xterm", "TTY_INTERACTIVE": "0"}])
def test_a_dumb_terminal_gets_the_plain_step_lines(monkeypatch, capsys, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    console = Console(file=io.StringIO(), force_terminal=True)  # a pty, where rich draws no bar
    with progress_bar(console=console, name="gpuspeed study") as bar:
        task = bar.add_task("study", total=2)
        bar.update(task, description="first")
        bar.update(task, advance=1, description="second")
        bar.update(task, completed=2, description="done")
    err = capsys.readouterr().err.splitlines()
    assert [ln.split("] ", 1)[1].split(":")[0] for ln in err] == ["1/2 first", "2/2 second"], err


def test_a_terminal_that_is_not_dumb_keeps_its_bar(monkeypatch, capsys):
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("TTY_INTERACTIVE", raising=False)
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    with progress_bar(console=console, name="gpuspeed study") as bar:
        task = bar.add_task("study", total=1)
        bar.update(task, advance=1, description="only")
    assert capsys.readouterr().err == ""


def _out_of_host_memory():
    import numpy as np

    return np.empty(2**62, dtype=np.uint8)  # NumPy's own MemoryError: 4 EiB cannot be allocated


def test_out_of_memory_is_one_line_and_exit_2(monkeypatch, capsys):
    import gpuspeed.doctor

    monkeypatch.setattr(gpuspeed.doctor, "report", _out_of_host_memory)
    assert main(["doctor"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpuspeed: error: out of memory: ") and "--debug" in err[0], err


def test_out_of_memory_under_debug_keeps_its_traceback(monkeypatch):
    import gpuspeed.doctor

    monkeypatch.setattr(gpuspeed.doctor, "report", _out_of_host_memory)
    with pytest.raises(MemoryError):
        main(["--debug", "doctor"])


def test_an_eoferror_in_a_command_is_not_taken_for_ctrl_c(monkeypatch, capsys):
    import pickle

    import gpuspeed.doctor

    monkeypatch.setattr(gpuspeed.doctor, "report", lambda: pickle.loads(b""))  # a truncated file's EOFError
    with pytest.raises(EOFError):  # an error that is not ours, with its traceback, as any other
        main(["doctor"])
    assert "interrupted" not in capsys.readouterr().err


def test_the_command_list_gives_each_summary_unbroken(monkeypatch, capsys):
    import inspect

    from gpuspeed.cli import app

    monkeypatch.setenv("COLUMNS", "400")  # wide enough for each summary's first 150 characters on one line
    monkeypatch.setenv("TERMINAL_WIDTH", "400")
    assert main(["--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for info in app.registered_commands:
        name = info.name or info.callback.__name__
        summary = " ".join((info.help or inspect.getdoc(info.callback)).split("\n\n")[0].split())
        row = next(ln for ln in lines if ln.startswith(f"│ {name} "))
        assert summary[:150] in row, (name, row)


def test_main_takes_a_command_line_as_one_string(capsys):
    # main("doctor --json") from a notebook was taken letter by letter: "No such command 'd'"
    assert main("--version") == 0 and capsys.readouterr().out.startswith("gpuspeed ")
    assert main("profile 'no such script.py'") == 2  # split as the shell splits it
    assert capsys.readouterr().err.strip() == "gpuspeed: error: no such file: no such script.py"


def test_python_dash_m_gpuspeed_cli_runs_the_command_line(tmp_path):
    # `python -m gpuspeed.cli doctor` printed nothing and exited 0: the module defined main() and never called it
    r = subprocess.run([sys.executable, "-m", "gpuspeed.cli", "--version"], capture_output=True, text=True,
                       env=_env(), cwd=tmp_path, timeout=180)
    assert r.returncode == 0 and r.stdout.startswith("gpuspeed "), (r.returncode, r.stdout, r.stderr[-2000:])
    r = subprocess.run([sys.executable, "-m", "gpuspeed.cli", "nope"], capture_output=True, text=True,
                       env=_env(), cwd=tmp_path, timeout=180)
    assert r.returncode == 2 and r.stderr.strip() == "gpuspeed: error: No such command 'nope'.", r.stderr[-2000:]
