"""QA round 14, core: the instruments and the CLI shell as a demanding user meets them on a CPU-only machine.
Interrupted runs that must not destroy a good measurement, signals that arrive before a command is ready for them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from signal_helpers import at_a_terminal, ignoring
from test_interrupt_qa13 import _env, _no_temp, _one_line, stopped

ROOT = Path(__file__).resolve().parents[1]


def _gpuspeed(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuspeed", *args], capture_output=True, text=True, env=_env(),
                          cwd=cwd, timeout=300)


def _in_process(args: list[str], capsys) -> tuple[int, str, str]:
    """`gpuspeed ARGS` in this process, where the test is not about the process: (exit code, stdout, stderr)."""
    from gpuspeed.cli import main

    capsys.readouterr()
    rc = main(args)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


# -- 1. an interrupted run keeps a complete file already in --out ------------------------------------------------

def test_roofline_stopped_keeps_the_complete_roofline_json_already_there(tmp_path, capsys, quick_cpu_roofline):
    # a whole `gpuspeed roofline --out DIR` ran; a second one into the same folder was stopped by `timeout`: its partial
    # roofline.json replaced the good one (the roof kernel reports and notebooks read), which was lost
    out = tmp_path / "res"
    # the first, whole run (in this process: quick_cpu_roofline) only has to leave a file; the stopped one is a process
    rc, _, err = _in_process(["roofline", "--quick", "--no-place", "--no-sweep", "--out", str(out)], capsys)
    assert rc == 0, err[-3000:]
    whole = (out / "roofline.json").read_text()
    assert not json.loads(whole)["params"].get("partial")
    rc, _, err = stopped(["roofline", "--quick", "--no-place", "--out", str(out)], signal.SIGTERM,
                         "gpuspeed roofline [", tmp_path, times=2)
    assert rc == 143, (rc, err[-3000:])
    line = _one_line(err, "stopped by SIGTERM")
    assert str(out / "roofline.partial.json") in line and f"{out / 'roofline.json'} is kept" in line, line
    assert (out / "roofline.json").read_text() == whole  # the complete one, untouched
    part = json.loads((out / "roofline.partial.json").read_text())
    assert part["params"]["partial"] is True and part["summary"]["copy_GBps"] > 0
    assert (out / "roofline.partial.md").is_file() and (out / "roofline.partial.png").is_file()
    _no_temp(out)
    from gpuspeed.results import read_results
    from gpuspeed.roofline.study import ceilings_from_results

    assert ceilings_from_results(read_results(out / "roofline.json")).rows  # still the roof it was


def test_launch_stopped_keeps_the_complete_launch_json_already_there(tmp_path, capsys):
    out = tmp_path / "res"
    args = ["launch", "--ks", "1,2,4", "--ns", "1000", "--variants", "eager", "--tiny-k", "10", "--budget", "0.05",
            "--out", str(out)]
    rc, _, err = _in_process(args, capsys)
    assert rc == 0, err[-3000:]
    whole = (out / "launch.json").read_text()
    rc, _, err = stopped(args, signal.SIGTERM, "; now fusion N=1e+03 copy", tmp_path)
    assert rc == 143, (rc, err[-3000:])
    line = _one_line(err, "stopped by SIGTERM")
    assert str(out / "launch.partial.json") in line and f"{out / 'launch.json'} is kept" in line, line
    assert (out / "launch.json").read_text() == whole
    part = json.loads((out / "launch.partial.json").read_text())
    assert part["params"]["partial"] is True and part["summary"]["eager_us_per_launch"] > 0
    assert (out / "launch.partial.md").is_file() and (out / "launch.partial.png").is_file()
    _no_temp(out)


def test_a_partial_run_still_replaces_a_partial_one(tmp_path):
    # nothing complete to keep: the partial file goes where it always went (a rerun that is stopped again)
    out = tmp_path / "res"
    for _ in range(2):
        rc, _, err = stopped(["launch", "--ks", "1,2,4", "--ns", "1000", "--variants", "eager", "--tiny-k", "10",
                              "--budget", "0.05", "--out", str(out)], signal.SIGTERM, "; now fusion N=1e+03 copy",
                             tmp_path)
        assert rc == 143, (rc, err[-3000:])
        assert str(out / "launch.json") in _one_line(err, "stopped by SIGTERM")
    assert json.loads((out / "launch.json").read_text())["params"]["partial"] is True
    assert not (out / "launch.partial.json").exists()


# -- 2. a signal before the command's own handler ----------------------------------------------------------------

def _catches_sigterm(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    return bool(mask >> (signal.SIGTERM - 1) & 1)


def _early_stop(command: list[str], sig: int, when: str, cwd: Path):
    """Run `command` and send `sig` early: once it catches SIGTERM or maps `when` (a shared library's name, as torch's
    import loads it), whichever comes first. Returns (exit code, stdout, stderr)."""
    p = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=cwd,
                         preexec_fn=at_a_terminal)
    deadline = time.monotonic() + 60
    while p.poll() is None and time.monotonic() < deadline:
        try:
            if _catches_sigterm(p.pid) or when in Path(f"/proc/{p.pid}/maps").read_text():
                break
        except (OSError, StopIteration):
            pass
        time.sleep(0.002)
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    return p.returncode, out, err


# when the signal is sent: once SIGTERM shows as caught ("startup": "\0" is in no map), or once NumPy's extension is
# mapped (gpuspeed's own imports, the first ~0.2 s: plain Python's -15 or a traceback there, until the package set a
# handler before them), or libtorch's, whichever comes first
_MARKS = {"startup": "\0", "numpy": "_multiarray_umath", "libtorch": "libtorch"}


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
@pytest.mark.parametrize("entry", ["-m", "script"])
@pytest.mark.parametrize("when", ["startup", "numpy", "libtorch"])
def test_sigterm_before_the_command_is_ready_is_one_line_and_143(tmp_path, entry, when):
    # `timeout 5 gpuspeed roofline --out DIR` on a slow start: SIGTERM while the CLI and torch loaded killed it where
    # it stood (exit -15, no word) and left the empty --out folder
    out = tmp_path / "res"
    head = [sys.executable, "-m", "gpuspeed"] if entry == "-m" else [str(Path(sys.executable).with_name("gpuspeed"))]
    if entry == "script" and not Path(head[0]).exists():
        pytest.skip("no gpuspeed console script beside this python")
    rc, stdout, err = _early_stop([*head, "roofline", "--quick", "--out", str(out)], signal.SIGTERM,
                                  _MARKS[when], tmp_path)
    assert rc == 143, (rc, err[-3000:])
    assert err.strip() == "gpuspeed: stopped by SIGTERM", err[-3000:]
    assert not out.exists()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
@pytest.mark.parametrize("when", ["startup", "numpy", "libtorch"])
def test_ctrl_c_before_the_command_is_ready_is_one_line_and_130(tmp_path, when):
    # Ctrl-C while the CLI's modules or torch loaded: a KeyboardInterrupt traceback and exit -2 (or, raised inside
    # torch's extension init, an abort)
    out = tmp_path / "res"
    rc, _, err = _early_stop([sys.executable, "-m", "gpuspeed", "roofline", "--quick", "--out", str(out)],
                             signal.SIGINT, _MARKS[when], tmp_path)
    assert rc == 130, (rc, err[-3000:])
    assert err.strip().splitlines()[-1] == "gpuspeed: interrupted" and "Traceback" not in err, err[-3000:]
    assert not out.exists()


def test_ctrl_c_inside_a_command_still_keeps_what_it_measured(tmp_path):
    # the early handler gives way to the command's own: Ctrl-C during the roofline's steps keeps the steps done
    out = tmp_path / "res"
    rc, _, err = stopped(["roofline", "--quick", "--no-place", "--out", str(out)], signal.SIGINT,
                         "gpuspeed roofline [", tmp_path, times=2)
    assert rc == 130, (rc, err[-3000:])
    assert "partial" in _one_line(err, "interrupted")
    assert json.loads((out / "roofline.json").read_text())["params"]["partial"] is True
    _no_temp(out)


# -- check(): an explicit tolerance on an integer output ---------------------------------------------------------

def test_check_honours_an_explicit_atol_on_integer_outputs():
    # a uint8 image off by one level, checked with atol=1: FAIL "(atol 0, rtol 0)", the atol passed silently dropped,
    # while the same values as floats against the integer reference passed
    import numpy as np

    import gpuspeed

    ref = np.array([[10, 200], [0, 255]], dtype=np.uint8)
    out = np.array([[11, 199], [0, 255]], dtype=np.uint8)
    r = gpuspeed.check(out, ref, atol=1)
    assert r.passed, r.summary
    assert r.leaves[0].atol == 1 and r.leaves[0].max_abs_err == 1
    assert gpuspeed.check(out.astype(np.float64), ref, atol=1).passed  # as it was already
    off_by_two = out.astype(np.int64) + np.array([[1, 0], [0, 0]])
    bad = gpuspeed.check(off_by_two, ref, atol=1)
    assert not bad.passed and "1/4 over tolerance (atol 1" in bad.summary and bad.leaves[0].worst_index == (0, 0)
    assert not gpuspeed.check(out, ref).passed  # without one: exact, as documented
    assert not gpuspeed.check(out, ref, rtol=0.1).passed  # a relative tolerance is not one for counts and indices
    assert gpuspeed.check(np.array([True, False]), np.array([True, True]), atol=1).passed


# -- gpuspeed profile --function whose function calls sys.exit -----------------------------------------------------

@pytest.mark.parametrize("code", [0, 3])
def test_profile_function_that_calls_sys_exit_is_one_line_and_2(tmp_path, code):
    # the function's sys.exit ended gpuspeed itself: exit 3 (or 0, as if the profile had passed) and not a word
    (tmp_path / "fn.py").write_text(f"import sys\n\ndef f(x):\n    sys.exit({code})\n")
    out = tmp_path / "res"
    r = _gpuspeed("profile", "-f", f"{tmp_path / 'fn.py'}:f", "-i", "x=float32[8]", "--no-hotspots", "--out", str(out),
                  cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert r.stderr.strip().splitlines()[-1] == f"gpuspeed: error: f raised SystemExit({code})", r.stderr[-2000:]
    assert "Traceback" not in r.stderr and not out.exists()


def test_bench_demo_with_a_shape_given_does_not_say_it_ran_smaller(capsys):
    # `gpuspeed bench --rows 8 --cols 8` on a CPU noted "both versions run on the CPU, at a smaller size": the size was
    # the user's own
    rc, stdout, err = _in_process(["bench", "--rows", "8", "--cols", "8", "--budget", "0.1", "--json"], capsys)
    assert rc == 0, err[-2000:]
    doc = json.loads(stdout)
    assert doc["params"]["shape"] == [8, 8]
    assert not any("smaller size" in n for n in doc["notes"]), doc["notes"]
    rc, stdout, _ = _in_process(["bench", "--budget", "0.1", "--json"], capsys)
    assert rc == 0 and any("smaller size" in n for n in json.loads(stdout)["notes"])  # the CPU default shape: it is


def _broken_torch_env(tmp_path: Path) -> dict:
    """An environment whose `import torch` fails as a broken install's does (a CUDA library missing)."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "torch.py").write_text("raise ImportError('libcudnn.so.9: cannot open shared object file', name='torch')\n")
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(fake), env["PYTHONPATH"]])
    return env


