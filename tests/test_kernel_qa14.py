"""QA pass 14 on kernel_report / `gpuspeed kernel`: bad input refused before any launch. CPU only: the kernels run
under the interpreters in a child process (kernel_cli_helpers)."""

import json

import pytest
from kernel_cli_helpers import kernel_cli, one_error, run_script

ADD = """
    import torch
    import triton
    import triton.language as tl

    CALLS = []


    @triton.jit
    def add_kernel(x, y, o, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(o + i, tl.load(x + i, mask=m) + tl.load(y + i, mask=m), mask=m)


    def launch(x, y):
        CALLS.append(1)
        print("LAUNCHER RAN")
        o = torch.empty_like(x)
        add_kernel[(triton.cdiv(x.numel(), 64),)](x, y, o, x.numel(), BLOCK=64)
        return o


    def inputs(rng):
        return torch.randn(100), torch.randn(100)
    """

BAD_CEILINGS = {
    "a number": ("42", "ceilings= takes"),
    "another study": ('{"study": "launch", "schema": 1, "created": "x", "command": [], "git": "", "device": {}, '
                      '"versions": {}, "params": {}, "summary": {}, "rows": [], "notes": []}', "a launch results"),
    "missing keys": ('{"study": "roofline", "schema": 1}', "lacks"),
    "a ceiling row without its name": (
        '{"study": "roofline", "schema": 1, "created": "x", "command": [], "git": "", "device": {"kind": "cpu", '
        '"name": "x"}, "versions": {}, "params": {"device": "cpu"}, "summary": {}, '
        '"rows": [{"section": "ceiling", "value": 3.0}], "notes": []}', "ceiling row"),
    "no such file": ("'/no/such/roofline.json'", "does not exist"),
}


@pytest.mark.parametrize("what", list(BAD_CEILINGS))
def test_kernel_report_refuses_bad_ceilings_before_the_launcher_runs(tmp_path, what):
    """ceilings= was looked at only after the launcher ran (and on a GPU after it was timed): under the interpreters a
    bad value was not even refused. It is now refused in one line before any launch."""
    given, said = BAD_CEILINGS[what]
    (tmp_path / "adder.py").write_text(__import__("textwrap").dedent(ADD))
    r = run_script(tmp_path, f"""
        import json
        import torch
        import gpuspeed
        from gpuspeed.errors import UserError
        import adder

        given = {given}
        if isinstance(given, str) and given.startswith("{{"):
            given = json.loads(given)
        try:
            gpuspeed.kernel_report(adder.launch, torch.randn(100), torch.randn(100), ceilings=given)
            print("no error")
        except UserError as exc:
            print("refused:", exc)
        print("launcher calls", len(adder.CALLS))
        """)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert "launcher calls 0" in lines, r.stdout
    refused = [ln for ln in lines if ln.startswith("refused:")]
    assert len(refused) == 1 and said in refused[0], r.stdout


def test_the_cli_refuses_a_bad_ceilings_file_before_the_launcher_runs(tmp_path):
    (tmp_path / "launch.json").write_text(json.dumps({"study": "launch", "schema": 1, "created": "x", "command": [],
                                                      "git": "", "device": {}, "versions": {}, "params": {},
                                                      "summary": {}, "rows": [], "notes": []}))
    r = kernel_cli(tmp_path, {"adder.py": ADD}, "adder.py:launch", "--ceilings", "launch.json")
    assert "a launch results document" in one_error(r)
    assert "LAUNCHER RAN" not in r.stdout + r.stderr


def test_ceilings_of_a_gpu_given_on_a_cpu_are_said_unused(tmp_path):
    """Without a GPU nothing is placed on a roof: a GPU's roofline given is not refused there (the same script runs on
    the GPU later) but said to be unused, not dropped without a word."""
    import shutil
    from pathlib import Path

    shutil.copy(Path(__file__).resolve().parents[1] / "results" / "nvidia-h200" / "roofline.json", tmp_path / "h200.json")
    r = kernel_cli(tmp_path, {"adder.py": ADD}, "adder.py:launch", "--ceilings", "h200.json", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    notes = json.loads(r.stdout)["notes"]
    assert [n for n in notes if "h200.json" in n and "not used" in n], notes


@pytest.mark.gpu
def test_on_a_gpu_ceilings_of_another_device_are_refused_before_any_launch(tmp_path):
    """On a GPU the device check came after the launcher was compiled, autotuned and timed: a CPU's roofline given is
    now refused before the first launch."""
    import shutil
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    shutil.copy(root / "results" / "cpu" / "roofline.json", tmp_path / "cpu_roof.json")
    (tmp_path / "adder.py").write_text(textwrap.dedent(ADD))
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "kernel", "adder.py:launch", "--device", "cuda",
                        "--ceilings", "cpu_roof.json"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert "measured on" in one_error(r)
    assert "LAUNCHER RAN" not in r.stdout + r.stderr
