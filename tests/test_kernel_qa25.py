"""QA pass 25 on `gpuspeed kernel`: what one launch covers (kernel/chunks.covered) when a Triton kernel's BLOCK
constexprs are not all tile sizes (a tiled matmul's BLOCK_K is the step of its K loop), and the launches of a 2-D
grid; the rest of the kernel report's CPU paths as a user meets them."""

import types

import pytest
from kernel_cli_helpers import run_script

CHUNKED_MATMUL = """
    import torch
    import triton
    import triton.language as tl

    from gpuspeed.kernel.capture import Capture
    from gpuspeed.kernel.report import call_bytes


    @triton.jit
    def mm_kernel(a, b, c, row0, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        rm = row0 + tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(a + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            y = tl.load(b + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc += tl.dot(x, y)
        tl.store(c + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


    def chunked(a, b):  # C = A @ B, 64 rows of C a launch: each launch handed all of A, B and C and its first row
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty(M, N)
        for r in range(0, M, 64):
            mm_kernel[(2, triton.cdiv(N, 32))](a, b, c, r, M, N, K, BLOCK_M=32, BLOCK_N=32, BLOCK_K=16)
        return c


    a, b = torch.randn(256, 64), torch.randn(64, 64)
    with Capture() as cap:
        chunked(a, b)
    nbytes, how = call_bytes(None, 4 * (256 * 64 + 64 * 64 + 256 * 64), cap.launches)
    print(nbytes)
    print(how)
    """


def test_a_chunked_tiled_matmul_counts_its_buffers_once(tmp_path):
    # 4 launches over 64-row chunks of C = A @ B (A 256x64, B 64x64, C 256x64 float32: 147456 bytes in all). Every
    # BLOCK constexpr was taken as coverage, so each launch was credited 2 x 2 programs x 32 x 32 x BLOCK_K 16 =
    # 65536 elements, all of the largest buffer (16384) and more: the chunks read as 4 sweeps and the buffers were
    # counted 4 times (589824 bytes, a % of roof 4x too high) without a word. BLOCK_K is the step of the K loop.
    pytest.importorskip("triton")
    r = run_script(tmp_path, CHUNKED_MATMUL)
    assert r.returncode == 0, r.stderr[-2000:]
    nbytes, how = r.stdout.splitlines()[-2:]
    assert int(nbytes) == 147456, r.stdout
    assert "4 launches of mm_kernel cover" in how, how


def _tutorial_matmul(a, b, c, M, N, K, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M):
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):  # noqa: B007 - the loop of Triton's matmul tutorial
        pass