@pytest.mark.parametrize("command", [["bench", "--budget", "0.1"], ["roofline", "--quick", "--no-place"],
                                     ["launch", "--ks", "1,2"]])
def test_a_torch_that_cannot_be_imported_is_one_line_and_2(tmp_path, command):
    # a broken torch install (a CUDA library missing, a half-finished upgrade): each command ended in a 30-line
    # ImportError traceback and exit 1; doctor alone said what was wrong
    env = _broken_torch_env(tmp_path)
    out = tmp_path / "res"
    r = subprocess.run([sys.executable, "-m", "gpuspeed", *command, "--out", str(out)], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("gpuspeed: error: cannot import torch") and "libcudnn.so.9" in line, line
    assert "gpuspeed doctor" in line and not out.exists()


def test_check_given_a_function_instead_of_its_result_says_so():
    # check(out, np.sum) (the reference function, not its result): "cannot compare _ArrayFunctionDispatcher values"
    import numpy as np

    import gpuspeed
    from gpuspeed.errors import UserError

    for out, ref in ((np.ones(3), np.sum), (lambda: np.ones(3), np.ones(3))):
        with pytest.raises(UserError, match=r"a function .*pass its result.*verify_function"):
            gpuspeed.check(out, ref)


# -- bench(rotate=N): copies that cannot fit -----------------------------------------------------------------------

def test_bench_rotate_that_cannot_fit_is_refused_before_any_copy():
    # bench(fn, x, rotate=N) cloned N-1 copies of the arguments blindly: past the free memory the OOM killer ended the
    # process (python killed, not a word; on a shared machine it may take another's), on a GPU a raw CUDA OOM
    import numpy as np

    import gpuspeed
    from gpuspeed.errors import UserError
    from gpuspeed.inputs import host_available_bytes

    x = np.ones(1 << 20)  # 8 MiB
    free = host_available_bytes()
    if free is None:
        pytest.skip("the free host memory is not known here")
    rotate = 2 * free // x.nbytes + 2
    t0 = time.perf_counter()
    with pytest.raises(UserError, match=r"rotate=\d+ .* GiB .* free"):
        gpuspeed.bench(lambda a: None, x, rotate=rotate, budget_s=0.1)
    assert time.perf_counter() - t0 < 5  # refused before copying
    assert gpuspeed.bench(lambda a: None, x, rotate=3, budget_s=0.1).n > 0  # a rotation that fits still runs


@pytest.mark.gpu
@pytest.mark.alone  # sized by the GPU's free memory: under xdist another worker's allocations would move it
def test_bench_rotate_of_a_cuda_tensor_that_cannot_fit_is_refused():
    import torch

    import gpuspeed
    from gpuspeed.errors import UserError
    from gpuspeed.inputs import gpu_available_bytes

    x = torch.ones(1 << 28, device="cuda")  # 1 GiB
    rotate = 2 * gpu_available_bytes("cuda:0") // x.nbytes + 2
    with pytest.raises(UserError, match=r"GPU \(cuda:0\) memory"):
        gpuspeed.bench(lambda a: a.sum(), x, rotate=rotate, budget_s=0.2)
    assert gpuspeed.bench(lambda a: a.sum(), x, rotate=2, budget_s=0.2).n > 0


def test_doctor_tells_a_broken_torch_from_a_missing_one(tmp_path):
    # torch installed but failing to import (a CUDA library missing): doctor said "torch is not installed", sending the
    # user to reinstall what is there instead of to the library that is missing
    env = _broken_torch_env(tmp_path)
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "doctor", "--json"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    headline = json.loads(r.stdout)["headline"]
    assert "not installed" not in headline and "torch cannot be imported" in headline, headline
    assert "libcudnn.so.9" in headline


def test_an_ignored_ctrl_c_stays_ignored(tmp_path):
    # `gpuspeed roofline ... &` in a script starts it with SIGINT ignored, as a background job should be: the early
    # handler must not make it answer a Ctrl-C meant for the foreground
    p = subprocess.Popen([sys.executable, "-m", "gpuspeed", "bench", "--rows", "64", "--cols", "64", "--budget", "0.3",
                          "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path,
                         preexec_fn=ignoring(signal.SIGINT))
    deadline = time.monotonic() + 60
    while p.poll() is None and time.monotonic() < deadline and not _catches_sigterm(p.pid):
        time.sleep(0.005)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, (p.returncode, err[-2000:])
    assert json.loads(out)["study"] == "bench_demo"


def test_an_ignored_sigterm_stays_ignored_while_measuring(tmp_path):
    # started with SIGTERM ignored (`trap '' TERM` before it), a run was stopped all the same once its measuring began:
    # stop_signals() put its own handler over the caller's choice
    out = tmp_path / "res"
    p = subprocess.Popen([sys.executable, "-m", "gpuspeed", "launch", "--ks", "1,2,4", "--ns", "1000", "--variants",
                          "eager", "--tiny-k", "10", "--budget", "0.05", "--out", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path, preexec_fn=ignoring(signal.SIGTERM))
    err = []
    for line in p.stderr:
        err.append(line)
        if "gpuspeed launch [" in line:  # measuring, inside stop_signals()
            p.send_signal(signal.SIGTERM)
            break
    stdout, rest = p.communicate(timeout=120)
    assert p.returncode == 0, (p.returncode, "".join(err) + rest)
    assert "params" in json.loads((out / "launch.json").read_text())
    assert not json.loads((out / "launch.json").read_text())["params"].get("partial")


@pytest.mark.parametrize("name", ["inspect", "numbers", "tempfile"])
def test_python_m_gpuspeed_from_a_folder_with_a_module_named_as_the_standard_librarys(tmp_path, name):
    # `python -m gpuspeed` put the current folder first on sys.path while it imported the gpuspeed package itself
    # (before __main__'s fix ran): a user's inspect.py there ended every command in a traceback
    (tmp_path / f"{name}.py").write_text(f"raise SystemExit('the user {name}.py was imported')\n")
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "--version"], cwd=tmp_path, capture_output=True, text=True,
                       env=_env(), timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("gpuspeed "), (r.returncode, r.stderr[-2000:])


@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, 143, "stopped by SIGTERM"),
                                             (signal.SIGINT, 130, "interrupted")])
