"""QA pass 15 on `gpuspeed kernel FILE.py:NAME` without a GPU: a user's own Triton and Numba CUDA launchers, laid out
as in a real project, run under the interpreters (TRITON_INTERPRET=1 / NUMBA_ENABLE_CUDASIM=1)."""

import subprocess
import sys
import textwrap

from kernel_cli_helpers import interpreted_env, one_error

KERNELS = """
    import triton
    import triton.language as tl


    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)
    """

LAUNCHER = """
    import torch
    import triton

    from .kernels import add_kernel


    def launch(x, y):
        out = torch.empty_like(x)
        add_kernel[(triton.cdiv(x.numel(), 128),)](x, y, out, x.numel(), BLOCK=128)
        return out
    """


def test_a_launcher_inside_a_package_imports_its_kernels_relatively(tmp_path):
    # ops/launch.py's `from .kernels import add_kernel` (run as `python -m ops.launch`): kernel said "attempted relative
    # import with no known parent package" and stopped
    pkg = tmp_path / "my project" / "ops"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "kernels.py").write_text(textwrap.dedent(KERNELS))
    (pkg / "launch.py").write_text(textwrap.dedent(LAUNCHER))
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "kernel", f"{pkg / 'launch.py'}:launch", "--device", "cpu",
                        "--input", "x=float32[1000]", "--input", "y=float32[1000]"],
                       capture_output=True, text=True, env=interpreted_env(), timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "add_kernel [triton] grid (8, 1, 1)" in r.stdout and "no timing or occupancy here" in r.stdout, r.stdout


OWN_FILE = """
    import numpy as np
    from numba import cuda


    @cuda.jit
    def axpy(a, x, y, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = a * x[i] + y[i]


    def launch(x, y):
        out = np.empty_like(x)
        axpy[(x.size + 127) // 128, 128](np.float32(2.0), x, y, out)
        return out


    def original(x, y):
        return x + y  # not what launch computes: launch is not one of the file's variants, so nothing compares them


    def inputs(rng):
        return rng.standard_normal(300).astype(np.float32), rng.standard_normal(300).astype(np.float32)
    """


def test_a_launcher_that_was_not_checked_is_not_said_to_be_checked_against_original(tmp_path):
    # the no-GPU note said "to check what it computes (against original() where the file has one)" beside the verdict's
    # "nothing checked its output", for a file that has an original() that was not run
    (tmp_path / "mine.py").write_text(textwrap.dedent(OWN_FILE))
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "kernel", "mine.py:launch", "--device", "cpu", "--json"],
                       capture_output=True, text=True, env=interpreted_env(), timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    rep = json.loads(r.stdout)
    said = " ".join([rep["note"] or "", rep["verdict"], *rep["notes"]])
    assert rep["check"] is None and "nothing checked its output" in said
    assert "against original()" not in said and "no timing, registers or occupancy are possible here" in rep["note"]


def test_a_numba_launcher_given_torch_tensors_by_the_guess_says_which_arrays_it_got(tmp_path):
    # a file that imports torch beside numba gets torch tensors for its --input arrays; its Numba launcher's `x.size`
    # (a method of a tensor) failed with "unsupported operand type(s) for +: 'builtin_function_or_method' and 'int'",
    # and nothing on the error line said that the arrays were tensors nor how to choose NumPy ones
    (tmp_path / "mixed.py").write_text("import torch  # the project's other code\n" + textwrap.dedent(OWN_FILE))
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "kernel", "mixed.py:launch", "--device", "cpu",
                        "--input", "x=float32[1000]", "--input", "y=float32[1000]"],
                       capture_output=True, text=True, env=interpreted_env(), timeout=300, cwd=tmp_path)
    line = one_error(r)
    assert "launch raised TypeError" in line and "torch" in line and "--backend numpy" in line, line
    # chosen by hand, the same launcher runs
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "kernel", "mixed.py:launch", "--device", "cpu",
                        "--input", "x=float32[1000]", "--input", "y=float32[1000]", "--backend", "numpy"],
                       capture_output=True, text=True, env=interpreted_env(), timeout=300, cwd=tmp_path)
    assert r.returncode == 0 and "axpy [numba] grid (8, 1, 1)" in r.stdout, r.stderr[-2000:]


ASKS_FOR_CUDA = """
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def add_one(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


    def launch(x):
        out = torch.empty_like(x)
        add_one[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
        torch.cuda.synchronize()  # as launchers written for a GPU do
        return out
    """


def test_a_launcher_that_asks_for_cuda_without_a_gpu_is_told_what_to_change_not_to_swap_backends(tmp_path):
    # torch.cuda.synchronize() (or device="cuda") in the launcher: "Torch not compiled with CUDA enabled", with nothing
    # said about why a GPU was asked for under the interpreters (and --backend numpy would not help a Triton launcher)
    (tmp_path / "sync.py").write_text(textwrap.dedent(ASKS_FOR_CUDA))
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "kernel", "sync.py:launch", "--device", "cpu",
                        "--input", "x=float32[100]"],
                       capture_output=True, text=True, env=interpreted_env(), timeout=300, cwd=tmp_path)
    line = one_error(r)
    assert "CUDA" in line and "--backend" not in line and "device=x.device" in line, line


def test_the_benchmark_scripts_help_says_what_they_do_in_whole_sentences():
    # `python benchmarks/kernels.py --help` said "each one's time on device-resident inputs, its" and stopped: the
    # description was the docstring's first line, cut mid-sentence
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for script, ends in (("kernels.py", "kernels.json."), ("optimize.py", ".")):
        r = subprocess.run([sys.executable, str(root / "benchmarks" / script), "--help"], capture_output=True,
                           text=True, env=interpreted_env(), timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        described = " ".join(r.stdout.split("\n\n")[1].split())  # the paragraph after the usage
        assert described.endswith(ends) and not described.endswith(("its", ",")), (script, described)


# -- the verdict of a point far past any cache's speed ---------------------------------------------------------------


def test_a_kernel_far_above_its_roof_is_not_called_cache_resident():
    """A launcher whose counted bytes its launches never move (a view handed back, bytes= too large) was placed at
    thousands of % of the copy roof with the verdict 'cache-resident data, part of the traffic stayed in L2', where
    roofline.place already says such a point moved fewer bytes than counted. The verdict now says the same."""
    from gpuspeed.kernel import verdict

    la = {"kernel": "k", "backend": "triton", "grid": [4096, 1, 1], "num_warps": 4, "threads_per_block": 128}
    facts = {"gpu": True, "launches": [la], "main": la, "sms": 132, "bound": "memory", "roof": "copy",
             "time_s": 2e-6, "occupancy_pct": 100.0, "limiter": "warps", "copy_pct": 90.0}
    rule, said, lever = verdict.judge({**facts, "pct_of_roof": 60000.0})
    assert "cache-resident" not in said and "fewer bytes" in said, said
    assert "bytes=" in lever, lever
    # a point a little above the roof (outputs L2 took in) keeps its cache explanation
    rule, said, lever = verdict.judge({**facts, "pct_of_roof": 130.0})
    assert rule == "at_roof" and "cache-resident" in said, said


def test_kernel_notes_help_prints_its_usage():
    """`python benchmarks/kernel_notes.py --help` read '--help' as a kernels.json: 'kernel_notes: --help is not a
    readable kernels.json (FileNotFoundError ...)', exit 2. It now prints what the script does and how to call it."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "kernel_notes.py"
    for flag in ("--help", "-h"):
        proc = subprocess.run([sys.executable, str(script), flag], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert "usage: python benchmarks/kernel_notes.py" in proc.stdout and "not a readable" not in proc.stderr
