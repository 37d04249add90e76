"""The CLI front end: doctor, the bench demo, one-line errors and exit codes."""

import importlib.metadata
import json
import subprocess
import sys

import pytest

from gpuspeed.cli import main


def run(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_doctor_json(capsys):
    rc, out, _ = run(capsys, "doctor", "--json")
    assert rc == 0
    rep = json.loads(out)
    assert {"device", "versions", "backends", "datasheets", "gpu"} <= set(rep)
    assert len(rep["datasheets"]) >= 13
    if not rep["gpu"]:
        assert rep["device"]["kind"] == "cpu"


def test_doctor_human(capsys):
    rc, out, _ = run(capsys, "doctor")
    assert rc == 0
    assert "Backends" in out and "Datasheet" in out
    assert "H200" in out and "RTX 4070" in out


def test_unknown_option_is_one_line_exit_2(capsys):
    rc, out, err = run(capsys, "doctor", "--bogus")
    assert rc == 2
    assert err.startswith("gpuspeed: error:") and err.count("\n") == 1


def test_user_error_is_one_line_exit_2(capsys):
    rc, _, err = run(capsys, "bench", "--rows", "10")
    assert rc == 2 and err.strip() == "gpuspeed: error: --rows and --cols go together and must be positive"


def test_debug_shows_the_traceback():
    from gpuspeed.errors import UserError

    with pytest.raises(UserError):
        main(["--debug", "bench", "--rows", "10"])


def test_bench_demo_writes_results(capsys, tmp_path):
    rc, out, _ = run(capsys, "bench", "--device", "cpu", "--rows", "256", "--cols", "512", "--budget", "0.5",
                     "--out", str(tmp_path))
    assert rc == 0, out
    doc = json.loads((tmp_path / "bench_demo.json").read_text())
    assert doc["summary"]["check_passed"] is True
    assert doc["params"]["shape"] == [256, 512]
    assert "speedup" in out


def test_python_dash_m_works():
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "doctor", "--json"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout)
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "nonsense"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "gpuspeed: error:" in r.stderr and "Traceback" not in r.stderr


def test_version(capsys):
    from gpuspeed import __version__

    rc, out, err = run(capsys, "--version")
    assert rc == 0 and out == f"gpuspeed {__version__}\n" and not err
    try:  # the package's own version and the installed distribution's agree
        assert importlib.metadata.version("gpuspeed") == __version__
    except importlib.metadata.PackageNotFoundError:  # run from src/ without installing (make gpu-test)
        pass


@pytest.mark.parametrize("command", [[], ["doctor"], ["bench"], ["roofline"], ["launch"], ["profile"]])
def test_help_shows_flags_without_a_value(capsys, monkeypatch, command):
    monkeypatch.setenv("COLUMNS", "200")
    rc, out, _ = run(capsys, *command, "--help")
    assert rc == 0
    flags = ["--help"] + (["--debug", "--version"] if not command else ["--json"])
    for flag in flags:
        line = next(ln for ln in out.splitlines() if f" {flag} " in ln)
        assert "<" not in line, line  # no `<bool>`: a flag takes no value
    assert "<bool>" not in out
    if command in (["bench"], ["profile"]):
        assert "<path>" in next(ln for ln in out.splitlines() if " --out " in ln)  # options with values keep theirs


def test_json_is_a_flag_not_a_value(capsys):
    rc, _, err = run(capsys, "doctor", "--json", "true")
    assert rc == 2 and "true" in err


@pytest.mark.parametrize("budget", ["0", "-1", "nan"])
def test_bench_budget_must_be_positive(capsys, budget):
    rc, _, err = run(capsys, "bench", "--budget", budget)
    assert rc == 2 and err.startswith("gpuspeed: error: --budget") and err.count("\n") == 1


def test_one_line_names_the_exception_and_keeps_only_the_start_of_its_first_line():
    from gpuspeed.errors import one_line

    assert one_line(RuntimeError("first line " + "x" * 500 + "\nsecond line"), 20) == "RuntimeError: first line xxxxxxxxx"
    assert one_line(KeyError()) == "KeyError"  # no dangling colon (it read "MemoryError:" in notes)
    assert one_line(ValueError("  padded  \n")) == "ValueError: padded"


def test_tables_in_a_pipe_are_not_cut_to_80_columns():
    """`gpuspeed ... | tee log`: a pipe has no width, and rich's 80 columns cut decode's and optimize's tables to
    "1.…" cells; the commands print to LOG_WIDTH columns there (COLUMNS, when set, still wins)."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    cmd = [sys.executable, "-m", "gpuspeed", "bench", "--device", "cpu", "--rows", "64", "--cols", "64", "--budget", "0.1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "softmax_numpy (NumPy, CPU)" in r.stdout and "…" not in r.stdout, r.stdout  # one line per row, uncut
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**env, "COLUMNS": "60"})
    assert r.returncode == 0 and max(len(line) for line in r.stdout.splitlines()) <= 60, r.stdout


def test_ctrl_c_is_one_line_and_exit_130(capsys, monkeypatch):
    import gpuspeed.doctor

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(gpuspeed.doctor, "report", interrupted)
    assert main(["doctor"]) == 130
    assert capsys.readouterr().err.strip() == "gpuspeed: interrupted"


def test_subpackages_by_their_dotted_names_after_a_plain_import():
    """The README writes gpuspeed.roofline.place(...) and gpuspeed.graphs.capture(...) after `import gpuspeed`."""
    code = ("import gpuspeed; print(callable(gpuspeed.roofline.place), callable(gpuspeed.graphs.capture), "
            "callable(gpuspeed.graph_breaks.explain))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["True", "True", "True"], r.stderr
