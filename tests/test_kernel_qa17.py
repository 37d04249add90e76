"""QA pass 17 on `gpuspeed kernel FILE.py:NAME` without a GPU: a demanding user's own launchers, names and inputs,
run under the interpreters (TRITON_INTERPRET=1 / NUMBA_ENABLE_CUDASIM=1); the @pytest.mark.gpu tests check on a
GPU what the interpreter-side fixes stand in for."""

import pytest
from kernel_cli_helpers import kernel_cli, one_error

TRITON_ADD = """
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs) + tl.load(y_ptr + offs))  # no mask: reads past a short tail


    def launch(x, y):
        out = torch.empty_like(x)
        add_kernel[(triton.cdiv(x.numel(), 128),)](x, y, out, x.numel(), BLOCK=128)
        return out
    """


def test_an_empty_grid_under_the_interpreter_is_not_called_checked(tmp_path):
    # an empty input made a grid of 0 programs: the interpreter ran no program, yet the verdict said "the launcher runs
    # and returns, its loads and stores inside its arrays" of a kernel whose unmasked loads were never looked at
    r = kernel_cli(tmp_path, {"add.py": TRITON_ADD}, "add.py:launch", "--input", "x=float32[0]",
                   "--input", "y=float32[0]")
    assert r.returncode == 0, r.stderr[-2000:]
    verdict = next(ln for ln in r.stdout.splitlines() if ln.startswith("verdict:"))
    assert "inside its arrays" not in verdict and "0 programs" in verdict, r.stdout
    assert "no timing or occupancy here" in verdict, verdict


def test_a_missing_name_says_which_names_there_are(tmp_path):
    # `row_stats:variants.numba` said only "row_stats has no 'variants.numba'": the entry is variants.numba_cuda
    r = kernel_cli(tmp_path, {}, "row_stats:variants.numba")
    line = one_error(r)
    assert "row_stats:variants.numba_cuda" in line, line
    # a top-level name misspelt: the file's functions close to it are named
    r = kernel_cli(tmp_path, {"add.py": TRITON_ADD}, "add.py:lanch")
    line = one_error(r)
    assert "add.py has no 'lanch'" in line and "add.py:launch" in line, line


def test_a_launcher_argument_left_out_of_the_inputs_is_named_before_the_run(tmp_path):
    # `launch --input x=...` for launch(x, y) ran it and said "launch raised TypeError: launch() missing 1 required
    # positional argument: 'y' (its --input arrays were torch arrays ...: --backend numpy for NumPy arrays)": the
    # backend hint sent the user the wrong way
    r = kernel_cli(tmp_path, {"add.py": TRITON_ADD}, "add.py:launch", "--input", "x=float32[1000]")
    line = one_error(r)
    assert "launch needs y" in line and "--input y=" in line and "--backend" not in line, line
    assert "raised" not in line, line


NUMBA_SIGNED = """
    import numpy as np
    from numba import cuda


    @cuda.jit("void(float32[:], float32[:])")
    def twice(x, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = 2 * x[i]


    def launch(x):
        out = np.empty_like(x)
        twice[(x.size + 63) // 64, 64](x, out)
        return out


    def launch_on_device(x):
        d = cuda.to_device(x)
        out = cuda.device_array_like(d)
        twice[(x.size + 63) // 64, 64](d, out)
        return out.copy_to_host()
    """


def test_arrays_that_match_no_declared_numba_signature_are_refused_under_the_simulator(tmp_path):
    # @cuda.jit("void(float32[:], float32[:])") given float64 arrays: a GPU launches a kernel of one signature unchecked
    # and reads the float64 bytes as float32 (an H100 run returned 0), the simulator (which drops signatures) ran it
    # and the verdict said "the launcher runs and returns"
    files = {"signed.py": NUMBA_SIGNED}
    for name in ("launch", "launch_on_device"):
        line = one_error(kernel_cli(tmp_path, files, f"signed.py:{name}", "--input", "x=float64[100]"))
        assert "twice" in line and "float64" in line and "void(float32[:], float32[:])" in line, line
    line = one_error(kernel_cli(tmp_path, files, "signed.py:launch", "--input", "x=float32[4,25]"))
    assert "2d" in line and "float32[:]" in line, line
    r = kernel_cli(tmp_path, files, "signed.py:launch_on_device", "--input", "x=float32[100]")
    assert r.returncode == 0 and "twice [numba] grid (2, 1, 1)" in r.stdout, r.stderr[-2000:]


