"""QA pass 21 on `gpuspeed kernel FILE.py:NAME` without a GPU: names that miss and a --ceilings that names a folder.
The cases run in one child process (a `python -m gpuspeed` costs seconds of imports) made once for the file: the
command in-process, once per case, with the interpreters on; each test reads its cases' results."""

import json
import subprocess
import sys
import textwrap

import pytest
from kernel_cli_helpers import interpreted_env

# runs `gpuspeed kernel` in-process once per case (argv lists in sys.argv[1], JSON), one JSON line each
IN_ONE_PROCESS = """
    import contextlib, io, json, sys
    from gpuspeed.cli import main

    for argv in json.loads(sys.argv[1]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["kernel", *argv])
        print(json.dumps({"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}), file=sys.__stdout__)
    """

LAUNCHERS = """
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2, mask=m)


    def double(x):
        out = torch.empty_like(x)
        scale_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
        return out


    def quadruple(x):
        return double(double(x))


    class Launchers:
        @staticmethod
        def doubled(x):
            return double(x)
    """

FILES = {"launchers.py": LAUNCHERS, "folder/roofline.json": "{}"}
X = ("--input", "x=float32[100]")
CASES = {
    "far name": ("launchers.py:triple", *X),
    "far name in a class": ("launchers.py:Launchers.tripled", *X),
    "ceilings folder": ("launchers.py:double", *X, "--ceilings", "folder"),
}


@pytest.fixture(scope="module")
def cli(tmp_path_factory) -> dict:
    """Every case run as `gpuspeed kernel ARGV --device cpu` in one child process with the interpreters on:
    case -> a CompletedProcess-like result (returncode, stdout, stderr)."""
    here = tmp_path_factory.mktemp("kernel_qa21")
    for name, text in FILES.items():
        (here / name).parent.mkdir(parents=True, exist_ok=True)
        (here / name).write_text(textwrap.dedent(text))
    script = here / "in_one_process.py"
    script.write_text(textwrap.dedent(IN_ONE_PROCESS))
    runs = json.dumps([[*argv, "--device", "cpu"] for argv in CASES.values()])
    proc = subprocess.run([sys.executable, str(script), runs], capture_output=True, text=True, env=interpreted_env(),
                          timeout=600, cwd=here)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {case: subprocess.CompletedProcess(argv, d["rc"], d["stdout"], d["stderr"])
            for (case, argv), d in zip(CASES.items(), map(json.loads, proc.stdout.splitlines()), strict=True)}


def one_line(r) -> str:
    """A user mistake: exit 2 and one `gpuspeed: error:` line, no traceback; the line is returned."""
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("gpuspeed: error:")]
    assert r.returncode == 2 and len(errors) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-2000:])
    return errors[0]


def test_a_name_close_to_none_says_which_launchers_the_file_has(cli):
    # `launchers.py:triple` said only "launchers.py has no 'triple'": no launcher is named close to it, and the user
    # was left to open the file; the launchers it defines are named (not its kernel, nor imported modules)
    line = one_line(cli["far name"])
    assert "launchers.py has no 'triple'" in line, line
    assert "launchers.py:double" in line and "launchers.py:quadruple" in line, line
    assert "scale_kernel" not in line and "Launchers" not in line.split("no 'triple'")[1], line


def test_a_name_missing_from_a_class_says_what_the_class_holds(cli):
    # `Launchers.tripled` said "launchers.py has no 'Launchers.tripled'", with no word of Launchers.doubled
    line = one_line(cli["far name in a class"])
    assert "launchers.py:Launchers.doubled" in line, line


def test_ceilings_naming_a_folder_is_not_said_to_be_missing(cli):
    # `--ceilings folder` (where `gpuspeed roofline --out folder` wrote folder/roofline.json) said "ceilings file
    # folder does not exist": it does, as a folder; the line now says so and names the roofline.json inside it
    line = one_line(cli["ceilings folder"])
    assert "does not exist" not in line and "folder" in line, line
    assert "folder/roofline.json" in line, line
