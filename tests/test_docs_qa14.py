"""QA round 14, docs: the loop advice a new user reads from `gpuspeed profile`, and the README's commands as a new
user copies them."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuspeed.profiling.loops import loop_nests

ROOT = Path(__file__).resolve().parents[1]
GPUSPEED = [sys.executable, "-m", "gpuspeed"]


def _loop(src: str) -> dict:
    (loop,) = loop_nests(textwrap.dedent(src), 1, {}, 0.0)
    return loop


def test_profile_calls_an_outer_loop_adding_into_the_same_elements_a_reduction_not_a_parallel_map(tmp_path):
    """`for k in range(K): for i in range(n): out[i] += f(x[i], k)`: every k adds into the same out[i], so the outer
    loop is a reduction over k, not "one thread per outer iteration ... iterations independent" (the advice
    `gpuspeed profile` printed: threads over k would race on out[i]); the inner i loop stays the parallel map."""
    script = tmp_path / "acc.py"
    script.write_text(textwrap.dedent("""\
        import numpy as np


        def accumulate(x, K):
            out = np.zeros_like(x)
            for k in range(K):
                for i in range(x.shape[0]):
                    out[i] += x[i] * 0.5 + k
            return out


        if __name__ == "__main__":
            accumulate(np.random.rand(200), 30)
        """))
    run = subprocess.run([*GPUSPEED, "profile", "--device", "cpu", "--json", str(script)], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    loops = json.loads(run.stdout)["hotspots"]["hot_loops"]
    loop = next(lp for lp in loops if lp["line"] == 6)
    assert loop["kind"] == "reduction", loop
    assert [r["name"] for r in loop["dependences"]["reductions"]] == ["out[i]"], loop["dependences"]
    assert loop["inner"] == [{"line": 7, "kind": "parallel-map"}], loop["inner"]
    assert "iterations independent" not in loop["verdict"] and "one thread per outer iteration" not in loop["verdict"]
    assert "inner loop at line 7" in loop["verdict"], loop["verdict"]


@pytest.mark.parametrize("src, kind", [
    # each step reads the previous step's array (copied back): the steps are in order, the inner loop is the map
    ("""\
     def f(u, new, n, steps):
         for t in range(steps):
             for i in range(1, n - 1):
                 new[i] = (u[i - 1] + u[i + 1]) / 2
             for i in range(1, n - 1):
                 u[i] = new[i]
     """, "sequential-loop"),
    # a scratch row each outer iteration writes in full before it reads it: private, the rows stay independent
    ("""\
     def f(a, out, tmp, n, m):
         for r in range(n):
             for j in range(m):
                 tmp[j] = a[r, j] * 2
             for j in range(m):
                 out[r, j] = tmp[j] + 1
     """, "parallel-map"),
    # the outer index is in the element: each outer iteration adds into its own row
    ("""\
     def f(a, out, n, m):
         for r in range(n):
             for j in range(m):
                 out[r] += a[r, j]
     """, "parallel-map"),
])
def test_outer_loop_over_elements_its_inner_loops_touch_again(src, kind):
    """An outer loop whose inner loops write the same elements in every outer iteration carries them (a reduction
    when it only adds into them, steps in order when it reads them back); a scratch row written in full first, or
    an element indexed by the outer variable, carries nothing."""
    loop = _loop(src)
    assert loop["kind"] == kind, (loop["dependences"], loop["verdict"])


def test_a_histogram_is_not_advised_as_prange():
    """`h[b[i]] += 1`: iterations may add into the same bin; the advice was "Numba @njit(parallel=True) with
    prange", which races on the bin (Numba's docs say so); it now says atomic adds."""
    loop = _loop("def f(b, h, n):\n    for i in range(n):\n        h[b[i]] += 1\n")
    assert loop["kind"] == "reduction" and "atomic" in loop["verdict"], loop["verdict"]
    assert "with prange" not in loop["verdict"], loop["verdict"]


