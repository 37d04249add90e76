"""QA pass 18 on `gpuspeed kernel FILE.py:NAME`: what a GPU refuses and the interpreters ran (static shared arrays
over 48 KiB a block, num_warps, a tl.dot too small to compile), interpreter variables left set on a GPU machine, and
the simulator's minutes on a bundled example. The CPU cases run in one child process (a `python -m gpuspeed` costs
seconds of imports) made once for the file: the command in-process, once per case, with the interpreters on; each
test reads its cases' results. The @pytest.mark.gpu tests check the GPU's side."""

import json
import subprocess
import sys
import textwrap

import pytest
from kernel_cli_helpers import ROOT, interpreted_env, one_error

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

CASES: dict = {}  # case -> (files it needs, `gpuspeed kernel` arguments), filled beside each test


@pytest.fixture(scope="module")
def cli(tmp_path_factory) -> dict:
    """Every case of CASES run as `gpuspeed kernel ARGV --device cpu` in one child process with the interpreters on:
    case -> a CompletedProcess-like result (returncode, stdout, stderr)."""
    here = tmp_path_factory.mktemp("kernel_qa18")
    for files, _ in CASES.values():
        for name, text in files.items():
            (here / name).write_text(textwrap.dedent(text))
    script = here / "in_one_process.py"
    script.write_text(textwrap.dedent(IN_ONE_PROCESS))
    runs = json.dumps([[*argv, "--device", "cpu"] for _, argv in CASES.values()])
    proc = subprocess.run([sys.executable, str(script), runs], capture_output=True, text=True, env=interpreted_env(),
                          timeout=600, cwd=here)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {case: subprocess.CompletedProcess(argv, d["rc"], d["stdout"], d["stderr"])
            for (case, (_, argv)), d in zip(CASES.items(), map(json.loads, proc.stdout.splitlines()), strict=True)}


SHARED = """
    import numpy as np
    from numba import cuda, float32, float64

    TILE = (64, 128)


    # every array is written, then read by another thread after a barrier, so that no compiler can drop it (a tile
    # each thread only reads back its own element of was optimized away on a GPU, and 64 KiB of it ran)
    @cuda.jit(device=True)
    def stage(x, j):
        buf = cuda.shared.array(10240, float32)  # 40 KiB, declared in a device function
        buf[cuda.threadIdx.x] = x[j]
        cuda.syncthreads()
        return buf[(cuda.threadIdx.x + 1) % cuda.blockDim.x]


    @cuda.jit
    def big_tile(x, out):
        tile = cuda.shared.array(TILE, float64)  # 64 KiB
        i = cuda.grid(1)
        tile[0, cuda.threadIdx.x] = x[min(i, x.size - 1)]
        cuda.syncthreads()
        if i < x.size:
            out[i] = tile[0, (cuda.threadIdx.x + 1) % cuda.blockDim.x]


    @cuda.jit
    def through_device(x, out):
        mine = cuda.shared.array(4096, float32)  # 16 KiB: 56 KiB with stage's
        i = cuda.grid(1)
        mine[cuda.threadIdx.x] = stage(x, min(i, x.size - 1))
        cuda.syncthreads()
        if i < x.size:
            out[i] = mine[(cuda.threadIdx.x + 1) % cuda.blockDim.x]


    @cuda.jit
    def with_dynamic(x, out):
        fixed = cuda.shared.array(8192, float32)  # 32 KiB
        extra = cuda.shared.array(0, float32)
        i = cuda.grid(1)
        fixed[cuda.threadIdx.x] = x[min(i, x.size - 1)]
        extra[cuda.threadIdx.x] = x[min(i, x.size - 1)]
        cuda.syncthreads()
        if i < x.size:
            k = (cuda.threadIdx.x + 1) % cuda.blockDim.x
            out[i] = fixed[k] + extra[k] - x[i]


    @cuda.jit
    def at_limit(x, out):
        full = cuda.shared.array(6144, float64)  # 48 KiB exactly: a GPU takes it
        i = cuda.grid(1)
        full[cuda.threadIdx.x] = x[min(i, x.size - 1)]
        cuda.syncthreads()
        if i < x.size:
            out[i] = full[(cuda.threadIdx.x + 1) % cuda.blockDim.x]


    def _run(kernel, x, shared=0):
        out = np.empty_like(x)
        kernel[(x.size + 31) // 32, 32, 0, shared](x, out)
        return out


    def launch_big(x):
        return _run(big_tile, x)


    def launch_device(x):
        return _run(through_device, x)


    def launch_dynamic(x):
        return _run(with_dynamic, x, 20000)  # 52768 B with its 32 KiB of static arrays


    def launch_dynamic_fits(x):
        return _run(with_dynamic, x, 16384)  # 48 KiB in all


    def launch_at_limit(x):
        return _run(at_limit, x)
    """


