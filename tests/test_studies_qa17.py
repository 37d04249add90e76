"""QA round 17: `gpuspeed profile`, `launch`, `roofline` and `doctor` as a demanding user runs them on a CPU-only
machine: scripts a user writes (a multiprocessing pool, ...), function files for `launch --explain`, `roofline --quick`
into folders, and `--json`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from signal_helpers import at_a_terminal

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(q for q in [str(ROOT / "src"), env.get("PYTHONPATH")] if q)
    env.pop("COLUMNS", None)
    return env


def _gpuspeed(args: list[str], cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuspeed", *args], capture_output=True, text=True, env=_env(),
                          cwd=cwd, timeout=timeout)


def _in_process(args: list[str], cwd: Path, capsys) -> subprocess.CompletedProcess:
    """`gpuspeed ARGS` through gpuspeed.cli.main in this process, from `cwd`: for a refusal made before anything runs
    (a process would only import torch again)."""
    from gpuspeed.cli import main

    here = os.getcwd()
    capsys.readouterr()
    os.chdir(cwd)
    try:
        rc = main(args)
    finally:
        os.chdir(here)
    cap = capsys.readouterr()
    return subprocess.CompletedProcess(["gpuspeed", *args], rc, cap.out, cap.err)


def _roofline_in_process(args: list[str], cwd: Path, capfd, monkeypatch) -> subprocess.CompletedProcess:
    """`gpuspeed roofline ARGS` in this process (fd-level capture), where what it says is checked, not what it measures
    (the caller takes the quick_cpu_roofline fixture)."""
    monkeypatch.delenv("COLUMNS", raising=False)  # as _env() leaves it out
    return _in_process(["roofline", *args], cwd, capfd)


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def test_profiling_a_script_whose_pool_is_closed_prints_no_worker_tracebacks(tmp_path):
    # Pool.__exit__ terminates its workers with SIGTERM: forked from gpuspeed, they raised gpuspeed's Terminated
    # (a traceback per worker on stderr, and a run that could hang) where `python pool.py` ends them silently
    script = _write(tmp_path, "pool_qa17.py", """\
        import multiprocessing as mp

        def square(x):
            return x * x

        if __name__ == "__main__":
            with mp.get_context("fork").Pool(2) as pool:
                print(sum(pool.map(square, range(100))))
        """)
    # under load about one run in eight hung here: a worker's SIGTERM met gpuspeed's Python-level handler, which a
    # worker blocking in its queue's semaphore never ran (test_a_forked_child_gets_the_signal_handlers_python_gives_it)
    done = _gpuspeed(["profile", "--no-hotspots", str(script)], cwd=tmp_path, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "Terminated" not in done.stderr, done.stderr[-3000:]
    assert done.stdout.count("328350") == 2


FORKED = r"""
import os, signal, sys
from gpuspeed.results import stop_early, stop_signals

def user_handler(signum, frame):
    pass

stop_early()
with stop_signals():
    for user in (False, True):
        if user:
            signal.signal(signal.SIGTERM, user_handler)
        pid = os.fork()
        if pid == 0:  # the child says what its handlers are, as a Pool worker would have them
            term, intr = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
            term, intr = (getattr(h, "__name__", None) or getattr(h, "name", str(h)) for h in (term, intr))
            os.write(1, f"{user} {term} {intr}\n".encode())
            os._exit(0)
        os.waitpid(pid, 0)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_forked_child_gets_the_signal_handlers_python_gives_it(tmp_path):
    # gpuspeed's SIGTERM handler is Python code: a forked worker that took SIGTERM just before blocking in a
    # semaphore never ran it and never ended (Pool.terminate() waited forever); the kernel's default ends it at once.
    # A handler the user's script set is kept
    # Ctrl-C as a terminal leaves it: a suite started in the background (`make test &`) has SIGINT ignored, which
    # Python and the child keep (SIG_IGN, not default_int_handler)
    done = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True, env=_env(), timeout=120,
                          preexec_fn=at_a_terminal)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["False SIG_DFL default_int_handler",
                                           "True user_handler default_int_handler"], done.stdout