LIST_GRID = """
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def double(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2, mask=m)


    def launch(x):
        out = torch.empty_like(x)
        double[[triton.cdiv(x.numel(), 64)]](x, out, x.numel(), BLOCK=64)
        return out


    def launch_lambda(x):
        out = torch.empty_like(x)
        n = x.numel()
        double[lambda meta: [triton.cdiv(n, meta["BLOCK"]), 1]](x, out, n, BLOCK=128)
        return out
    """


def test_a_grid_given_as_a_list_runs_under_the_interpreter(tmp_path):
    # a GPU launch takes kernel[[blocks]] (JITFunction.run indexes the grid); the interpreter adds a tuple to it, so
    # the run ended in "launch raised TypeError: can only concatenate list (not "tuple") to list (... --backend numpy)"
    files = {"listgrid.py": LIST_GRID}
    r = kernel_cli(tmp_path, files, "listgrid.py:launch", "--input", "x=float32[1000]")
    assert r.returncode == 0 and "double [triton] grid (16, 1, 1)" in r.stdout, r.stderr[-2000:]
    r = kernel_cli(tmp_path, files, "listgrid.py:launch_lambda", "--input", "x=float32[1000]")
    assert r.returncode == 0 and "double [triton] grid (8, 1, 1)" in r.stdout, r.stderr[-2000:]