def _earlier_kernel_claims() -> list[str]:
    """The kernel paragraph's numbers from earlier runs and from the mandelbrot verdicts, not checked before."""
    from test_docs_qa12 import _doc, _f, _pct, _row

    k, rn64 = "kernels.json", ("row_normalize_loop", "triton")
    two_step = [_pct("kernels_1bac8bf.json", "heat_stencil", v) for v in ("triton", "numba_cuda", "triton_fp32")]
    one_step = [_pct("kernels_1bac8bf.json", "heat_stencil", v) for v in ("triton_one_step", "triton_one_step_fp32")]
    mandel = {v: _row(k, "mandelbrot", v)["scaled_up"]["verdict"] for v in ("triton", "numba_cuda")}
    assert "fp64 50 %" in mandel["triton"] and "3 of its 8 fp64 instructions are FMAs" in mandel["triton"], mandel
    assert "fp64 67 %" in mandel["numba_cuda"] and "2 of its 10 fp64" in mandel["numba_cuda"], mandel
    assert _doc(k)["git"].startswith("7dc2b0a")  # "(78 % at 7dc2b0a)": kernels.json is that run
    return [
        f"(the float64 row normalization went from {_f(_pct('kernels_9200d2d.json', *rn64), 0)} % to "
        f"{_f(_pct(k, *rn64), 0)} %)",
        f"measured them at {_f(min(two_step), 0)}-{_f(max(two_step), 0)} % of the roof, against "
        f"{_f(min(one_step), 0)}-{_f(max(one_step), 0)} % for one step a launch",
        f"the Numba histogram with a multiply ran "
        f"{_row('kernels_c68085a.json', 'histogram', 'numba_cuda')['time_s'] * 1e6:.0f} us",
        f"loaded each row after storing the one before ({_f(_pct('kernels_89c290e.json', 'heat_stencil', 'triton_fp32'), 0)} %)",
        "fp64 is half the Triton loop's instructions and 3 of its 8 are FMAs, two thirds of the Numba loop's and 2 of "
        "its 10",
    ]


def test_earlier_runs_numbers_the_kernel_paragraph_quotes_match_their_files():
    """It said the float64 row normalization 'went from 71 % to 82 %' when bench's flush began reading its buffer;
    kernels.json, the run the paragraph quotes beside it, says 81.4 %."""
    from test_docs_qa12 import PROSE

    missing = [phrase for phrase in _earlier_kernel_claims() if phrase not in PROSE]
    assert not missing, "README prose disagrees with its results files:\n" + "\n".join(missing)


def _readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def _commands_with_device() -> list[str]:
    """The commands of the README's Commands block, those that take --device (the README: --device cpu|cuda|auto)."""
    import typer

    from gpuspeed.cli import app

    block = re.search(r"## Commands\s*```\n(.*?)```", _readme(), re.S).group(1)
    named = dict.fromkeys(re.findall(r"^gpuspeed ([a-z]+)", block, re.M))
    group = typer.main.get_command(app)
    return [c for c in named if "--device" in {o for p in group.commands[c].params for o in p.opts}]


# the least each command needs besides --device (a file, a model), so that only the device is wrong
_MINIMAL = {"profile": ["script.py"], "kernel": ["script.py:f"], "optimize": ["black_scholes"],
            "decode": ["--model", "tiny"], "roofline": ["--quick"]}


