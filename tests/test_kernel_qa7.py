"""`gpuspeed kernel` QA, round 7: the defects a demanding user hit, each pinned by a test that failed before its fix.

In this process the interpreter switches are kept out of the shared environment (use_interpreters is stubbed, as in
test_kernel_report); the launchers here launch nothing, or the tests stop before anything runs.
"""

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from gpuspeed.kernel import verdict

ROOT = Path(__file__).resolve().parents[1]


def _cli(args, monkeypatch, capsys):
    from gpuspeed.cli import main

    monkeypatch.setattr("gpuspeed.kernel.target.use_interpreters", lambda: None)
    rc = main(["kernel", *args])
    return rc, capsys.readouterr()


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("gpuspeed: error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_out_empty_string_is_refused_not_the_cwd(tmp_path, monkeypatch, capsys):
    # typer made --out '' a Path('.'), so the report was written into the current folder
    p = tmp_path / "f.py"
    p.write_text("def f():\n    return None\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("gpuspeed.kernel.target.load_target", lambda *_: pytest.fail("work started before --out"))
    rc, got = _cli([f"{p}:f", "--out", ""], monkeypatch, capsys)
    assert rc == 2
    assert "--out ''" in _one_error_line(got.err)
    assert not (tmp_path / "kernel_report.json").exists()


def test_no_file_before_the_colon_says_so(monkeypatch, capsys):
    rc, got = _cli([":launcher"], monkeypatch, capsys)  # it said ". is a folder, not a .py file"
    assert rc == 2
    assert "no file before ':'" in _one_error_line(got.err)


LAUNCHERS = """
class Launcher:
    def __init__(self, shape):
        self.target = shape  # the user's own attribute: the shape it was built for
    def __call__(self):
        return None

launcher = Launcher((64, 64))

def plain():
    return None

plain.target = ("math", "sqrt")  # a pair of names, yet not a bundled example's variant
"""


@pytest.mark.parametrize("name", ["launcher", "plain"])
def test_a_launchers_own_target_attribute_is_not_taken_for_a_bundled_variant(tmp_path, monkeypatch, capsys, name):
    # without a GPU, any callable whose .target was a pair was swapped for "the launcher it names": a traceback for
    # (64, 64), and math.sqrt run in place of the user's function for ("math", "sqrt")
    p = tmp_path / "own_target.py"
    p.write_text(textwrap.dedent(LAUNCHERS))
    rc, got = _cli([f"{p}:{name}", "--device", "cpu"], monkeypatch, capsys)
    assert rc == 0, got.err
    assert "the variant's launcher" not in got.out
    assert "no Triton or Numba CUDA launch seen" in got.out


def test_unwrap_lazy_swaps_a_bundled_examples_variant_only(monkeypatch):
    from gpuspeed.examples.hand_kernels import lazy
    from gpuspeed.kernel.target import unwrap_lazy

    def mine():
        return None

    mine.target = ("math", "sqrt")
    assert unwrap_lazy(mine, "cpu") == (mine, [])
    # a bundled variant still runs its launcher (a stand-in module: the real ones import triton, which the interpreter
    # tests of other files must import first)
    home = types.ModuleType("gpuspeed.examples.hand_kernels.qa7_stand_in")
    home.launch = mine
    monkeypatch.setitem(sys.modules, home.__name__, home)
    fn, notes = unwrap_lazy(lazy("qa7_stand_in", "launch"), "cpu")
    assert fn is mine and notes


def _launch(grid):
    return {"kernel": "k", "backend": "triton", "grid": list(grid), "num_warps": 4, "threads_per_block": 128,
            "registers": 16, "spills": 0,
            "occupancy": {"pct": 100.0, "limiter": "warps", "blocks_per_sm": 16, "active_warps_per_sm": 64,
                          "max_warps_per_sm": 64}}


def _gpu_facts(grid, pct_of_roof=None, time_s=3e-6):
    la = _launch(grid)
    return {"gpu": True, "launches": [la], "main": la, "sms": 132, "pct_of_roof": pct_of_roof,
            "bound": "memory" if pct_of_roof is not None else None, "roof": "copy" if pct_of_roof is not None else None,
            "time_s": time_s, "occupancy_pct": 100.0, "limiter": "warps", "copy_pct": None}


def test_an_empty_grid_is_not_told_to_split_the_work():
    # empty inputs on a GPU: grid (0, 1, 1) got "grid of 0 programs on 132 SMs: split the work"
    rule, said, lever = verdict.judge(_gpu_facts((0, 1, 1)))
    assert rule == "empty" and "empty grid" in said and "split" not in said
    assert "--input" in lever
    # one empty launch beside a real one is judged by the real one
    f = _gpu_facts((40, 1, 1), pct_of_roof=30.0)
    f["launches"] = [_launch((0, 1, 1)), f["main"]]
    assert verdict.judge(f)[0] == "small_grid"


def test_unplaced_names_the_missing_bytes_not_missing_ceilings():
    # on a GPU the ceilings are always there (committed or measured now): an unplaced kernel moved no counted bytes
    rule, said, lever = verdict.judge(_gpu_facts((1000, 1, 1), time_s=1e-3))
    assert rule == "unplaced"
    assert "no ceilings" not in said and "bytes" in said
    assert "--bytes" in lever


@pytest.mark.parametrize("body,words", [
    ("    x = rng.standard_normal(4)\n", "inputs(rng) returned None (is its `return` missing?)"),
    ("    yield rng.standard_normal(4)\n", "inputs(rng) returned a generator"),
])
def test_inputs_that_are_not_arguments_are_one_line(tmp_path, monkeypatch, capsys, body, words):
    # they were passed whole as the launcher's one argument: launch(None) ran, or the launcher's error was blamed
    p = tmp_path / "w.py"
    p.write_text("def launch(x):\n    return x.sum()\n\ndef inputs(rng):\n" + body)
    monkeypatch.setattr("gpuspeed.kernel.kernel_report", lambda *a, **k: pytest.fail("the launcher ran"))
    rc, got = _cli([f"{p}:launch", "--device", "cpu"], monkeypatch, capsys)
    assert rc == 2
    assert words in _one_error_line(got.err)


def test_a_dict_from_inputs_is_named_when_the_launcher_fails_on_it(tmp_path, monkeypatch, capsys):
    p = tmp_path / "w.py"
    p.write_text("def launch(x, y):\n    return x\n\ndef inputs(rng):\n    return {'x': rng.standard_normal(4), 'y': 1}\n")
    rc, got = _cli([f"{p}:launch", "--device", "cpu"], monkeypatch, capsys)
    assert rc == 2
    line = _one_error_line(got.err)
    assert "launch raised TypeError" in line and "inputs(rng) returned a dict" in line


AUTOTUNE_CHILD = """
import json, os
import gpuspeed.kernel.capture as capture
capture._cuda_here = lambda: True  # what --device cpu on a GPU machine saw: a CUDA device beside the interpreter
import torch, triton
import triton.language as tl
from gpuspeed import kernel_report

@triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4), triton.Config({"BLOCK": 256}, num_warps=8)],
                 key=["n"])
@triton.jit
def scale(x, o, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(o + offs, tl.load(x + offs, mask=offs < n) * 2, mask=offs < n)

def launch(x):
    o = torch.empty_like(x)
    scale[lambda m: (triton.cdiv(x.numel(), m["BLOCK"]),)](x, o, x.numel())
    return o

rep = kernel_report(launch, torch.arange(1000, dtype=torch.float32), device="cpu")
print(json.dumps(rep.to_dict()["launches"][0]["autotune"]["chosen"]))
"""


def test_an_interpreted_autotuner_times_nothing_even_with_a_gpu_beside_it(tmp_path):
    # --device cpu on a GPU machine: triton's do_bench timed the interpreter's host work with CUDA events and picked
    # BLOCK 256, while the report said "nothing timed under the interpreter; the first of 2 configs ran"
    pytest.importorskip("triton")
    p = tmp_path / "child.py"
    p.write_text(AUTOTUNE_CHILD)
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(q for q in [str(ROOT / "src"), env.get("PYTHONPATH")] if q)
    r = subprocess.run([sys.executable, str(p)], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"BLOCK": 128, "num_warps": 4, "num_stages": 3}


@pytest.mark.gpu
def test_cli_device_cpu_on_a_gpu_machine_runs_the_first_autotune_config(tmp_path):
    p = tmp_path / "auto.py"
    p.write_text(AUTOTUNE_CHILD.split("rep = kernel_report")[0].replace(
        "capture._cuda_here = lambda: True", "pass"))
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "kernel", f"{p}:launch", "--input", "x=float32[1000]",
                        "--device", "cpu", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["launches"][0]["autotune"]["chosen"]["BLOCK"] == 128


def test_verdict_percentages_under_ten_keep_two_digits():
    # a 4 KiB add on the H100 read "at 0 % of the copy roof, where device copies ... reach 0 %"
    from gpuspeed.kernel.verdict import _pct

    assert _pct(0.42) == "0.42 %" and _pct(6.86) == "6.9 %" and _pct(9.96) == "10 %" and _pct(68.2) == "68 %"
    assert _pct(100.46) == "100 %"
