"""What the `gpuspeed kernel` tests that run in a child process share: the interpreters' environment, a user's
script run under it, the command run under it, and the check that a refusal is one line and exit 2. Imported as a
plain module (pytest puts tests/ on sys.path: no __init__.py)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def interpreted_env() -> dict:
    """This environment with TRITON_INTERPRET=1, NUMBA_ENABLE_CUDASIM=1 and the source tree first on PYTHONPATH."""
    env = dict(os.environ, TRITON_INTERPRET="1", NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = os.pathsep.join(q for q in [str(ROOT / "src"), env.get("PYTHONPATH")] if q)
    return env


def run_script(tmp_path, body: str) -> subprocess.CompletedProcess:
    """Run `body` as a user's script with the interpreters on."""
    p = tmp_path / "user_script.py"
    p.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, str(p)], capture_output=True, text=True, env=interpreted_env(),
                          timeout=300, cwd=tmp_path)


def kernel_cli(tmp_path, files: dict, target: str, *extra) -> subprocess.CompletedProcess:
    """`python -m gpuspeed kernel target --device cpu ...` with `files` written into tmp_path first."""
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return subprocess.run([sys.executable, "-m", "gpuspeed", "kernel", target, "--device", "cpu", *extra],
                          capture_output=True, text=True, env=interpreted_env(), timeout=300, cwd=tmp_path)


def one_error(r: subprocess.CompletedProcess) -> str:
    """A user mistake: exit 2 and one `gpuspeed: error:` line, no traceback; the line is returned."""
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("gpuspeed: error:")]
    assert r.returncode == 2 and len(errors) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-2000:])
    return errors[0]


# runs `gpuspeed kernel` in-process once per argv list (sys.argv[1], JSON), one JSON line each
IN_ONE_PROCESS = """
    import contextlib, io, json, sys
    from gpuspeed.cli import main

    for argv in json.loads(sys.argv[1]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["kernel", *argv])
        print(json.dumps({"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}), file=sys.__stdout__)
    """


def kernel_cli_runs(here: Path, runs: list, timeout: int = 300) -> list:
    """`gpuspeed kernel ARGV` for each argv of `runs`, in one child process under the interpreters (cwd `here`; a
    `python -m gpuspeed` costs seconds of imports): a CompletedProcess-like result per run, in order."""
    import json

    script = here / "in_one_process.py"
    script.write_text(textwrap.dedent(IN_ONE_PROCESS))
    proc = subprocess.run([sys.executable, str(script), json.dumps(runs)], capture_output=True, text=True,
                          env=interpreted_env(), timeout=timeout, cwd=here)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [subprocess.CompletedProcess(argv, d["rc"], d["stdout"], d["stderr"])
            for argv, d in zip(runs, map(json.loads, proc.stdout.splitlines()), strict=True)]