def test_every_readme_command_asked_for_a_gpu_on_a_cpu_only_machine_says_so_in_one_line(tmp_path, capsys):
    """`--device cuda` where no GPU is: one line naming `gpuspeed doctor`, exit 2, nothing written to --out; never a
    traceback nor a silent fall back to the CPU (the README: every command runs without a GPU, and says so)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    from gpuspeed.cli import main

    (tmp_path / "script.py").write_text("def f(x):\n    return x\n")
    commands = _commands_with_device()
    assert {"bench", "roofline", "launch", "profile", "kernel", "optimize", "decode"} <= set(commands), commands
    for cmd in commands:
        out = tmp_path / f"out_{cmd}"
        args = [cmd, "--device", "cuda", *_MINIMAL.get(cmd, [])]
        args += ["--out", str(out)] if cmd != "profile" else []
        assert main(args) == 2, cmd
        err = capsys.readouterr().err
        assert err.startswith("gpuspeed: error: ") and err.count("\n") == 1 and "gpuspeed doctor" in err, (cmd, err)
        assert not out.exists(), cmd


@pytest.mark.parametrize("script", ["bench_accuracy.py", "matmul_power.py"])
def test_readme_gpu_only_benchmarks_say_so_in_one_line_on_a_cpu(tmp_path, script):
    """The README's benchmarks that need a GPU, run as it writes them (PYTHONPATH=src python3 benchmarks/...
    --out DIR) on a CPU-only machine: one line, exit 2, no results file."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    assert f"benchmarks/{script}" in _readme()
    run = subprocess.run([sys.executable, f"benchmarks/{script}", "--out", str(tmp_path / "out")], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "needs a CUDA GPU" in run.stderr, run.stderr
    assert not (tmp_path / "out").exists() and not run.stdout


@pytest.mark.parametrize("src", [
    "def f(x, out, n, K):\n    for k in range(K):\n        for i in range(n):\n            out[i] = out[i] + x[i] * k\n",
    "def f(a, acc, n):\n    for i in range(n):\n        acc[0] = acc[0] + a[i]\n",
])
def test_an_element_written_as_itself_plus_a_value_is_the_same_reduction_as_plus_equals(src):
    """`out[i] = out[i] + v` is `out[i] += v` written out: a reduction (over k into out[i]; into acc[0]), as
    `s = s + a[i]` is for a name; it was called a sequential recurrence."""
    loop = _loop(src)
    assert loop["kind"] == "reduction" and loop["dependences"]["reductions"], (loop["dependences"], loop["verdict"])


def test_an_array_bound_anew_each_iteration_carries_nothing():
    """`for r in rows: for key, label in pairs: r[label] = f(r[key])`: r is another dict (or a fresh array:
    `tmp = np.zeros(m)`) in each iteration, so what one iteration writes in it no other reads."""
    loop = _loop("def f(rows, pairs):\n    for r in rows:\n        for key, label in pairs:\n"
                 "            r[label] = r[key] * 2\n")
    assert loop["kind"] != "sequential-loop" and not loop["dependences"]["recurrences"], loop["dependences"]
    loop = _loop("def f(a, out, n, m):\n    for r in range(n):\n        tmp = np.zeros(m)\n        for j in range(m):\n"
                 "            tmp[j] = tmp[j - 1] + a[r, j]\n        out[r] = tmp[m - 1]\n")
    assert loop["kind"] == "parallel-map", loop["dependences"]


def test_the_runs_the_readme_says_decode_json_merges_are_its_runs():
    """'`decode.json` merges five runs ... The three bf16 models are at 2d128f4 ... tiny is at c442d0f ... The int8 8B
    is at 38ca50f': the count and each run's commit, read from params.runs."""
    from test_docs_qa12 import PROSE, _doc

    runs = _doc("decode.json")["params"]["runs"]
    words = {3: "three", 4: "four", 5: "five", 6: "six", 7: "seven"}
    bf16 = {r["git"][:7] for r in runs if r["dtype"] == "bf16" and not r.get("quant")}
    (tiny,) = {r["git"][:7] for r in runs if r["model"] == "tiny"}
    (int8,) = {r["git"][:7] for r in runs if r.get("quant") == "int8"}
    assert len(bf16) == 1, bf16
    claims = [f"`decode.json` merges {words[len(runs)]} runs",
              f"The {words[sum(r['dtype'] == 'bf16' and not r.get('quant') for r in runs)]} bf16 models are at "
              f"{bf16.pop()}", f"tiny is at {tiny}", f"The int8 8B is at {int8}"]
    missing = [c for c in claims if c not in PROSE]
    assert not missing, missing