def test_a_signal_in_a_command_without_its_own_handler_is_one_line(tmp_path, sig, code, word):
    # `gpuspeed launch --explain` installs no stop_signals(): a SIGTERM while the user's make_inputs() ran killed it
    # where it stood (exit -15, not a word); the early handler unwinds it instead (typer takes it for a Ctrl-C: the CLI
    # tells the two apart)
    (tmp_path / "f.py").write_text("import sys, time\n\ndef f(x):\n    return x + 1\n\ndef make_inputs():\n"
                                   "    print('making inputs', file=sys.stderr, flush=True)\n    time.sleep(30)\n"
                                   "    return (1,)\n")
    out = tmp_path / "res"
    rc, _, err = stopped(["launch", "--explain", f"{tmp_path / 'f.py'}:f", "--out", str(out)], sig, "making inputs",
                         tmp_path)
    assert rc == code, (rc, err[-3000:])
    assert err.strip().splitlines()[-1] == f"gpuspeed: {word}" and "Traceback" not in err, err[-3000:]
    assert not out.exists()


def test_check_of_arrays_too_large_to_compare_on_this_host_is_refused_in_one_line():
    # check() compares in float64 on the host: an output of billions of elements took every byte and the OOM killer
    # ended the process without a word (or NumPy raised a bare MemoryError from deep inside); a broadcast view costs
    # no memory here, so the arrays of the test are free to make
    import numpy as np

    import gpuspeed
    from gpuspeed.errors import UserError

    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    n = 2 * total // 8  # one float64 copy alone is twice this host's memory
    out = np.broadcast_to(np.float32(1), (n,))
    t0 = time.perf_counter()
    with pytest.raises(UserError, match=r"out\['y'\] has [\d,]+ elements.* GiB .*free"):
        gpuspeed.check({"y": out}, {"y": out})
    assert time.perf_counter() - t0 < 5
    assert gpuspeed.check(np.ones(1000), np.ones(1000)).passed
