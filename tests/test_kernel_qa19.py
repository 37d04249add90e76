"""QA round 19, kernel: refusals made on the GPU path (real Numba dispatcher, not the simulator), checked on the CPU
where they come before anything needs a driver."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

STATIC = """
    import numpy as np
    from numba import cuda, float32
    from gpuspeed.kernel.capture import Capture, EmptyLaunch

    TILE = 16384  # 64 KiB of float32: over the 48 KiB a block may hold

    @cuda.jit(device=True)
    def helper(x, i):
        t = cuda.shared.array(8192, float32)  # 32 KiB, beside the kernel's 32 KiB below
        t[i] = x[i]
        cuda.syncthreads()
        return t[(i + 1) % 32]

    @cuda.jit
    def big(x):
        tile = cuda.shared.array(TILE, float32)
        i = cuda.threadIdx.x
        tile[i] = x[i]
        cuda.syncthreads()
        x[i] = tile[(i + 1) % 32]

    @cuda.jit
    def through_device(x):
        t = cuda.shared.array(8192, float32)
        i = cuda.threadIdx.x
        t[i] = helper(x, i)
        cuda.syncthreads()
        x[i] = t[(i + 3) % 32]

    @cuda.jit
    def fits(x):
        tile = cuda.shared.array(1024, float32)
        i = cuda.threadIdx.x
        tile[i] = x[i]
        cuda.syncthreads()
        x[i] = tile[(i + 1) % 32]

    x = np.random.default_rng().standard_normal(32).astype(np.float32)
    for k in (big, through_device, fits):
        try:
            with Capture():
                k[1, 32](x)
            print(k.py_func.__name__, "ran")
        except EmptyLaunch as e:
            print(k.py_func.__name__, "refused:", e)
        except Exception as e:  # no driver here: the compile went on past the check
            print(k.py_func.__name__, "compiled on:", type(e).__name__)
