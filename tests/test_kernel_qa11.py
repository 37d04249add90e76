"""`gpuspeed kernel` QA, round 11: user launchers as users write them (an autotuned kernel launched twice on
different tuning keys, ...), run under the interpreters in a fresh process (they must be on before Triton and Numba
define the kernels).
"""

import json
import os
import subprocess
import sys

import pytest
from kernel_cli_helpers import interpreted_env, kernel_cli, one_error, run_script


# --- an autotuned kernel launched on two tuning keys by one launcher

AUTOTUNED_TWICE = '''
import numpy as np
import torch
import triton
import triton.language as tl
from gpuspeed import kernel_report


def prune(configs, named_args, **kw):  # a block no longer than the array
    return [c for c in configs if c.kwargs["BLOCK"] <= named_args["n"]]


@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=2), triton.Config({"BLOCK": 16}, num_warps=1)],
                 key=["n"], prune_configs_by={"early_config_prune": prune})
@triton.jit
def scale(x, o, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o + offs, tl.load(x + offs, mask=m) * 3.0, mask=m)


def launcher(x, y):
    o, p = torch.empty_like(x), torch.empty_like(y)
    scale[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, o, x.numel())
    scale[lambda meta: (triton.cdiv(y.numel(), meta["BLOCK"]),)](y, p, y.numel())
    return o, p


rng = np.random.default_rng()
x = torch.from_numpy(rng.standard_normal(int(rng.integers(90, 120))).astype(np.float32))
y = torch.from_numpy(rng.standard_normal(int(rng.integers(17, 40))).astype(np.float32))
rep = kernel_report(launcher, x, y, device="cpu", expected=(3.0 * x.numpy(), 3.0 * y.numpy()))
assert rep.check["passed"], rep.check
print(json.dumps([{"meta": la["meta"], "grid": la["grid"], "autotune": la["autotune"]} for la in rep.launches]))
'''


def test_each_autotuned_launch_names_the_config_it_ran_with(tmp_path):
    # the report read the autotuner's last choice and last timings for every launch: the launch on the long array
    # ran BLOCK 64 (its meta and grid say so) and the report said 'autotune chose BLOCK 16' for it, and the launch on
    # the short one, whose pruning left BLOCK 16 alone, listed BLOCK 64 among the configs it tried
    pytest.importorskip("triton")
    r = run_script(tmp_path, "import json\n" + AUTOTUNED_TWICE)
    assert r.returncode == 0, r.stderr[-3000:]
    long, short = json.loads(r.stdout.strip().splitlines()[-1])
    assert long["meta"]["BLOCK"] == 64 and short["meta"]["BLOCK"] == 16
    assert long["autotune"]["chosen"]["BLOCK"] == 64 and short["autotune"]["chosen"]["BLOCK"] == 16
    assert [t["config"]["BLOCK"] for t in long["autotune"]["tried"]] == [64, 16]
    assert [t["config"]["BLOCK"] for t in short["autotune"]["tried"]] == [16]


# --- a Numba device function named where a launcher belongs

NUMBA_FILE = '''
import numpy as np
from numba import cuda


@cuda.jit(device=True)
def square(v):
    return v * v


@cuda.jit
def squares(x, o):
    i = cuda.grid(1)
    if i < x.size:
        o[i] = square(x[i])


def launcher(x):
    o = np.empty_like(x)
    squares[(x.size + 31) // 32, 32](x, o)
    return o
'''

DEVICE_FUNCTIONS = '''
import sys
from numba import cuda
from gpuspeed.errors import UserError
from gpuspeed.kernel.target import refuse_kernel
from user_numba import square

for obj in (square, square[2, 32]):
    try:
        refuse_kernel(obj, "square", "square", "name the launcher")
        print("PASSED", type(obj).__name__)
    except UserError as e:
        print("REFUSED", e)
'''


