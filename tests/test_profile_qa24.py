"""QA round 24 of `gpuspeed profile` (CPU paths, CLI): what the report says must match what the profiled code does."""

import json
import textwrap
import threading
import time

import numpy as np
import pytest
import torch

from gpuspeed.cli import main
from gpuspeed.profiling import profile


def _script(tmp_path, text, name="main.py"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def _syncs_in_threads(n_threads):
    def work():
        x = torch.randn(16)
        for _ in range(3):
            x.sum().item()

    threads = [threading.Thread(target=work) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_syncs_in_threads_the_trace_cannot_see_are_said_to_be_missing():
    # torch.profiler records the ops of the thread that started it only: 6 .item() calls in two threads came out as
    # "0 host syncs" with no word, and with hotspots off nothing at all said threads ran
    res = profile(_syncs_in_threads, 2, steps=1, warmup=0, device="cpu", hotspots=False)
    assert res.findings["host_syncs"]["total"] == 0  # what torch's trace holds; if this changes, count them instead
    assert any("2 thread(s)" in n and "torch.profiler" in n for n in res.notes), res.notes


def test_no_thread_note_without_threads():
    res = profile(lambda: torch.randn(8).sum().item(), steps=1, warmup=0, device="cpu", hotspots=False)
    assert not any("thread(s)" in n for n in res.notes), res.notes


def test_piped_stdin_is_not_counted_as_a_thread_of_the_script(tmp_path):
    # gpuspeed's own stdin pump (a thread it starts in the first run, where stdin is a pipe) is not the script's
    import subprocess
    import sys

    script = _script(tmp_path, "import sys\nline = sys.stdin.readline()\n")
    proc = subprocess.run([sys.executable, "-m", "gpuspeed", "profile", "--device", "cpu", "--json", str(script)],
                          input="hello\n", capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    notes = json.loads(proc.stdout)["notes"]
    assert not any("thread(s)" in n for n in notes), notes


def _pure_python_work():
    s = 0
    for i in range(200_000):
        s += i * i
    return s


def _calls_only():
    # no array in sight: its slow lines are calls of other functions, whose time cProfile books to them
    _pure_python_work()
    time.sleep(0.03)


def _array_operators(x):
    for _ in range(20):
        x = x * 0.5 + 1.0  # NumPy operators: no Python call, so cProfile books their time to this function
    return x


def _row(res, name):
    return next(r for r in res.hotspots["cprofile"]["top"] if r["name"] == name)


def test_a_function_that_only_calls_others_is_not_called_array_operators():
    res = profile(_calls_only, steps=1, warmup=0, device="cpu", hotspots=True, line_backend="settrace")
    assert _row(res, "_calls_only")["category"] == "interpreter", _row(res, "_calls_only")
    assert _row(res, "_pure_python_work")["category"] == "interpreter"


def test_numpy_operators_are_still_booked_to_the_library():
    res = profile(_array_operators, np.ones(2_000_000), steps=1, warmup=0, device="cpu", hotspots=True,
                  line_backend="settrace")
    assert _row(res, "_array_operators")["category"] == "library (array operators)"
    assert res.hotspots["cprofile"]["verdict"].startswith("library-bound")


def test_the_report_shows_the_lines_of_the_function_that_does_the_work(tmp_path, capsys):
    # the two functions whose lines were shown were the two longest in all, calls included: a script's module code and
    # its main(), each one line `main()` / `costly()` at ~100%; the loop that took the time was never shown
    script = _script(tmp_path, """\
        def costly():
            s = 0
            for i in range(300000):
                s += i * i
            return s

        def main():
            costly()

        if __name__ == "__main__":
            main()
        """)
    assert main(["profile", "--device", "cpu", "--out", str(tmp_path / "out"), str(script)]) == 0
    out = capsys.readouterr().out
    assert "Hot lines of costly" in out, out
    assert "Hot lines of `costly`" in (tmp_path / "out" / "profile.md").read_text()


def test_a_function_defined_on_line_1_is_not_taken_for_the_script_itself(tmp_path, capsys):
    # a script's module code and a `def` on its line 1 share (file, line 1): the function's loop was taken for the
    # whole call's, 100% of the host time, beside the module loop's 80%
    script = _script(tmp_path, """\
        def helper():
            s = 0
            for i in range(200000):
                s += i
            return s
        t = 0
        for k in range(400000):
            t += k
        helper()
        """)
    assert main(["profile", "--device", "cpu", "--json", str(script)]) == 0
    loops = {lp["function"]: lp["share"] for lp in json.loads(capsys.readouterr().out)["hotspots"]["hot_loops"]}
    assert loops["<module>"] > loops["helper"], loops  # 2x the iterations of the same body
    assert loops["helper"] < 0.6, loops  # about a third of the run, not all of it


def test_too_many_steps_is_said_in_the_options_words(tmp_path, capsys):
    marker = tmp_path / "ran"
    script = _script(tmp_path, f"open({str(marker)!r}, 'w').write('ran')\n")
    assert main(["profile", "--device", "cpu", "--steps", "20000", str(script)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuspeed: error: --steps 20000") and err.count("\n") == 1, err
    assert not marker.exists()


@pytest.mark.gpu
def test_gpu_work_in_threads_is_said_to_be_missing():
    def launch_in_a_thread():
        t = threading.Thread(target=lambda: torch.ones(1024, device="cuda").sum().item())
        t.start()
        t.join()

    res = profile(launch_in_a_thread, steps=1, warmup=1, device="cuda", hotspots=False)
    assert any("1 thread(s)" in n and "torch.profiler" in n for n in res.notes), res.notes