def test_bytes_take_the_notation_flops_take(tmp_path):
    # --flops 2e9 was taken and --bytes 4e9 refused ("Input should be a valid integer"); a fraction of a byte still is
    files = {"listgrid.py": LIST_GRID}
    r = kernel_cli(tmp_path, files, "listgrid.py:launch", "--input", "x=float32[1000]", "--bytes", "4e9",
                   "--flops", "2e9", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    line = one_error(kernel_cli(tmp_path, files, "listgrid.py:launch", "--input", "x=float32[1000]", "--bytes", "1.5"))
    assert "--bytes" in line and "whole number" in line, line
    line = one_error(kernel_cli(tmp_path, files, "listgrid.py:launch", "--input", "x=float32[1000]", "--bytes", "inf"))
    assert "--bytes" in line, line


IN_PLACE_WORKLOAD = """
    import numpy as np
    from numba import cuda

    TOLERANCE = dict(rtol=1e-6, atol=0)


    def inputs(rng):
        return rng.standard_normal(1001).astype(np.float32), np.zeros(1001, np.float32)


    def original(x, out):
        out[:] = x * 3


    @cuda.jit
    def triple(x, o):
        i = cuda.grid(1)
        if i < x.size:
            o[i] = x[i] * 3


    def returns(x, out):
        o = np.empty_like(x)
        triple[(x.size + 127) // 128, 128](x, o)
        return o


    variants = {"returns": returns}
    """


def test_a_variant_that_returns_what_original_writes_in_place_is_told_so(tmp_path):
    # original(x, out) writes out; the variant returned the right array and left out alone: the verdict was "WRONG:
    # ... 1001/1001 over tolerance" with no word of why, as if its arithmetic were wrong
    r = kernel_cli(tmp_path, {"wl.py": IN_PLACE_WORKLOAD}, "wl.py:variants.returns")
    assert r.returncode == 1, r.stderr[-2000:]
    verdict = next(ln for ln in r.stdout.splitlines() if ln.startswith("verdict:"))
    assert "WRONG" in verdict and "returned" in verdict and "writes its result into" in verdict, verdict


DEVICE_RESULT_WORKLOAD = """
    import numpy as np
    from numba import cuda


    def inputs(rng):
        return (rng.standard_normal(1001).astype(np.float32),)


    def original(x):
        return x * 3


    @cuda.jit
    def triple(x, o):
        i = cuda.grid(1)
        if i < x.size:
            o[i] = x[i] * 3


    def on_device(x):
        d = cuda.to_device(x)
        out = cuda.device_array_like(d)
        triple[(x.size + 127) // 128, 128](d, out)
        return out


    def writes(x, out=None):
        triple[(x.size + 127) // 128, 128](x, out if out is not None else np.empty_like(x))


    variants = {"on_device": on_device, "writes": writes}
    """


def test_a_numba_variant_returning_its_device_array_is_checked(tmp_path):
    # a Numba launcher that returns its cuda.device_array (as users keep results on the device) ended in "gpuspeed:
    # error: check() cannot compare FakeCUDAArray values" (DeviceNDArray on a GPU), exit 2, no report
    files = {"wl.py": DEVICE_RESULT_WORKLOAD}
    r = kernel_cli(tmp_path, files, "wl.py:variants.on_device")
    assert r.returncode == 0 and "check against wl.py's original(): PASS" in r.stdout, r.stderr[-2000:]
    # one that returns None where original() returns its result: the check says so
    r = kernel_cli(tmp_path, files, "wl.py:variants.writes")
    verdict = next(ln for ln in r.stdout.splitlines() if ln.startswith("verdict:"))
    assert r.returncode == 1 and "returned None" in verdict, verdict


def _on_gpu(tmp_path, files: dict, target: str, *extra):
    """`python -m gpuspeed kernel target --device cuda ...`, compiled kernels (no interpreter variables)."""
    import os
    import subprocess
    import sys
    import textwrap

    from kernel_cli_helpers import ROOT

    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "NUMBA_ENABLE_CUDASIM")}
    env["PYTHONPATH"] = os.pathsep.join(q for q in [str(ROOT / "src"), env.get("PYTHONPATH")] if q)
    return subprocess.run([sys.executable, "-m", "gpuspeed", "kernel", target, "--device", "cuda", *extra],
                          capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)


@pytest.mark.gpu
def test_on_a_gpu_a_numba_variant_returning_its_device_array_is_checked(tmp_path):
    r = _on_gpu(tmp_path, {"wl.py": DEVICE_RESULT_WORKLOAD}, "wl.py:variants.on_device")
    assert r.returncode == 0 and "check against wl.py's original(): PASS" in r.stdout, r.stderr[-2000:]


@pytest.mark.gpu
def test_on_a_gpu_numba_refuses_arrays_outside_the_declared_signature_as_the_simulator_check_says(tmp_path):
    # a kernel of one declared signature given float64 arrays: numba-cuda launched it unchecked on an H100 (the run
    # returned 0, the float64 bytes read as float32); the command now refuses it on the GPU too, before the launch
    for name in ("launch", "launch_on_device"):
        line = one_error(_on_gpu(tmp_path, {"signed.py": NUMBA_SIGNED}, f"signed.py:{name}", "--input",
                                 "x=float64[100]"))
        assert "wrong results, no error" in line and "simulator" not in line, line
    r = _on_gpu(tmp_path, {"signed.py": NUMBA_SIGNED}, "signed.py:launch", "--input", "x=float32[100]")
    assert r.returncode == 0, r.stderr[-2000:]


FORALL = """
    import numpy as np
    from numba import cuda


    @cuda.jit
    def plus_one(x, o):
        i = cuda.grid(1)
        o[i] = x[i] + 1  # no `if i < x.size`: threads past the end of the last block write past o


    def launch(x):
        o = np.empty_like(x)
        plus_one.forall(x.size, tpb=32)(x, o)
        return o
    """