@pytest.mark.parametrize("simulated", ["1", "0"])
def test_a_device_function_is_not_told_to_be_launched(tmp_path, simulated):
    # `gpuspeed kernel file.py:square` on a @cuda.jit(device=True) function said "is a @cuda.jit kernel, not a launcher:
    # ... (square[blocks, threads](...))", advice that fails: a device function has no launch configuration
    pytest.importorskip("numba")
    (tmp_path / "user_numba.py").write_text(NUMBA_FILE)
    env = dict(interpreted_env(), NUMBA_ENABLE_CUDASIM=simulated)  # "0": numba-cuda's own dispatcher (built lazily, no GPU used)
    p = tmp_path / "check_device.py"
    p.write_text(DEVICE_FUNCTIONS)
    r = subprocess.run([sys.executable, str(p)], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    if simulated == "0" and r.returncode != 0 and "CUDA" in r.stderr and "square" not in r.stdout:
        pytest.skip(f"numba.cuda cannot be imported without the simulator here: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert lines and all(ln.startswith("REFUSED") and "device function" in ln and "[blocks, threads]" not in ln
                         for ln in lines), r.stdout
    if simulated == "1":
        error = one_error(kernel_cli(tmp_path, {}, "user_numba.py:square"))
        assert "square is a @cuda.jit(device=True) device function" in error and "[blocks" not in error


# --- a variant that writes into its argument and returns it, as its original does

IN_PLACE_RETURNING = '''
import numpy as np
import torch
import triton
import triton.language as tl


@triton.jit
def scale_in_place(x, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x + offs, tl.load(x + offs, mask=m) * 2.5, mask=m)


def original(x):
    x *= 2.5
    return x


def triton_scale(x):
    scale_in_place[(triton.cdiv(x.numel(), 32),)](x, x.numel(), BLOCK=32)
    return x


def triton_scale_twice(x):  # wrong: scales by 6.25
    triton_scale(x)
    return triton_scale(x)


triton_scale.gpuspeed_inputs = triton_scale_twice.gpuspeed_inputs = "torch"
variants = {"triton": triton_scale, "twice": triton_scale_twice}
TOLERANCE = dict(rtol=1e-6, atol=0.0)


def inputs(rng):
    return (rng.standard_normal(int(rng.integers(70, 130))).astype(np.float32),)
'''


def test_a_variant_that_writes_into_its_argument_and_returns_it_is_checked_on_one_call(tmp_path):
    # `x *= 2.5; return x` and its Triton variant: kernel_report checked the recorded (second) call's output, made
    # from an argument the warm-up call had already scaled: 'WRONG: its output differs from original()', exit 1, for
    # a right kernel. Now a launcher that wrote into its arguments is checked on a call on fresh copies of them
    pytest.importorskip("triton")
    seed = str(int.from_bytes(os.urandom(2), "little"))
    files = {"scale_file.py": IN_PLACE_RETURNING}
    r = kernel_cli(tmp_path, files, "scale_file.py:variants.triton", "--json", "--seed", seed)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["check"]["passed"] is True and d["rule"] == "no_gpu", d["check"]
    assert sum(la["count"] for la in d["launches"]) == 1  # the check's own call is not among the launches
    r = kernel_cli(tmp_path, files, "scale_file.py:variants.twice", "--json", "--seed", seed)  # a wrong one still fails
    assert r.returncode == 1, r.stderr[-2000:]
    assert json.loads(r.stdout)["check"]["passed"] is False


# --- a Numba launcher written for torch tensors (a GPU launch takes them through __cuda_array_interface__)

NUMBA_TORCH = '''
import numpy as np
import torch
from numba import cuda
from gpuspeed import kernel_report


@cuda.jit
def axpy(a, x, y, o):
    i = cuda.grid(1)
    if i < x.size:
        o[i] = a * x[i] + y[i]


def launcher(x, y):
    o = torch.empty_like(x)
    axpy[(x.shape[0] + 31) // 32, 32](1.5, x, y, o)
    return o


rng = np.random.default_rng()
n = int(rng.integers(40, 90))
x, y = (torch.from_numpy(rng.standard_normal(n)) for _ in range(2))
rep = kernel_report(launcher, x, y, device="cpu", expected=1.5 * x.numpy() + y.numpy())
print(rep.check["summary"], rep.launches[0]["grid"])
assert rep.check["passed"] and rep.launches[0]["grid"] == [(n + 31) // 32, 1, 1]
'''


def test_a_numba_launcher_of_torch_tensors_runs_under_the_simulator(tmp_path):
    # on a GPU numba-cuda takes torch CUDA tensors (their __cuda_array_interface__); the simulator took the host
    # tensors as they were, so `x.size` in the kernel was a method: "TypeError: tid=[25, 0, 0] ctaid=[0, 0, 0]: '<' not
    # supported between instances of 'int' and 'builtin_function_or_method'". Under kernel_report the simulator now
    # gets NumPy views of host tensors, written through to them
    pytest.importorskip("numba")
    r = run_script(tmp_path, NUMBA_TORCH)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "PASS" in r.stdout


# --- the occupancy calculator at its boundaries (cuda_occupancy.h's rules: registers per warp rounded up to 256 in
# 4 sub-partitions of 16384, at most 255 a thread; shared memory per block + 1 KB reserved, rounded up to 128 B)

@pytest.mark.parametrize("cc,threads,regs,smem,blocks,limiter", [
    ("9.0", 128, 64, 0, 8, "registers"),       # 2048 a warp: 8 warps per sub-partition, 32 warps, 8 blocks
    ("9.0", 128, 65, 0, 7, "registers"),       # 2080 -> 2304: 7 per sub-partition
    ("9.0", 128, 128, 0, 4, "registers"),      # 4096: 4 per sub-partition
    ("9.0", 128, 129, 0, 3, "registers"),      # 4128 -> 4352: 3 per sub-partition
    ("9.0", 128, 255, 0, 2, "registers"),      # 8160 -> 8192: 2 per sub-partition
    ("9.0", 128, 256, 0, 0, "registers"),      # past 255 a thread: cannot launch
    ("9.0", 97, 32, 0, 16, "warps"),           # 97 threads are 4 warps: 16 blocks fill 64 warps (registers tie)
    ("9.0", 33, 32, 0, 32, "warps"),           # 2 warps a block: 32 blocks, the warps, blocks and registers tie
    ("9.0", 128, 32, 232448, 1, "shared_memory"),      # exactly the 227 KB opt-in maximum
    ("9.0", 128, 32, 232449, 0, "shared_memory"),      # one byte past it
    ("9.0", 128, 32, 115712, 2, "shared_memory"),      # + 1 KB = 113 KB: exactly half of 228 KB
    ("9.0", 128, 32, 115713, 1, "shared_memory"),      # one byte more rounds up by 128 B: one block
    ("8.0", 128, 32, 166912, 1, "shared_memory"),      # A100: the 163 KB opt-in maximum
    ("8.0", 128, 32, 166913, 0, "shared_memory"),
    ("8.0", 128, 32, 82944, 2, "shared_memory"),       # + 1 KB = 82 KB: half of 164 KB
    ("8.0", 128, 32, 82945, 1, "shared_memory"),
    ("8.9", 64, 32, 0, 24, "warps"),            # RTX 4070: 24 blocks of 2 warps fill 48 warps (the block cap ties)
    ("8.9", 32, 32, 0, 24, "blocks"),           # 24 one-warp blocks: half the warps
    ("8.9", 1024, 64, 0, 1, "warps"),           # 65536 registers exactly: one block, which the warps allow too
    ("8.9", 96, 255, 0, 2, "registers"),        # 3 warps of 8192: 8 warps fit, 2 blocks, 6 of 48 warps
    ("8.9", 128, 32, 101376, 1, "shared_memory"),      # the 99 KB opt-in maximum
    ("8.9", 128, 32, 101377, 0, "shared_memory"),
    ("8.9", 128, 32, 50176, 2, "shared_memory"),       # + 1 KB = 50 KB: half of 100 KB
    ("8.9", 128, 32, 50177, 1, "shared_memory"),
    ("8.6", 64, 32, 0, 16, "blocks"),           # RTX 30xx: 16 blocks a SM, 32 of 48 warps
])
def test_occupancy_at_its_boundaries(cc, threads, regs, smem, blocks, limiter):
    from gpuspeed.kernel.occupancy import KNOWN, occupancy

    limits = KNOWN[cc]
    occ = occupancy(threads, regs, smem, limits)
    assert (occ["blocks_per_sm"], occ["limiter"]) == (blocks, limiter), occ
    assert occ["pct"] == pytest.approx(100.0 * blocks * -(-threads // 32) / limits.max_warps_per_sm)


# --- a launcher written for torch tensors, fed NumPy arrays by inputs(rng)

TORCH_LAUNCHER = '''
import torch
import triton
import triton.language as tl


@triton.jit
def twice_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=m) * 2.0, mask=m)


def twice(x):
    out = torch.empty_like(x)
    twice_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
    return out


def inputs(rng):
    return (rng.standard_normal(100),)
'''


def test_numpy_inputs_to_a_torch_launcher_point_at_gpuspeed_inputs(tmp_path):
    # the error was torch's alone ('empty_like(): ... must be Tensor, not numpy.ndarray'); the file's fix is one line
    line = one_error(kernel_cli(tmp_path, {"twice.py": TORCH_LAUNCHER}, "twice.py:twice"))
    assert "must be Tensor" in line and 'set `twice.gpuspeed_inputs = "torch"`' in line, line


def test_flops_and_bytes_given_without_a_gpu_are_said_to_wait_for_one(tmp_path):
    # --flops/--bytes were taken on the CPU and dropped without a word
    files = {"twice.py": TORCH_LAUNCHER + '\ntwice.gpuspeed_inputs = "torch"\n'}
    r = kernel_cli(tmp_path, files, "twice.py:twice", "--flops", "100", "--bytes", "1600", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    notes = json.loads(r.stdout)["notes"]
    assert any("flops/bytes given are used on a GPU run" in n for n in notes), notes