X40 = ("--input", "x=float32[40]")
CASES.update({f"shared {name}": ({"shared.py": SHARED}, (f"shared.py:{name}", *X40)) for name in (
    "launch_big", "launch_device", "launch_dynamic", "launch_dynamic_fits", "launch_at_limit")})


def test_shared_memory_a_gpu_refuses_is_refused_under_the_simulator(cli):
    # a 64 KiB static shared tile ran under the simulator and was called fine, where ptxas refuses more than 48 KiB of
    # static shared memory a block ('uses too much shared data'); with dynamic shared memory past 48 KiB in all, the
    # GPU refuses the launch
    big, device, dynamic, fits, at_limit = (cli[f"shared {name}"] for name in (
        "launch_big", "launch_device", "launch_dynamic", "launch_dynamic_fits", "launch_at_limit"))
    line = one_error(big)
    assert "big_tile" in line and "tile: float64[64, 128] = 65536 B" in line and "49152 B" in line, line
    assert "ptxas" in line and "launch_big raised" not in line, line
    line = one_error(device)  # the device function's array counts toward the kernel's
    assert "57344 B" in line and "buf: float32[10240] = 40960 B at stage line" in line and "mine:" in line, line
    line = one_error(dynamic)
    assert "20000 B of dynamic shared memory" in line and "52768 B" in line and "CUDA_ERROR_INVALID_VALUE" in line, line
    for r in (fits, at_limit):  # 48 KiB in all: a GPU runs it
        assert r.returncode == 0 and "[numba] grid (2, 1, 1) block (32, 1, 1)" in r.stdout, r.stderr[-2000:]