def test_a_script_that_raises_is_one_line_naming_the_line_it_raised_at(tmp_path):
    # the line said only "raises raised ValueError: bad thing": where in the user's code took --debug
    _write(tmp_path, "helper_qa17.py", """\
        def check(n):
            if n > 3:
                raise ValueError("n is too big")
        """)
    script = _write(tmp_path, "raises_qa17.py", """\
        import json
        from helper_qa17 import check

        check(1)
        check(5)
        """)
    done = _gpuspeed(["profile", "--no-hotspots", str(script)], cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("gpuspeed: error:")]
    assert len(lines) == 1, done.stderr
    assert "ValueError: n is too big" in lines[0]
    assert "helper_qa17.py:3" in lines[0], lines[0]


def test_each_run_of_a_script_starts_with_the_environment_it_was_given(tmp_path):
    # `python script.py` starts each time from the caller's environment: a second run saw the first one's changes
    script = _write(tmp_path, "env_qa17.py", """\
        import os

        print("RUNS_SEEN", os.environ.get("RUNS_SEEN_QA17", "none"))
        os.environ["RUNS_SEEN_QA17"] = "one"
        """)
    done = _gpuspeed(["profile", "--no-hotspots", str(script)], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("RUNS_SEEN none") == 2, done.stdout


def test_launch_explain_of_a_function_that_raises_names_the_line(tmp_path):
    target = _write(tmp_path, "fails_qa17.py", """\
        import torch

        def step(x):
            y = x * 2
            return y[10]

        def make_inputs():
            return (torch.ones(4),)
        """)
    done = _gpuspeed(["launch", "--explain", f"{target}:step"], cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("gpuspeed: error:")]
    assert len(lines) == 1 and "IndexError" in lines[0], done.stderr
    assert "(at fails_qa17.py:5 in step)" in lines[0], lines[0]


@pytest.mark.parametrize("inputs, says", [
    (["--input", "x=float32[100,10]"], "no --input for its argument n (--input n=float32[1024] for an array"),
    (["--input", "x=float32[100,10]", "--input", "n=int:5", "--input", "y=int:3"],
     "has no argument y: --input y=int:3 names none of f's arguments (x, n)"),
])
def test_function_inputs_that_do_not_fit_its_arguments_are_a_usage_error(tmp_path, capsys, inputs, says):
    # gpuspeed made the call: 'f raised TypeError: f() missing 1 required positional argument' blamed the function
    target = _write(tmp_path, "fn_qa17.py", """\
        import numpy as np

        def f(x, n):
            return float(x[:n].sum())
        """)
    done = _in_process(["profile", "--no-hotspots", "--function", f"{target}:f", *inputs], tmp_path, capsys)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("gpuspeed: error:")]
    assert len(lines) == 1 and "raised" not in lines[0], done.stderr
    assert says in lines[0], lines[0]