"""


def test_on_the_gpu_path_static_shared_arrays_over_48_kib_are_refused_before_ptxas(tmp_path):
    # on a GPU the kernel command passed ptxas's own failure through (many lines) where the simulator said one line
    pytest.importorskip("numba.cuda")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    (tmp_path / "static.py").write_text(textwrap.dedent(STATIC))
    done = subprocess.run([sys.executable, "-W", "ignore", str(tmp_path / "static.py")], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    said = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert said["big"].startswith("refused: big: its static shared arrays take 65536 B a block (tile: float32[16384]"), said
    assert "ptxas refuses to compile it" in said["big"] and "simulator" not in said["big"], said
    assert said["through_device"].startswith("refused: through_device: its static shared arrays take 65536 B"), said
    assert said["fits"] in ("ran", "compiled on: CudaSupportError"), said


# --- the simulator's blocks held to a GPU's: barriers every thread reaches, shared memory free of races. The cases
# run as `gpuspeed kernel` in-process, one child process for them all (a `python -m gpuspeed` costs seconds of imports)

BLOCKS = """
    import numpy as np
    from numba import cuda, float32, int32

    @cuda.jit
    def reduce_racy(x, out):
        sh = cuda.shared.array(64, float32)
        t = cuda.threadIdx.x
        sh[t] = x[t]
        cuda.syncthreads()
        s = 32
        while s > 0:
            if t < s:
                sh[t] += sh[t + s]  # RACY: no barrier between one step's writes and the next step's reads
            s //= 2
        if t == 0:
            out[0] = sh[0]

    @cuda.jit
    def reduce_diverging(x, out):
        sh = cuda.shared.array(64, float32)
        t = cuda.threadIdx.x
        sh[t] = x[t]
        cuda.syncthreads()
        s = 32
        while s > 0:
            if t < s:
                sh[t] += sh[t + s]
                cuda.syncthreads()  # DIVERGING: only threads t < s reach it
            s //= 2
        if t == 0:
            out[0] = sh[0]

    @cuda.jit
    def reduce_right(x, out):
        sh = cuda.shared.array(64, float32)
        t = cuda.threadIdx.x
        sh[t] = x[t]
        cuda.syncthreads()
        s = 32
        while s > 0:
            if t < s:
                sh[t] += sh[t + s]
            cuda.syncthreads()
            s //= 2
        if t == 0:
            out[0] = sh[0]

    @cuda.jit
    def reversed_early_return(x, out):
        sh = cuda.shared.array(64, float32)
        t = cuda.threadIdx.x
        i = cuda.grid(1)
        if i >= x.size:
            return
        sh[t] = x[i]
        cuda.syncthreads()  # EARLY: the last block's threads past the end returned before it
        out[i] = sh[63 - t]

    @cuda.jit
    def counted(x, out):
        h = cuda.shared.array(8, int32)
        t = cuda.threadIdx.x
        if t < 8:
            h[t] = 0
        cuda.syncthreads()
        cuda.atomic.add(h, int32(abs(x[t]) * 100.0) % 8, 1)  # atomics on one element: no race
        cuda.syncthreads()
        if t < 8:
            out[t] = h[t]

    @cuda.jit
    def counted_and_cleared(x, out):
        h = cuda.shared.array(8, int32)
        t = cuda.threadIdx.x
        if t < 8:
            h[t] = 0
        cuda.syncthreads()
        cuda.atomic.add(h, int32(abs(x[t]) * 100.0) % 8, 1)
        if t == 0:
            h[0] = 0  # MIXED: a plain write among the other threads' atomics
        cuda.syncthreads()
        if t < 8:
            out[t] = h[t]

    @cuda.jit
    def halves(x, out):
        both = cuda.shared.array(0, float32)  # dynamic: two views of one buffer
        t = cuda.threadIdx.x
        lo, hi = both[0:64], both[64:128]
        lo[t] = x[t]
        hi[t] = 2 * x[t]
        cuda.syncthreads()
        out[t] = lo[63 - t] + hi[63 - t]

    @cuda.jit
    def rotated(x, out):
        sh = cuda.shared.array(64, float32)
        t, b = cuda.threadIdx.x, cuda.blockIdx.x
        sh[(t + b) % 64] = x[t]  # each block's threads write its elements in another order
        cuda.syncthreads()
        if t == 0:
            out[b] = sh[0]

    @cuda.jit
    def any_negative(x, out):
        found = cuda.shared.array(1, int32)
        t = cuda.threadIdx.x
        if t == 0:
            found[0] = 0
        cuda.syncthreads()
        if x[t] < 0:
            found[0] = 1  # every thread that finds one stores the same 1: no race
        cuda.syncthreads()
        if t == 0:
            out[0] = found[0]

    @cuda.jit
    def last_wins(x, out):
        who = cuda.shared.array(1, int32)
        t = cuda.threadIdx.x
        who[0] = t  # WHO: which thread's store lands depends on the order
        cuda.syncthreads()
        if t == 0:
            out[0] = who[0]

    @cuda.jit
    def total_racy(x, out):
        i = cuda.grid(1)
        out[0] += x[i]  # TOTAL: every thread reads and writes out[0]

    @cuda.jit
    def total_atomic(x, out):
        cuda.atomic.add(out, 0, x[cuda.grid(1)])

    @cuda.jit
    def a_block_each(x, out):
        out[0] += x[cuda.blockIdx.x]  # BLOCKS: one thread a block, every block on out[0]

    @cuda.jit
    def smooth_in_place(x):
        i = cuda.grid(1)
        if 0 < i < x.size - 1:
            x[i] = (x[i - 1] + x[i] + x[i + 1]) / 3  # SMOOTH: reads its neighbours' elements as they write them

    @cuda.jit
    def double_in_place(x):
        i = cuda.grid(1)
        x[i] = 2 * x[i]

    def one_block(kernel, x):
        out = np.zeros(64, np.float32)
        kernel[1, 64](x, out)
        return out

    def launch_racy(x):
        return one_block(reduce_racy, x)

    def launch_diverging(x):
        return one_block(reduce_diverging, x)

    def launch_right(x):
        return one_block(reduce_right, x)

    def launch_early_return(x):
        out = np.zeros(x.shape[0], np.float32)
        reversed_early_return[2, 64](x, out)
        return out

    def launch_counted(x):
        return one_block(counted, x)

    def launch_counted_and_cleared(x):
        return one_block(counted_and_cleared, x)

    def launch_rotated(x):
        out = np.zeros(4, np.float32)
        rotated[4, 64](x, out)
        return out

    def launch_flag(x):
        return one_block(any_negative, x)

    def launch_who(x):
        return one_block(last_wins, x)

    def launch_total_racy(x):
        out = np.zeros(1, np.float32)
        total_racy[2, 32](x, out)
        return out

    def launch_total_atomic(x):
        out = np.zeros(1, np.float32)
        total_atomic[2, 32](x, out)
        return out

    def launch_a_block_each(x):
        out = np.zeros(1, np.float32)
        a_block_each[64, 1](x, out)
        return out

    def launch_smooth(x):
        smooth_in_place[2, 32](x)
        return x

    def launch_double(x):
        double_in_place[2, 32](x)
        return x

    def launch_halves(x):
        out = np.zeros(64, np.float32)
        halves[1, 64, 0, 128 * 4](x, out)
        return out
    """

BLOCK_CASES = ("racy", "diverging", "right", "early_return", "counted", "counted_and_cleared", "halves", "rotated", "flag",
               "who", "total_racy", "total_atomic", "a_block_each", "smooth", "double")

# a workload whose Numba variant counts into dynamic shared memory it never zeroed: the simulator's buffer starts as
# zeros (the answer was right), a GPU's holds what the last kernel left there
UNZEROED = """
    import numpy as np
    from numba import cuda, int32

    @cuda.jit
    def count_unzeroed(x, out):
        h = cuda.shared.array(0, int32)
        t = cuda.threadIdx.x
        cuda.atomic.add(h, x[t], 1)
        cuda.syncthreads()
        if t < 8:
            out[t] = h[t]

    def launch(x):
        out = np.zeros(8, np.int32)
        count_unzeroed[1, 64, 0, 8 * 4](x, out)
        return out

    def original(x):
        return np.bincount(x, minlength=8).astype(np.int32)

    def inputs(rng, scale=1.0):
        return (rng.integers(0, 8, 64).astype(np.int32),)

    variants = {"numba": launch}
    """

# a workload whose Numba variant sums into a local array it never zeroed: np.empty's memory (often zeros) or a GPU's
UNZEROED_LOCAL = """
    import numpy as np
    from numba import cuda, float64

    @cuda.jit
    def row_sums_unzeroed(x, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            acc = cuda.local.array(2, float64)
            for j in range(x.shape[1]):
                acc[j % 2] += x[i, j]
            out[i] = acc[0] + acc[1]

    def launch(x):
        out = np.zeros(x.shape[0], np.float64)
        row_sums_unzeroed[1, 32](x, out)
        return out

    def original(x):
        return x.sum(axis=1)

    def inputs(rng, scale=1.0):
        return (rng.standard_normal((32, 6)),)

    variants = {"numba": launch}
    """


def _line(marker: str) -> int:
    """The line of BLOCKS, as written to its file, that holds `marker`."""
    return next(n for n, text in enumerate(textwrap.dedent(BLOCKS).splitlines(), 1) if marker in text)


@pytest.fixture(scope="module")
def blocks(tmp_path_factory) -> dict:
    """Each BLOCK_CASES launcher run as `gpuspeed kernel blocks.py:launch_<case> --device cpu` in one child process
    under the simulator: case -> a CompletedProcess-like result."""
    from kernel_cli_helpers import kernel_cli_runs

    here = tmp_path_factory.mktemp("kernel_qa19_blocks")
    (here / "blocks.py").write_text(textwrap.dedent(BLOCKS))
    (here / "unzeroed.py").write_text(textwrap.dedent(UNZEROED))
    (here / "unzeroed_local.py").write_text(textwrap.dedent(UNZEROED_LOCAL))
    x = ("--input", "x=float32[64]")
    runs = [[f"blocks.py:launch_{case}", *(("--input", "x=float32[100]") if case == "early_return" else x),
             "--device", "cpu"] for case in BLOCK_CASES] + [
        ["unzeroed.py:variants.numba", "--device", "cpu"], ["unzeroed_local.py:variants.numba", "--device", "cpu"]]
    return dict(zip((*BLOCK_CASES, "unzeroed", "unzeroed_local"), kernel_cli_runs(here, runs), strict=True))


def test_a_barrier_only_some_threads_of_a_block_reach_is_refused_under_the_simulator(blocks):
    # the simulator let the waiting threads through once the others had finished, and the command said the kernel
    # ran, where on a GPU a cuda.syncthreads() inside `if t < s:` (or after some threads returned) is undefined
    from kernel_cli_helpers import one_error

    line = one_error(blocks["diverging"])
    assert f"reduce_diverging: cuda.syncthreads() at line {_line('# DIVERGING')} is reached by only some" in line, line
    assert "returned without reaching it" in line and "undefined" in line, line
    line = one_error(blocks["early_return"])
    assert f"reversed_early_return: cuda.syncthreads() at line {_line('# EARLY')} " in line, line
    assert "threads 36, 37, 38 and 25 more returned without reaching it" in line, line


def test_a_data_race_on_shared_memory_is_refused_under_the_simulator(blocks):
    # a reduction missing its barrier between steps: the simulator's order of threads gave the right sum, a GPU's
    # does not; a plain write among other threads' atomics on one element is a race too
    from kernel_cli_helpers import one_error

    line = one_error(blocks["racy"])
    assert line.startswith("gpuspeed: error: reduce_racy: a data race on shared array sh: thread "), line
    assert f"at line {_line('# RACY')} and " in line and "no cuda.syncthreads() between them" in line, line
    line = one_error(blocks["counted_and_cleared"])
    assert "counted_and_cleared: a data race on shared array h: " in line, line
    assert f"line {_line('# MIXED')}" in line and "atomically" in line, line
    line = one_error(blocks["who"])  # stores of different values
    assert "last_wins: a data race on shared array who: thread " in line and f"line {_line('# WHO')}" in line, line


def test_correct_barriers_atomics_and_shared_views_still_run_under_the_simulator(blocks):
    for case in ("right", "counted", "halves", "flag"):  # flag: threads storing one value, a GPU's idiom
        r = blocks[case]
        assert r.returncode == 0 and "[numba] grid (1, 1, 1) block (64, 1, 1)" in r.stdout, (case, r.stderr[-2000:])
    # a launch's shared arrays outlive its blocks: one block's accesses are no race with the next block's
    r = blocks["rotated"]
    assert r.returncode == 0 and "[numba] grid (4, 1, 1) block (64, 1, 1)" in r.stdout, r.stderr[-2000:]


def test_shared_memory_a_block_never_wrote_holds_garbage_under_the_simulator(blocks):
    # the simulator's dynamic shared memory started as zeros, so counting into it unzeroed gave the right histogram
    # and the check passed, where a GPU's block finds whatever was there: it now starts as 0xFF bytes (-1, NaN)
    r = blocks["unzeroed"]
    assert r.returncode == 1 and "verdict: WRONG" in r.stdout, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])


def test_a_local_array_never_written_holds_garbage_under_the_simulator(blocks):
    # np.empty gave the simulator's local arrays whatever NumPy's allocator held (zeros at times: the sum passed);
    # a GPU thread's local memory holds garbage: the simulated one now starts as 0xFF bytes, every time
    r = blocks["unzeroed_local"]
    assert r.returncode == 1 and "verdict: WRONG" in r.stdout and "32 NaN" in r.stdout, (r.stdout[-2000:], r.stderr)


def test_a_data_race_on_an_array_argument_is_refused_under_the_simulator(blocks):
    # `out[0] += x[i]` from every thread ran one thread at a time in the simulator and summed right; on a GPU the
    # threads' reads and writes interleave and most of the sum is lost. So for one block a thread, and an in-place
    # stencil reading its neighbours' elements as they are written
    from kernel_cli_helpers import one_error

    line = one_error(blocks["total_racy"])
    assert "total_racy: a data race on out: thread " in line and f"out[0] at line {_line('# TOTAL')}" in line, line
    assert "cuda.atomic.add" in line, line
    line = one_error(blocks["a_block_each"])
    assert "a_block_each: a data race on out: " in line and "of another block" in line, line
    assert f"line {_line('# BLOCKS')}" in line, line
    line = one_error(blocks["smooth"])
    assert "smooth_in_place: a data race on x: " in line and f"line {_line('# SMOOTH')}" in line, line
    for case in ("total_atomic", "double"):  # atomics; each thread on its own element
        r = blocks[case]
        assert r.returncode == 0 and "[numba] grid (2, 1, 1) block (32, 1, 1)" in r.stdout, (case, r.stderr[-2000:])
