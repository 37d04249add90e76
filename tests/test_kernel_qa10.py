"""`gpuspeed kernel` QA, round 10: a kernel handed to kernel_report() itself rather than a launcher, and the limits
table read by the names users see (sm_90a, compute_90a, 9.0a).

The interpreted checks run in a fresh process: the interpreters must be on before Triton and Numba define kernels.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuspeed.kernel.occupancy import KNOWN, known_limits

ROOT = Path(__file__).resolve().parents[1]


def _interpreted(tmp_path, body: str) -> subprocess.CompletedProcess:
    p = tmp_path / "user_script.py"
    p.write_text(textwrap.dedent(body))
    env = dict(os.environ, TRITON_INTERPRET="1", NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = os.pathsep.join(q for q in [str(ROOT / "src"), env.get("PYTHONPATH")] if q)
    return subprocess.run([sys.executable, str(p)], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)


TRITON_KERNELS = '''
import numpy as np
import torch
import triton
import triton.language as tl
from gpuspeed import kernel_report
from gpuspeed.errors import UserError


@triton.jit
def add_k(x, y, o, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["n"])
@triton.jit
def add_auto(x, y, o, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


rng = np.random.default_rng()
n = 1000 + int(rng.integers(1, 23))  # not a multiple of any block
x, y = (torch.from_numpy(rng.standard_normal(n).astype(np.float32)) for _ in range(2))
o = torch.empty_like(x)
for kern, kw in ((add_k, {"BLOCK": 128}), (add_auto, {})):
    try:
        kernel_report(kern, x, y, o, n, kwargs=kw, device="cpu")
        print("RAN", kern)
    except UserError as e:
        print("USERERROR", e)
    except Exception as e:
        print("RAW", type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip() else "")
# with its grid, it is a launcher: it runs, and what it wrote is x + y
rep = kernel_report(add_k[(triton.cdiv(n, 128),)], x, y, o, n, kwargs={"BLOCK": 128}, device="cpu")
assert rep.backend == "triton" and rep.launches[0]["grid"] == [triton.cdiv(n, 128), 1, 1], rep.launches
assert torch.equal(o, x + y)
print("GRID OK")
'''


def test_kernel_report_refuses_a_triton_kernel_in_one_line(tmp_path):
    # kernel_report(add_k, ...) with a @triton.jit kernel (not its launcher) ended in the interpreter's
    # InterpreterError "add_k() missing 1 required positional argument: 'BLOCK'" (or, given BLOCK, a call outside a
    # kernel), an autotuned one in "TypeError: 'Autotuner' object is not callable": the CLI said what was wrong,
    # the library did not
    pytest.importorskip("triton")
    r = _interpreted(tmp_path, TRITON_KERNELS)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("USERERROR", "RAW", "RAN"))]
    assert len(lines) == 2 and all(ln.startswith("USERERROR") for ln in lines), r.stdout
    assert "add_k is a @triton.jit kernel, not a launcher" in lines[0] and "add_k[grid]" in lines[0]
    assert "add_auto is a @triton.jit kernel, not a launcher" in lines[1]
    assert "GRID OK" in r.stdout


NUMBA_KERNELS = '''
import numpy as np
from numba import cuda
from gpuspeed import kernel_report
from gpuspeed.errors import UserError


@cuda.jit
def axpy(a, x, y, o):
    i = cuda.grid(1)
    if i < x.shape[0]:
        o[i] = a * x[i] + y[i]


rng = np.random.default_rng()
n = 200 + int(rng.integers(1, 27))
x, y = rng.standard_normal(n), rng.standard_normal(n)
o = np.empty_like(x)
try:
    kernel_report(axpy, 2.0, x, y, o, device="cpu")
    print("RAN")
except UserError as e:
    print("USERERROR", e)
except Exception as e:
    print("RAW", type(e).__name__, str(e).strip().splitlines()[0])
rep = kernel_report(axpy[(n + 63) // 64, 64], 2.0, x, y, o, device="cpu")  # configured: a launcher
assert rep.backend == "numba" and rep.launches[0]["block"] == [64, 1, 1], rep.launches
np.testing.assert_allclose(o, 2.0 * x + y, rtol=1e-12)
print("CONFIGURED OK")
'''


def test_kernel_report_refuses_a_numba_kernel_without_its_launch_configuration(tmp_path):
    # kernel_report(axpy, ...) with an unconfigured @cuda.jit kernel raised Numba's multi-line ValueError
    # "Kernel launch configuration was not specified..."
    pytest.importorskip("numba")
    r = _interpreted(tmp_path, NUMBA_KERNELS)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "USERERROR" in r.stdout and "axpy is a @cuda.jit kernel, not a launcher" in r.stdout, r.stdout
    assert "axpy[blocks, threads]" in r.stdout and "CONFIGURED OK" in r.stdout, r.stdout


@pytest.mark.parametrize("name, cc", [("sm_90a", "9.0"), ("sm_100a", "10.0"), ("sm_120a", "12.0"),
                                      ("compute_90a", "9.0"), ("9.0a", "9.0"), ("SM_89", "8.9"), (" sm_86 ", "8.6"),
                                      ("sm_100f", "10.0"), ("90a", "9.0"), ((9, 0), "9.0"), ("(9, 0)", "9.0"),
                                      ("sm_103", "10.3"), ("sm_121a", "12.1")])
def test_known_limits_reads_the_arch_names_users_see(name, cc):
    # Triton and nvcc name Hopper's target sm_90a (Blackwell's sm_100a / sm_100f): known_limits('sm_90a') was None,
    # as were 'compute_90a', '9.0a', 'SM_89' and ' sm_86 '
    got = known_limits(name)
    assert got is not None and got.cc == cc, (name, got)


def test_b300_and_gb10_share_their_family_limits():
    # sm_103 (B300) and sm_121 (DGX Spark's GB10) were missing: device_limits() took sm_90's table for them
    for cc, like in (("10.3", "10.0"), ("12.1", "12.0")):
        a, b = KNOWN[cc].to_dict(), KNOWN[like].to_dict()
        assert {k: v for k, v in a.items() if k not in ("cc", "sms")} == \
               {k: v for k, v in b.items() if k not in ("cc", "sms")}


@pytest.mark.parametrize("name", ["sm_9", "sm_", "", "banana", "sm_999", "9.x", (9,)])
def test_known_limits_is_none_for_names_it_cannot_read(name):
    assert known_limits(name) is None


GPUSPEED_INPUTS_LAUNCHER = '''
import numpy as np
import triton
import triton.language as tl


@triton.jit
def twice_k(x, o, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o + offs, tl.load(x + offs, mask=m) * 2, mask=m)


def twice(x):
    import torch

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"twice wants a torch tensor (gpuspeed_inputs = 'torch'), got {type(x).__name__}")
    o = torch.empty_like(x)
    twice_k[(triton.cdiv(x.numel(), 128),)](x, o, x.numel(), BLOCK=128)
    return o


twice.gpuspeed_inputs = "torch"
'''


def _cli(tmp_path, source, target, *extra):
    f = tmp_path / "user_launchers.py"
    f.write_text(source)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(q for q in [str(ROOT / "src"), env.get("PYTHONPATH")] if q)
    return subprocess.run([sys.executable, "-m", "gpuspeed", "kernel", f"{f}:{target}", "--device", "cpu", *extra],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def test_input_arrays_follow_the_launchers_gpuspeed_inputs(tmp_path):
    # --input with --backend auto read the array library from the file's imports (numpy here) and ignored the
    # launcher's own gpuspeed_inputs = "torch", which inputs(rng) honours: the launcher got NumPy arrays (a bundled
    # hand kernel then moved them to the GPU inside every timed call), and the note named hand_kernels/__init__.py
    # for a bundled variant
    pytest.importorskip("triton")
    r = _cli(tmp_path, GPUSPEED_INPUTS_LAUNCHER, "twice", "--input", "x=float32[1001]", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["backend"] == "triton" and doc["launches"][0]["grid"] == [8, 1, 1]
    assert any("inputs as torch arrays" in n and "gpuspeed_inputs" in n for n in doc["notes"]), doc["notes"]
    # --backend still chooses
    r = _cli(tmp_path, GPUSPEED_INPUTS_LAUNCHER, "twice", "--input", "x=float32[1001]", "--backend", "numpy")
    assert r.returncode == 2 and "twice wants a torch tensor" in r.stderr, r.stderr[-2000:]


def test_a_bundled_variants_input_arrays_are_the_torch_tensors_it_asks_for(tmp_path):
    pytest.importorskip("triton")
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "kernel", "src/gpuspeed/examples/histogram.py:variants.triton",
                        "--input", "samples=float64[1001]", "--input", "bins=int:64", "--input", "lo=float:-1",
                        "--input", "hi=float:1", "--device", "cpu", "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    assert r.returncode == 0, r.stderr[-2000:]
    notes = json.loads(r.stdout)["notes"]
    assert any("inputs as torch arrays" in n for n in notes) and not any("imports none" in n for n in notes), notes


NUMPY_TO_TRITON = '''
import numpy as np
import triton
import triton.language as tl


@triton.jit
def copy_k(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)


def copy(x):
    o = np.empty_like(x)
    copy_k[(triton.cdiv(x.size, 128),)](x, o, x.size, BLOCK=128)
    return o


def copy_kw(x):
    o = np.empty_like(x)
    copy_k[(triton.cdiv(x.size, 128),)](x, dst=o, n=x.size, BLOCK=128)
    return o
'''


@pytest.mark.parametrize("target, arg", [("copy", "src"), ("copy_kw", "src")])
def test_numpy_arrays_handed_to_an_interpreted_triton_kernel_are_named(tmp_path, target, arg):
    # a launcher handing NumPy arrays to a Triton kernel ended in the interpreter's
    # "InterpreterError: AttributeError(\"'numpy.ndarray' object has no attribute 'type'\")"
    pytest.importorskip("triton")
    r = _cli(tmp_path, NUMPY_TO_TRITON, target, "--input", "x=float32[300]")
    assert r.returncode == 2, r.stderr[-2000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("gpuspeed: error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"copy_k: argument {arg} is a NumPy array" in errors[0] and "torch.from_numpy" in errors[0], errors[0]


LAMBDA_NAME = '''
import numpy as np
import torch
import triton
import triton.language as tl
from gpuspeed import kernel_report


@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["n"])
@triton.jit
def half_k(x, o, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o + offs, tl.load(x + offs, mask=m) * 0.5, mask=m)


x = torch.from_numpy(np.random.default_rng().standard_normal(777).astype(np.float16))
o = torch.empty_like(x)
rep = kernel_report(half_k[lambda meta: (triton.cdiv(777, meta["BLOCK"]),)], x, o, 777, device="cpu")
print("NAME", rep.name, rep.lines()[0])
assert torch.equal(o, x * 0.5)
'''


def test_a_kernel_with_its_grid_is_named_after_the_kernel(tmp_path):
    # kernel_report(half_k[grid], ...) reported '<lambda>: triton kernel launcher' (triton's __getitem__ returns a lambda)
    pytest.importorskip("triton")
    r = _interpreted(tmp_path, LAMBDA_NAME)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "NAME half_k[grid] half_k[grid]: triton kernel launcher" in r.stdout, r.stdout