def test_explain_names_a_data_dependent_branch_in_words(tmp_path):
    # dynamo's explain() gives this break the reason 'generic_jump TensorVariable()', which says nothing to a user
    target = _write(tmp_path, "branch_qa17.py", """\
        import torch

        def step(x):
            if x.sum() > 0:
                return x * 2
            return x - 1

        def make_inputs():
            return (torch.ones(8),)
        """)
    done = _gpuspeed(["launch", "--explain", f"{target}:step", "--json"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert doc["break_count"] == 1, doc
    reason = doc["breaks"][0]["reason"]
    assert doc["breaks"][0]["line"] == 4
    assert reason.startswith("data-dependent branching: an if or while on a tensor's value"), reason


def test_cpu_roofline_says_on_the_console_which_ceilings_the_cpu_cannot_have(tmp_path, capfd, monkeypatch, quick_cpu_roofline):
    # the console showed '-' for l2, FP32 FMA, TF32, FP16 and FP8 with no word why (the notes were in the JSON only)
    done = _roofline_in_process(["--quick", "--no-place", "--device", "cpu"], tmp_path, capfd, monkeypatch)
    assert done.returncode == 0, done.stderr[-3000:]
    said = " ".join(done.stdout.split())
    assert "no AI sweep (Triton kernels need a GPU)" in said, done.stdout[-3000:]
    assert "no L2, FP32 FMA, TF32, FP16 or FP8 ceilings" in said, done.stdout[-3000:]


def test_a_placement_whose_timing_bench_called_unreliable_is_marked_so_beside_its_percent():
    # on a shared CPU a matmul placement read 1.3 % of roof from samples bench() flagged 'unreliable' (two modes);
    # the table and roofline.md printed the 1.3 as plainly as a clean point
    from gpuspeed.roofline.report import markdown, pct_text

    doc = json.loads((ROOT / "results" / "cpu" / "roofline.json").read_text())
    placed = [r for r in doc["rows"] if r.get("section") == "placement" and r.get("pct_of_roof") is not None]
    clean, noisy = placed[0], placed[1]
    clean["notes"] = [n for n in clean.get("notes", []) if not n.startswith("unreliable")]
    noisy["notes"] = list(noisy.get("notes", [])) + [
        "unreliable: IQR/median is 26% beside a median error of ±1.60%: the samples spread over more than one level"]
    assert "unreliable" not in pct_text(clean, cpu=True)
    assert pct_text(noisy, cpu=True).endswith("(unreliable: noisy samples)")
    row = next(ln for ln in markdown(doc).splitlines() if ln.startswith(f"| {noisy['name']} |"))
    assert "(unreliable: noisy samples)" in row


def test_launch_explain_whose_make_inputs_raises_names_the_line(tmp_path):
    target = _write(tmp_path, "inputs_fail_qa17.py", """\
        import torch

        def step(x):
            return x * 2

        def make_inputs():
            return (torch.ones(4).view(3),)
        """)
    done = _gpuspeed(["launch", "--explain", f"{target}:step"], cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("gpuspeed: error:")]
    assert len(lines) == 1 and lines[0].startswith("gpuspeed: error: make_inputs() raised RuntimeError"), done.stderr
    assert lines[0].endswith("(at inputs_fail_qa17.py:7 in make_inputs)"), lines[0]


def test_roofline_into_a_folder_holding_another_devices_roofline_says_it_replaces_it(tmp_path, capfd, monkeypatch,
                                                                                       quick_cpu_roofline):
    # `gpuspeed roofline --out results/nvidia-h200` run on the CPU replaced the H200's measured file without a word
    out = tmp_path / "nvidia-h200"
    out.mkdir()
    (out / "roofline.json").write_text((ROOT / "results" / "nvidia-h200" / "roofline.json").read_text())
    done = _roofline_in_process(["--quick", "--no-place", "--device", "cpu", "--json", "--out", str(out)], tmp_path,
                                capfd, monkeypatch)
    assert done.returncode == 0, done.stderr[-3000:]
    json.loads(done.stdout)  # the note goes to stderr: stdout is the JSON alone
    said = " ".join(done.stderr.split())
    # rich folds a long tmp path where it likes: the words after it are what this checks
    assert "holds a roofline measured on NVIDIA H200: this run on" in said, said[-2000:]
    assert "roofline.json" in said.split("holds a roofline measured on")[0].replace(" ", "")[-40:]
    first = said.index("holds a roofline measured on")
    step = re.search(r"(?<![\w/])1/\d+", said)  # the progress's first step, not a '1/' inside a tmp path (gw1/)
    assert step and first < step.start(), "said before the measuring starts"


def test_a_positional_only_argument_is_named_as_such_not_as_missing(tmp_path, capsys):
    target = _write(tmp_path, "posonly_qa17.py", """\
        def f(x, /, n=2):
            return x * n
        """)
    done = _in_process(["profile", "--no-hotspots", "--function", f"{target}:f", "--input", "x=float32[8]"],
                       tmp_path, capsys)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("gpuspeed: error:")]
    assert len(lines) == 1 and "f takes x by position only" in lines[0], done.stderr
