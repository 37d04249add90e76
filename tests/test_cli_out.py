"""Every command that takes --out rejects a bad one at startup: one line, exit 2, before any work."""

import os

import pytest

from gpuspeed.cli import main

WORK_STARTED = "work started before --out was checked"

# command line (without --out) and the function each command calls to start its work; the function is
# replaced by one that fails the test, so a command that checks --out after starting work cannot pass
COMMANDS = {
    "bench": (["bench", "--device", "cpu", "--rows", "64", "--cols", "64", "--budget", "0.1"],
              "gpuspeed.demo.run_demo"),
    "roofline": (["roofline", "--device", "cpu", "--quick", "--no-sweep", "--no-place"],
                 "gpuspeed.roofline.study.Study"),
    "launch": (["launch", "--device", "cpu", "--ks", "1", "--ns", "1e3", "--variants", "eager",
                "--budget", "0.05"], "gpuspeed.launch.run_launch"),
    "profile": (["profile", "{script}"], "gpuspeed.profiling.profile"),
    "optimize": (["optimize", "black_scholes", "--device", "cpu"], "gpuspeed.optimize.pipeline.optimize"),
}


def _tripwire(*args, **kwargs):
    raise AssertionError(WORK_STARTED)


def _bad_out(kind: str, tmp_path):
    if kind == "empty":  # `--out "$UNSET"`: typer made a Path option of '' Path("."), the cwd, and wrote there
        return ""
    if kind == "existing-file":
        path = tmp_path / "taken"
        path.write_text("not a folder")
        return path
    if os.geteuid() == 0:  # root writes into any folder whatever its mode: a path under a file fails for all
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        return blocker / "results"
    path = tmp_path / "read-only"
    path.mkdir()
    path.chmod(0o500)
    return path


@pytest.mark.parametrize("kind", ["existing-file", "unwritable", "empty"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_bad_out_is_one_line_exit_2_before_any_work(command, kind, tmp_path, monkeypatch, capsys):
    argv, work = COMMANDS[command]
    module, _, name = work.rpartition(".")
    monkeypatch.setattr(f"{module}.{name}", _tripwire, raising=False)
    marker = tmp_path / "script-ran"
    script = tmp_path / "script.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    out = _bad_out(kind, tmp_path)
    try:
        # gpuspeed's options go before a profiled script's path: what follows it is the script's own argv
        cmd = [a.replace("{script}", str(script)) for a in argv]
        at = next((i for i, a in enumerate(cmd) if a.endswith(".py")), len(cmd))
        rc = main(cmd[:at] + ["--out", str(out)] + cmd[at:])
    finally:
        if out and out.parent.exists():
            out.parent.chmod(0o700)
        if out and out.is_dir():
            out.chmod(0o700)
    _, err = capsys.readouterr()
    assert rc == 2, err
    assert err.startswith(f"gpuspeed: error: --out {out or repr('')}") and err.count("\n") == 1, err
    assert not marker.exists()


def test_a_command_that_fails_leaves_no_empty_out_folder(tmp_path, capsys):
    # --out is created at startup (to check it): an error after that takes back what it made, and only that
    new = tmp_path / "new" / "results"
    assert main(["decode", "--model", "tiny", "--tp", "0", "--out", str(new)]) == 2
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    assert main(["decode", "--model", "tiny", "--tp", "0", "--out", str(kept)]) == 2
    assert kept.is_dir()
    assert capsys.readouterr().err.count("gpuspeed: error:") == 2