def _on_gpu(tmp_path, files: dict, target: str, *extra, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m gpuspeed kernel target ...` on the GPU: compiled kernels, the interpreter variables as `env` says
    (none by default)."""
    import os

    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    base = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "NUMBA_ENABLE_CUDASIM")}
    base["PYTHONPATH"] = os.pathsep.join(q for q in [str(ROOT / "src"), base.get("PYTHONPATH")] if q)
    return subprocess.run([sys.executable, "-m", "gpuspeed", "kernel", target, *extra], capture_output=True,
                          text=True, env=base | (env or {}), timeout=600, cwd=tmp_path)


@pytest.mark.gpu
def test_on_a_gpu_the_shared_memory_the_simulator_now_refuses_fails(tmp_path):
    # what the simulator's refusals stand in for: a 64 KiB static tile fails to compile, 52768 B in all fails to launch;
    # 48 KiB in all runs. (Run first on an H100 with tiles each thread read back only its own element of: the compiler
    # dropped them and all five ran; the arrays are now read across threads.) The static tiles are refused in one
    # line of ours before ptxas (test_kernel_qa19); the dynamic launch fails as the GPU says, printed
    files = {"shared.py": SHARED}
    for target in ("shared.py:launch_big", "shared.py:launch_device", "shared.py:launch_dynamic"):
        r = _on_gpu(tmp_path, files, target, *X40)
        print(target, r.returncode, r.stderr.strip().splitlines()[-1:])
        assert r.returncode != 0 and "[numba] grid" not in r.stdout, (target, r.stdout[-1000:])
        if target != "shared.py:launch_dynamic":
            assert r.returncode == 2 and "ptxas refuses to compile it" in r.stderr, (target, r.stderr[-2000:])
            assert "Traceback" not in r.stderr, r.stderr[-2000:]
    for target in ("shared.py:launch_dynamic_fits", "shared.py:launch_at_limit"):
        r = _on_gpu(tmp_path, files, target, *X40)
        assert r.returncode == 0, r.stderr[-2000:]


def test_interpreter_variables_left_set_on_a_gpu_machine_are_refused():
    # TRITON_INTERPRET=1 left set from a CPU session: on a GPU machine the command timed the interpreted kernels and
    # reported those times as the GPU's. The decision, made before anything is imported (the GPU side is tested below)
    from gpuspeed.kernel.target import interpreters_left_on

    line = interpreters_left_on({"TRITON_INTERPRET": "1", "PATH": "/bin"}, cuda=True)
    assert line.startswith("TRITON_INTERPRET=1 is set: on this GPU") and "--device cpu" in line, line
    assert "env -u TRITON_INTERPRET" in line and "NUMBA" not in line, line
    line = interpreters_left_on({"TRITON_INTERPRET": "true", "NUMBA_ENABLE_CUDASIM": "1"}, cuda=True)
    assert "TRITON_INTERPRET=true and NUMBA_ENABLE_CUDASIM=1 are set" in line and "unset them" in line, line
    assert interpreters_left_on({"NUMBA_ENABLE_CUDASIM": "1"}, cuda=True).startswith("NUMBA_ENABLE_CUDASIM=1 is set")
    # switched off, or no GPU (where the command sets them itself): nothing to refuse
    assert interpreters_left_on({"TRITON_INTERPRET": "0", "NUMBA_ENABLE_CUDASIM": ""}, cuda=True) is None
    assert interpreters_left_on({"TRITON_INTERPRET": "1", "NUMBA_ENABLE_CUDASIM": "1"}, cuda=False) is None


TRITON_DOUBLE = """
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
        double[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)
        return out
    """


@pytest.mark.gpu
def test_on_a_gpu_interpreter_variables_left_set_are_refused(tmp_path):
    # the command: one line, exit 2, before the file is imported; --device cpu still runs the kernels interpreted
    files, x = {"double.py": TRITON_DOUBLE}, ("--input", "x=float32[1000]")
    line = one_error(_on_gpu(tmp_path, files, "double.py:launch", *x, env={"TRITON_INTERPRET": "1"}))
    assert "TRITON_INTERPRET=1 is set" in line and "--device cpu" in line, line
    r = _on_gpu(tmp_path, files, "double.py:launch", *x, "--device", "cpu", env={"TRITON_INTERPRET": "1"})
    assert r.returncode == 0 and "(interpreted, no GPU)" in r.stdout, r.stderr[-2000:]
    # kernel_report in Python, its kernels defined under the interpreter: refused, not timed as the GPU's
    (tmp_path / "lib.py").write_text(textwrap.dedent("""
        import torch
        from double import launch
        from gpuspeed import UserError
        from gpuspeed.kernel import kernel_report
        try:
            kernel_report(launch, torch.ones(1000, device="cuda"), device="cuda")
        except UserError as exc:
            print("refused:", exc)
        """))
    import os

    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(tmp_path)]))
    r = subprocess.run([sys.executable, str(tmp_path / "lib.py")], capture_output=True, text=True, env=env,
                       timeout=600, cwd=tmp_path)
    assert "refused: launch: double ran interpreted on a GPU run" in r.stdout, (r.stdout, r.stderr[-2000:])


CASES["row_stats triton"] = ({}, ("row_stats:variants.triton", "--json"))


def test_a_bundled_examples_kernels_are_checked_on_tiny_odd_inputs_without_a_gpu(cli):
    # `gpuspeed kernel row_stats:variants.numba_cuda` ran the simulator on inputs(rng, scale=0.1), 1638 rows of 2048:
    # over 5 minutes a call (each Numba thread a Python thread); the bundled kernels now get the interpreters' tiny
    # scale (benchmarks/kernels.py's), where row_stats makes 19 rows of 333 (no 8-row block or 128-column unrolled
    # step divides them): 14 s for the Numba kernel here. Its Triton kernel, on the same inputs, shows the note (cheaply)
    r = cli["row_stats triton"]
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["check"]["passed"] and "57 elements" in doc["check"]["summary"], doc["check"]
    notes = "\n".join(doc["notes"])
    assert "inputs(rng, scale=0.002), tiny" in notes and "float64[19, 333], float64[333]" in notes, notes
    # heat_stencil's Numba kernel took 84 s on 40 steps of a 91 x 91 grid there: 7 steps of 45 x 45 now, 13 s
    import numpy as np

    from gpuspeed.examples import heat_stencil
    from gpuspeed.examples.hand_kernels import INTERPRETED_SCALE

    grid, _, steps = heat_stencil.inputs(np.random.default_rng(0), scale=INTERPRETED_SCALE)
    assert grid.shape == (45, 45) and steps == 7


TRITON_WARPS = TRITON_DOUBLE + """

    def launch_with(x, num_warps):
        out = torch.empty_like(x)
        double[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), BLOCK=128, num_warps=num_warps)
        return out


    def warps3(x):
        return launch_with(x, 3)


    def warps64(x):
        return launch_with(x, 64)


    def warps32(x):
        return launch_with(x, 32)
    """


CASES.update({f"warps {n}": ({"warps.py": TRITON_WARPS}, (f"warps.py:warps{n}", "--input", "x=float32[1000]"))
              for n in (3, 64, 32)})


def test_triton_num_warps_a_gpu_refuses_is_refused_under_the_interpreter(cli):
    # num_warps=3 (Triton's compiler asserts a power of 2) and num_warps=64 (2048 threads a block) ran under the
    # interpreter, which ignores num_warps, and were called fine: "num_warps=64 ... the launcher runs and returns"
    three, sixty_four, thirty_two = cli["warps 3"], cli["warps 64"], cli["warps 32"]
    line = one_error(three)
    assert "double: launched with num_warps=3" in line and "power of 2" in line, line
    line = one_error(sixty_four)
    assert "num_warps=64, a block of 2048 threads" in line and "1024" in line, line
    assert thirty_two.returncode == 0 and "num_warps=32" in thirty_two.stdout, thirty_two.stderr[-2000:]


@pytest.mark.gpu
def test_on_a_gpu_the_num_warps_the_interpreter_now_refuses_fail(tmp_path):
    files, x = {"warps.py": TRITON_WARPS}, ("--input", "x=float32[1000]")
    for target in ("warps.py:warps3", "warps.py:warps64"):
        one_error(_on_gpu(tmp_path, files, target, *x))
    r = _on_gpu(tmp_path, files, "warps.py:warps32", *x)
    assert r.returncode == 0, r.stderr[-2000:]


TRITON_DOT = """
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def mm(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            rk = k + tl.arange(0, BK)
            a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            b = tl.load(b_ptr + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc += tl.dot(a, b)
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


    def _mm(a, b, bk):
        (M, K), N = a.shape, b.shape[1]
        c = torch.empty((M, N), dtype=torch.float32, device=a.device)
        mm[(triton.cdiv(M, 16), triton.cdiv(N, 16))](a, b, c, M, N, K, BM=16, BN=16, BK=bk)
        return c


    def k8(a, b):
        return _mm(a, b, 8)


    def k16(a, b):
        return _mm(a, b, 16)
    """


HALF = ("--input", "a=float16[20,24]", "--input", "b=float16[24,20]")
CASES.update({"dot k8": ({"dot.py": TRITON_DOT}, ("dot.py:k8", *HALF)),
              "dot k16": ({"dot.py": TRITON_DOT}, ("dot.py:k16", *HALF)),
              "dot k8 float32": ({"dot.py": TRITON_DOT}, ("dot.py:k8", "--input", "a=float32[20,24]", "--input",
                                                          "b=float32[24,20]"))})


def test_a_tl_dot_smaller_than_a_gpu_compiles_is_refused_under_the_interpreter(cli):
    # a float16 tl.dot with a K block of 8 ran under the interpreter (its minimum dot is 1 x 1 x 1) and was called fine,
    # where a GPU's Triton compiler refuses K under 16 for 16-bit operands ("Input shapes should have ... K >= 16")
    small, fits, single = cli["dot k8"], cli["dot k16"], cli["dot k8 float32"]
    line = one_error(small)
    assert "mm: a tl.dot of fp16 [16, 8] x [8, 16]" in line and "K >= 16" in line, line
    for r in (fits, single):  # K 16 for float16, K 8 for float32: a GPU compiles both
        assert r.returncode == 0 and "mm [triton] grid (2, 2, 1)" in r.stdout, r.stderr[-2000:]


@pytest.mark.gpu
def test_on_a_gpu_the_tl_dot_the_interpreter_now_refuses_fails(tmp_path):
    files = {"dot.py": TRITON_DOT}
    one_error(_on_gpu(tmp_path, files, "dot.py:k8", *HALF))
    r = _on_gpu(tmp_path, files, "dot.py:k16", *HALF)
    assert r.returncode == 0, r.stderr[-2000:]


NUMBA_SHUFFLE = """
    import numpy as np
    from numba import cuda


    @cuda.jit
    def warp_sum(x, out):
        i = cuda.grid(1)
        v = x[i] if i < x.size else 0.0
        for off in (16, 8, 4, 2, 1):
            v += cuda.shfl_down_sync(0xFFFFFFFF, v, off)
        if cuda.threadIdx.x % 32 == 0 and i < x.size:
            out[i // 32] = v


    def launch(x):
        out = np.zeros((x.size + 31) // 32, dtype=x.dtype)
        warp_sum[(x.size + 63) // 64, 64](x, out)
        return out
    """
CASES["shuffle"] = ({"shuffle.py": NUMBA_SHUFFLE}, ("shuffle.py:launch", "--input", "x=float32[100]"))


def test_a_gpu_intrinsic_the_simulator_lacks_is_named_as_such(cli):
    # a warp shuffle under the simulator ended in "'FakeCUDAModule' object has no attribute 'shfl_down_sync' (without a
    # GPU ... it must not ask for CUDA itself: make its arrays where its arguments are, ... torch.cuda.synchronize()":
    # advice about the user's own CUDA calls, for an intrinsic that every GPU has and the simulator lacks
    line = one_error(cli["shuffle"])
    assert "has no cuda.shfl_down_sync, which a GPU has" in line and "check this kernel on a GPU" in line, line
    assert "must not ask for CUDA" not in line, line


NUMBA_ARGUMENT_SHAPES = """
    import numpy as np
    from numba import cuda, float32


    @cuda.jit
    def scratch_by_arg(x, out, n):
        buf = cuda.shared.array(n, float32)
        i = cuda.grid(1)
        if i < x.size:
            buf[cuda.threadIdx.x] = x[i]
            out[i] = buf[cuda.threadIdx.x]


    @cuda.jit
    def local_by_shape(x, out):
        tmp = cuda.local.array(x.shape[0], float32)
        i = cuda.grid(1)
        if i < x.size:
            tmp[0] = x[i]
            out[i] = tmp[0]


    def shared(x):
        out = np.empty_like(x)
        scratch_by_arg[(x.size + 31) // 32, 32](x, out, 32)
        return out


    def local(x):
        out = np.empty_like(x)
        local_by_shape[(x.size + 31) // 32, 32](x, out)
        return out
    """
CASES.update({f"argument shape {name}": ({"shapes.py": NUMBA_ARGUMENT_SHAPES}, (f"shapes.py:{name}", *X40))
              for name in ("shared", "local")})


def test_an_array_sized_by_a_kernel_argument_is_refused_under_the_simulator(cli):
    # cuda.shared.array(n, float32) with n a kernel argument (and a local array sized by x.shape[0]) ran under the
    # simulator, which allocates whatever it is given, and was called fine; Numba needs a constant there and a GPU
    # fails to compile it
    line = one_error(cli["argument shape shared"])
    assert "scratch_by_arg: cuda.shared.array(n, ...) at line 8 is sized by its argument n" in line, line
    assert "compile-time constant" in line and "cuda.shared.array(0, dtype)" in line, line
    line = one_error(cli["argument shape local"])
    assert "cuda.local.array(x.shape[0], ...) at line 17 is sized by its argument x" in line, line


@pytest.mark.gpu
def test_on_a_gpu_the_argument_sized_arrays_the_simulator_now_refuses_fail(tmp_path):
    for target in ("shapes.py:shared", "shapes.py:local"):
        one_error(_on_gpu(tmp_path, {"shapes.py": NUMBA_ARGUMENT_SHAPES}, target, *X40))


SIGNED = '''
def jit(signatures):  # stands in for numba.cuda.jit: only the decorator's text is read
    return lambda fn: fn


@jit("void(float32[:], float32[:])")
def one(x, out):
    pass


@jit(["void(float32[:], float32[:])", "void(int32[:], int32[:])"])
def listed(x, out):
    pass
'''


def test_a_signature_mismatch_says_what_a_gpu_does_for_one_signature_and_for_a_list(tmp_path, monkeypatch):
    # the message said a GPU raises "No matching definition" for every mismatch; numba-cuda checks only a kernel
    # declared with a list of signatures, and launches a kernel of one signature on the bytes as given (an H100 ran
    # float64 arrays through a float32 kernel and returned 0)
    import importlib

    import numpy as np

    from gpuspeed.kernel.numba_signature import mismatch

    (tmp_path / "signed_qa18.py").write_text(SIGNED)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("signed_qa18")
    x = np.ones(3)
    line = mismatch(mod.one, (x, x))
    assert "one: launched with (array(float64, 1d, C)" in line and "wrong results, no error" in line, line
    assert "No matching definition" not in line and "(the CUDA simulator ignores signatures)" in line, line
    line = mismatch(mod.listed, (x, x), simulated=False)
    assert "No matching definition" in line and "wrong results" not in line and "simulator" not in line, line
    assert mismatch(mod.listed, (x.astype(np.int32), x.astype(np.int32))) is None
    assert mismatch(mod.one, (x.astype(np.float32), x.astype(np.float32)[::2])) is None  # a strided view converts


def test_a_kernel_of_one_signature_is_refused_only_for_other_element_types_or_dimensions(tmp_path, monkeypatch):
    # a kernel of one signature is launched unchecked, and Numba's argument preparation takes read-only and strided
    # arrays and casts scalars: only an array read as another element type or rank is wrong, on a GPU or simulated
    import importlib

    import numpy as np

    from gpuspeed.kernel.numba_signature import mismatch

    (tmp_path / "signed_qa18b.py").write_text(SIGNED)
    monkeypatch.syspath_prepend(str(tmp_path))
    one = importlib.import_module("signed_qa18b").one
    x = np.ones(8, dtype=np.float32)
    readonly = np.broadcast_to(np.float32(1), (8,))
    for simulated in (True, False):  # the simulator's check held read-only arrays to Numba's dispatch rules too
        assert mismatch(one, (readonly, x[::2]), simulated=simulated) is None
    assert "float64" in mismatch(one, (x.astype(np.float64), x), simulated=False)
    assert "2d" in mismatch(one, (x.reshape(2, 4), x), simulated=False)
    assert mismatch(one, (x,), simulated=False) is not None  # one argument short


TRITON_MATH = """
    import math

    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def expo(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m)
        tl.store(o_ptr + offs, math.exp(x), mask=m)


    def launch(x):
        o = torch.empty_like(x)
        expo[(triton.cdiv(x.numel(), 64),)](x, o, x.numel(), BLOCK=64)
        return o
    """
CASES["python math"] = ({"pymath.py": TRITON_MATH}, ("pymath.py:launch", "--input", "x=float32[100]"))


def test_pythons_math_on_a_block_names_the_line_and_the_triton_function(cli):
    # "launch raised InterpreterError: TypeError('only 0-dimensional arrays can be converted to Python scalars')" and
    # nothing else: which call, on which line, and what to use instead
    line = one_error(cli["python math"])
    assert "line 14 of expo" in line and "math.exp(x)" in line and "use tl.exp" in line, line