def test_forall_with_threads_per_block_launches_the_blocks_a_gpu_launches(tmp_path):
    # forall(100, tpb=32) is 4 blocks of 32 threads on a GPU, 28 of them past the end; the simulator ran 100 blocks
    # of 1 thread, so a kernel with no bounds check was said to keep "its loads and stores inside its arrays"
    r = kernel_cli(tmp_path, {"fa.py": FORALL}, "fa.py:launch", "--input", "x=float32[100]")
    line = one_error(r)
    assert "out of bounds" in line, line
    r = kernel_cli(tmp_path, {"fa.py": FORALL}, "fa.py:launch", "--input", "x=float32[128]")
    assert r.returncode == 0 and "plus_one [numba] grid (4, 1, 1) block (32, 1, 1)" in r.stdout, r.stderr[-2000:]


def test_forall_of_no_tasks_is_no_launch_as_on_a_gpu(tmp_path):
    # numba's ForAll returns without launching for 0 tasks; the simulator launched 0 blocks and the command refused it
    # as "a GPU refuses a launch of no blocks ... return before launching", which a GPU never sees
    r = kernel_cli(tmp_path, {"fa.py": FORALL}, "fa.py:launch", "--input", "x=float32[0]")
    assert r.returncode == 0 and "no Triton or Numba CUDA kernel launch seen" in r.stdout, r.stderr[-2000:]


TOO_MANY_THREADS = """
    import numpy as np
    from numba import cuda


    @cuda.jit
    def plus_one(x, o):
        i = cuda.grid(1)
        if i < x.size:
            o[i] = x[i] + 1


    def launch(x):
        o = np.empty_like(x)
        plus_one[1, 2048](x, o)
        return o


    def launch_2d(x):
        o = np.empty_like(x)
        plus_one[1, (64, 32)](x, o)
        return o
    """


def test_a_numba_block_of_more_than_1024_threads_is_refused_as_a_gpu_refuses_it(tmp_path):
    # the simulator ran a block of 2048 threads (and of 64x32) and the verdict said the launcher runs and returns;
    # every NVIDIA GPU refuses a block of more than 1024 threads (CUDA_ERROR_INVALID_VALUE)
    for name in ("launch", "launch_2d"):
        line = one_error(kernel_cli(tmp_path, {"big.py": TOO_MANY_THREADS}, f"big.py:{name}", "--input", "x=float32[100]"))
        assert "2048 threads" in line and "1024" in line, line


TALL_GRID = """
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def row_copy(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(1)
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n_cols
        tl.store(out_ptr + row * n_cols + offs, tl.load(x_ptr + row * n_cols + offs, mask=m), mask=m)


    def launch(x):
        out = torch.empty_like(x)
        rows, cols = x.shape
        row_copy[(triton.cdiv(cols, 16), rows)](x, out, cols, BLOCK=16)
        return out
    """


def test_a_triton_grid_past_65535_in_y_is_refused_as_a_gpu_refuses_it(tmp_path):
    # a row a program along grid y: 70000 rows ran under the interpreter and were called fine; a GPU launch refuses a
    # grid's y or z over 65535 (CUDA_ERROR_INVALID_VALUE): rows belong on grid x
    line = one_error(kernel_cli(tmp_path, {"tall.py": TALL_GRID}, "tall.py:launch", "--input", "x=float32[70000,2]"))
    assert "65535" in line and "(1, 70000, 1)" in line, line
    r = kernel_cli(tmp_path, {"tall.py": TALL_GRID}, "tall.py:launch", "--input", "x=float32[300,2]")
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.gpu
def test_on_a_gpu_the_launches_the_interpreters_now_refuse_fail(tmp_path):
    # what the simulator's and the interpreter's refusals stand in for: the GPU's own failure, one line and exit 2
    one_error(_on_gpu(tmp_path, {"big.py": TOO_MANY_THREADS}, "big.py:launch", "--input", "x=float32[100]"))
    one_error(_on_gpu(tmp_path, {"tall.py": TALL_GRID}, "tall.py:launch", "--input", "x=float32[70000,2]"))