def _attention(q, out, N_CTX, BLOCK_M, BLOCK_N, BLOCK_ROWS):
    for start_n in range(0, (BLOCK_M + 1) * N_CTX, BLOCK_N):  # noqa: B007
        pass
    for r in range(BLOCK_ROWS):  # noqa: B007 - a program covering BLOCK_ROWS rows, one an iteration
        pass
    for k in range(N_CTX // BLOCK_M):  # noqa: B007
        pass


tl = types.SimpleNamespace(cdiv=lambda a, b: -(-a // b))  # triton.language's name for it, in the sources above


def test_loop_steps_are_what_a_range_steps_by_or_divides_by():
    # a constexpr a loop steps by is not part of a program's coverage; one a loop counts up to (a program's rows) is
    from gpuspeed.kernel.chunks import loop_steps

    assert loop_steps(_tutorial_matmul) >= {"BLOCK_SIZE_K"}
    assert not loop_steps(_tutorial_matmul) & {"BLOCK_SIZE_M", "BLOCK_SIZE_N"}
    found = loop_steps(_attention)
    assert {"BLOCK_N", "BLOCK_M"} <= found and "BLOCK_ROWS" not in found, found
    assert loop_steps(len) == frozenset()  # no Python source: nothing known


@pytest.mark.parametrize("given", [{"bytes": -5}, {"bytes": 0}, {"bytes": 1.5}, {"bytes": float("inf")},
                                   {"bytes": True}, {"flops": float("nan")}, {"flops": -1.0}, {"flops": "1e9"},
                                   {"unit": "fp33"}])
def test_kernel_report_refuses_a_bad_flops_or_bytes_before_it_launches(given):
    # the CLI refused --bytes -5 or --flops nan; kernel_report took them: without a GPU a note said they would be
    # used on a GPU run, and there bytes=-5 (or 0) read "no array bytes found: pass bytes=", bytes=1.5 became 1 and
    # flops=nan failed in locate() after the whole timing
    import numpy as np

    from gpuspeed import kernel_report
    from gpuspeed.errors import UserError

    calls = []
    with pytest.raises(UserError, match="flops|bytes|unit"):
        kernel_report(lambda x: calls.append(x), np.ones(4, np.float32), device="cpu", **given)
    assert not calls, "the launcher ran before its arguments were checked"


def test_kernel_report_takes_a_numpy_byte_count_and_zero_flops():
    # what place() takes: a NumPy integer of bytes, flops=0 (a copy's)
    import numpy as np

    from gpuspeed import kernel_report

    rep = kernel_report(lambda x: x, np.ones(4, np.float32), device="cpu", bytes=np.int64(32), flops=0)
    assert rep.rule == "no_launch", rep.rule


def test_kernel_report_refuses_a_byte_count_too_large_for_a_float_in_one_line():
    from gpuspeed import kernel_report
    from gpuspeed.errors import UserError

    with pytest.raises(UserError, match="bytes"):
        kernel_report(lambda: None, device="cpu", bytes=10**400)


GATHER = """
    import numpy as np
    from numba import cuda


    @cuda.jit
    def gather(x, idx, out):
        i = cuda.grid(1)
        if i < idx.size:
            out[i] = x[idx[i]]


    def launch(x, idx):
        out = np.empty(idx.size, np.float32)
        gather[(idx.size + 31) // 32, 32](x, idx, out)
        return out
    """


def test_a_number_given_where_an_array_belongs_beside_an_array_is_not_blamed_on_the_array_library(tmp_path):
    # --input x=float32[100] --input idx=int:3: "'int' object has no attribute 'size' (its --input arrays were numpy
    # arrays ...: --backend torch for torch tensors)"; torch tensors fail the same way: the number is the mistake
    from kernel_cli_helpers import kernel_cli, one_error

    line = one_error(kernel_cli(tmp_path, {"gather.py": GATHER}, "gather.py:launch", "--input", "x=float32[100]",
                                "--input", "idx=int:3"))
    assert "'int' object" in line and "--backend" not in line, line
    assert "NAME=DTYPE[SHAPE]" in line, line


# PTX of a tl.dot's loop as Triton emits it: sm_80's mma.sync (D, A, B, C types) and sm_90's wgmma (D, A, B)
MMA_SM80 = """
$L__BB0_2:
    ld.global.v4.b32 {%r1, %r2, %r3, %r4}, [%rd1];
    mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1, %f2}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f1, %f2};
    add.s32 %r7, %r7, 32;
    setp.lt.s32 %p1, %r7, %r8;
    @%p1 bra $L__BB0_2;
"""
WGMMA_SM90_TF32 = """
$L__BB0_3:
    wgmma.fence.sync.aligned;
    wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%f1, %f2}, %rd5, %rd6, p, 1, 1;
    wgmma.commit_group.sync.aligned;
    @%p2 bra $L__BB0_3;
"""
FMA_ONLY = """
$L__BB0_1:
    fma.rn.f32 %f1, %f2, %f3, %f1;
    @%p1 bra $L__BB0_1;
"""


def test_a_tensor_core_kernel_given_flops_is_held_to_its_tensor_core_roof():
    # a Triton matmul given --flops was held to the fp32 FMA roof (default_unit: no FlopCounterMode count, so fp32
    # for any non-fp64 data): a bf16 tl.dot at 600 TFLOP/s read "at 900 % of the fp32 roof: done". Its PTX's mma /
    # wgmma instructions name the unit it runs on.
    import numpy as np

    from gpuspeed.kernel.report import compute_unit

    x = np.ones(4, np.float32)
    assert compute_unit(None, [MMA_SM80], (x,), counted=False)[0] == "bf16"
    assert compute_unit(None, [WGMMA_SM90_TF32], (x,), counted=False)[0] == "tf32"
    assert compute_unit(None, [FMA_ONLY], (x,), counted=False) == ("fp32", None)  # no tensor core: as before
    assert compute_unit(None, [None], (x.astype(np.float64),), counted=False) == ("fp64", None)
    assert compute_unit("fp16", [MMA_SM80], (x,), counted=False) == ("fp16", None)  # the caller's word stands
    unit, said = compute_unit(None, [FMA_ONLY, MMA_SM80], (x,), counted=False)
    assert unit == "bf16" and "bf16" in said and "mma" in said, said


@pytest.mark.gpu
def test_a_triton_fp16_matmul_given_flops_is_placed_against_the_fp16_roof(tmp_path):
    # needs a GPU: the compiled PTX of a tl.dot on fp16 data holds mma/wgmma .f16 instructions
    r = run_script(tmp_path, """
        import os
        os.environ.pop("TRITON_INTERPRET", None)
        os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
        import torch
        import triton
        import triton.language as tl
        from gpuspeed import kernel_report


        @triton.jit
        def mm(a, b, c, N: tl.constexpr, BLOCK: tl.constexpr):
            rm = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            rn = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
            acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
            for k0 in range(0, N, 64):
                rk = k0 + tl.arange(0, 64)
                acc += tl.dot(tl.load(a + rm[:, None] * N + rk[None, :]), tl.load(b + rk[:, None] * N + rn[None, :]))
            tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.float16))


        def launch(a, b):
            n = a.shape[0]
            c = torch.empty_like(a)
            mm[(n // 128, n // 128)](a, b, c, n, BLOCK=128)
            return c


        a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
        rep = kernel_report(launch, a, a.clone(), flops=2 * 2048 ** 3, device="cuda")
        print(rep.placement["compute_ceiling"])
        """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-1] == "fp16", r.stdout


NEGATIVE_GRID = """
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def add1(x, o, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(o + offs, tl.load(x + offs, mask=m) + 1, mask=m)


    def tail(x, start=200):  # the grid of what is left past `start`: negative for an input shorter than it
        o = torch.empty_like(x)
        add1[(triton.cdiv(x.numel() - start, 64),)](x, o, x.numel(), BLOCK=64)
        return o
    """


def test_a_negative_grid_is_said_to_run_nothing(tmp_path):
    # grid (-2,): no program ran (the interpreter's range(-2); a GPU's Triton launcher skips a grid whose product is
    # not positive), but the report said "the launcher runs and returns, its loads and stores inside its arrays" --
    # as if the kernel had been run and found in bounds -- and on a GPU "grid of -1 programs on 132 SMs: split the work"
    from kernel_cli_helpers import kernel_cli

    r = kernel_cli(tmp_path, {"neg.py": NEGATIVE_GRID}, "neg.py:tail", "--input", "x=float32[40]")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "grid (-2, 1, 1)" in r.stdout and "never ran" in r.stdout, r.stdout


def test_the_verdict_on_a_gpu_calls_a_negative_grid_empty_not_small():
    from gpuspeed.kernel import verdict

    la = {"kernel": "add1", "backend": "triton", "grid": [-1, 1, 1], "threads_per_block": 128, "count": 1}
    rule, said, _ = verdict.judge({"gpu": True, "launches": [la], "main": la, "sms": 132, "time_s": 5e-6})
    assert rule == "empty", (rule, said)
