"""kernel_report on the GPU, against kernels whose resources are known: a Numba kernel with a 1024-float shared
array (4096 bytes static) and one with 2048 bytes of dynamic shared memory, a Triton tl.dot kernel (shared
memory > 0), an autotuned Triton stream kernel (configs timed, placed on the copy roof), a grid smaller than
the SMs (the small_grid verdict), and `gpuspeed kernel` end to end. Each launch's occupancy is checked
against the CUDA driver's own answer (cuOccupancyMaxActiveBlocksPerMultiprocessor). Odd sizes throughout;
outputs poisoned and compared in float64.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = triton.language

from gpuspeed import check, kernel_report, poison  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _common(d: dict) -> None:
    """What every launch of a compiled kernel must show on a GPU."""
    assert d["gpu"] is True and d["note"] is None and d["time_s"] > 0 and d["limits"]["cc"]
    for la in d["launches"]:
        assert la["registers"] > 0 and la["spills"] >= 0 and not la["interpreted"]
        occ = la["occupancy"]
        assert 0 < occ["pct"] <= 100 and occ["blocks_per_sm"] >= 1
        if occ["driver_blocks_per_sm"] is not None:  # the formula against the driver
            assert occ["blocks_per_sm"] == occ["driver_blocks_per_sm"], la
    json.dumps(d)


@triton.autotune(configs=[triton.Config({"BLOCK": 1024}, num_warps=4), triton.Config({"BLOCK": 4096}, num_warps=8),
                          triton.Config({"BLOCK": 2048}, num_warps=4, num_stages=2)], key=["n"])
@triton.jit
def axpy_kernel(x, y, o, a, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o + offs, a * tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


def axpy(x, y):
    o = poison(torch.empty_like(x))
    axpy_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, y, o, 2.5, x.numel())
    return o


def test_triton_autotuned_stream_on_the_copy_roof():
    n = (1 << 25) + 3
    x, y = (torch.randn(n, device="cuda") for _ in range(2))
    rep = kernel_report(axpy, x, y)
    assert check(rep.output, 2.5 * x.double() + y.double()).passed
    d = rep.to_dict()
    _common(d)
    (la,) = d["launches"]
    at = la["autotune"]
    assert len(at["tried"]) == 3 and all(t["time_ms"] > 0 for t in at["tried"])
    assert at["chosen"]["BLOCK"] in (1024, 2048, 4096) and at["chosen"]["num_warps"] == la["num_warps"]
    assert la["grid"] == [triton.cdiv(n, at["chosen"]["BLOCK"]), 1, 1]
    assert la["shared_static"] == 0 and la["block"] is None
    # no loop in axpy: the whole kernel's PTX, its global loads and stores and its float32 FMA
    mix = la["instruction_mix"]
    assert mix["scope"] == "whole kernel (no loop)" and mix["kinds"]["global memory"] >= 3 and mix["kinds"]["fp32"] >= 1
    p = d["placement"]
    assert p["bound"] == "memory" and p["roof"] == "copy" and p["bytes"] == 3 * 4 * n
    # this GPU's committed roofline.json where there is one (the H200's), else measured now (an H100 here has none)
    from pathlib import Path

    from gpuspeed import device

    committed = (Path(__file__).resolve().parents[1] / "results" / device.get_device("cuda").slug / "roofline.json")
    want = "roofline.json" if committed.is_file() else "measured now (quick)"
    assert 0 < d["pct_of_roof"] < 130 and d["ceilings_source"].endswith(want), (d["ceilings_source"], want)
    # 400 MB in one launch: a device copy of those bytes is near the copy roof, and the kernel near the copy
    assert 60 < d["copy_pct_of_roof"] < 130 and d["pct_of_roof"] > 0.5 * d["copy_pct_of_roof"]
    assert any("device copies of the same bytes" in line for line in rep.lines())
    assert d["verdict"] and d["next_lever"]
    print("\n".join(rep.lines()))


@triton.jit
def matmul_kernel(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pm, pn = tl.program_id(0), tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ka = k0 + rk
        ta = tl.load(a + rm[:, None] * K + ka[None, :], mask=(rm[:, None] < M) & (ka[None, :] < K), other=0.0)
        tb = tl.load(b + ka[:, None] * N + rn[None, :], mask=(ka[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(ta, tb)
    tl.store(c + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a, b):
    M, K = a.shape
    N = b.shape[1]
    c = poison(torch.empty(M, N, device=a.device, dtype=torch.float32))
    matmul_kernel[(triton.cdiv(M, 64), triton.cdiv(N, 64))](a, b, c, M, N, K, BM=64, BN=64, BK=32,
                                                            num_warps=4, num_stages=3)
    return c


def test_triton_dot_uses_shared_memory():
    a = torch.randn(1000, 296, device="cuda", dtype=torch.float16)
    b = torch.randn(296, 520, device="cuda", dtype=torch.float16)
    rep = kernel_report(matmul, a, b, flops=2 * 1000 * 520 * 296)
    # fp16 inputs are exact, products exact in fp32; only the fp32 accumulation order differs from float64
    assert check(rep.output, a.double() @ b.double(), rtol=1e-4).passed
    d = rep.to_dict()
    _common(d)
    (la,) = d["launches"]
    assert la["grid"] == [16, 9, 1] and la["num_warps"] == 4 and la["num_stages"] == 3
    assert la["shared_dynamic"] > 0 and la["threads_per_block"] == 128
    assert d["placement"]["flops_source"] == "given" and d["placement"]["intensity"] > 0


@triton.jit
def copy_kernel(x, o, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(o + offs, tl.load(x + offs, mask=offs < n), mask=offs < n)


def small_copy(x):
    o = poison(torch.empty_like(x))
    copy_kernel[(40,)](x, o, x.numel(), BLOCK=1024)
    return o


def test_small_grid_verdict():
    x = torch.randn(40 * 1024 - 5, device="cuda")
    rep = kernel_report(small_copy, x)
    assert check(rep.output, x.double()).passed
    d = rep.to_dict()
    _common(d)
    sms = d["limits"]["sms"]
    assert sms > 40 and d["rule"] == "small_grid"
    assert d["verdict"] == f"grid of 40 programs on {sms} SMs: split the work"


def _numba():
    pytest.importorskip("numba")
    from numba import cuda

    if not cuda.is_available():
        pytest.skip("numba.cuda sees no GPU")
    return cuda


def test_numba_static_and_dynamic_shared_memory():
    cuda = _numba()
    from numba import float32

    @cuda.jit
    def block_reverse(x, o):
        tile = cuda.shared.array((1024,), float32)  # 4096 bytes, static
        t = cuda.threadIdx.x
        i = cuda.blockIdx.x * 1024 + t
        tile[t] = x[i] if i < x.size else 0.0
        cuda.syncthreads()
        j = cuda.blockIdx.x * 1024 + 1023 - t
        if j < x.size:
            o[j] = tile[t]

    @cuda.jit
    def scaled(x, o):
        buf = cuda.shared.array(0, float32)  # dynamic: sized by the launch
        t = cuda.threadIdx.x
        i = cuda.grid(1)
        buf[t] = x[i] if i < x.size else 0.0
        cuda.syncthreads()
        if i < x.size:
            o[i] = 3.0 * buf[t]

    def launcher(x):
        o = poison(torch.empty_like(x))
        block_reverse[triton.cdiv(x.numel(), 1024), 1024](x, o)
        o2 = poison(torch.empty_like(x))
        scaled[triton.cdiv(x.numel(), 512), 512, 0, 2048](x, o2)
        cuda.synchronize()
        return o, o2

    n = 100_003
    x = torch.randn(n, device="cuda")
    rep = kernel_report(launcher, x)
    o, o2 = rep.output
    ref = torch.zeros(triton.cdiv(n, 1024) * 1024, dtype=torch.float64, device="cuda")
    ref[:n] = x.double()
    ref = ref.view(-1, 1024).flip(1).reshape(-1)
    # each block of 1024 reversed; the last block reads zeros past n, so its first 1024 - n % 1024 outputs are zeros
    assert check(o, ref[:n]).passed
    assert check(o2, 3.0 * x.double()).passed
    d = rep.to_dict()
    _common(d)
    rev, sc = d["launches"]
    assert rev["kernel"] == "block_reverse" and rev["shared_static"] == 4096 and rev["shared_dynamic"] == 0
    assert rev["block"] == [1024, 1, 1] and rev["grid"] == [triton.cdiv(n, 1024), 1, 1] and rev["num_warps"] is None
    assert sc["shared_dynamic"] == 2048 and sc["block"] == [512, 1, 1]
    assert d["backend"] == "numba"
    # Numba's PTX too (inspect_asm): a shared-memory store and load and a barrier in each
    for la in (rev, sc):
        kinds = la["instruction_mix"]["kinds"]
        assert kinds["shared memory"] >= 2 and kinds["barrier"] >= 1


def test_cli_on_the_gpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "NUMBA_ENABLE_CUDASIM")}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "kernel", "tests/test_kernel_report.py:add_launcher",
                        "--json", "--out", str(tmp_path)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(r.stdout)
    _common(d)
    assert [la["kernel"] for la in d["launches"]] == ["add_kernel", "rowsum_kernel"]
    doc = json.loads((tmp_path / "kernel_report.json").read_text())
    assert doc["summary"]["gpu"] is True and doc["summary"]["time_s"] > 0
    assert np.isfinite(doc["summary"]["occupancy_pct"])


def test_cli_checks_a_bundled_examples_variant_on_the_gpu():
    # the example's lazy variant itself runs here (on the GPU), on float32 inputs cast before they move, and its
    # output is checked against the example's float64 original() under its TOLERANCE
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "NUMBA_ENABLE_CUDASIM")}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "kernel",
                        "src/gpuspeed/examples/row_normalize_loop.py:variants.triton_fp32", "--json"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(r.stdout)
    _common(d)
    assert d["check"]["passed"] and d["check"]["against"] == "row_normalize_loop.py's original()", d["check"]
    assert d["launches"][0]["kernel"] == "normalize_rows_f32_kernel" and d["placement"]["bound"] == "memory"
    assert any("cast to float32" in n for n in d["notes"])
    assert not any("runs under the interpreters" in n for n in d["notes"])


def test_cli_counts_a_stencils_bytes_per_step():
    # 40 launches of a step between ping-pong grids: each moves its two grids, 40 x the inputs and outputs; the
    # default count must say so instead of holding 2.7 GB of traffic to 67 MB
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "NUMBA_ENABLE_CUDASIM")}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "kernel", "src/gpuspeed/examples/heat_stencil.py:variants.triton",
                        "--json"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(r.stdout)
    grid = 2048 * 2048 * 8
    assert d["placement"]["bytes"] == 40 * 2 * grid + 40 * 8  # two grids and alpha a step
    assert d["placement"]["bytes_source"] == "each of its 40 launches moving its array arguments once"
    assert d["check"]["passed"] and d["pct_of_roof"] > 50


def test_triton_static_shared_memory_from_inline_ptx():
    # the bundled Triton histogram declares its counts in inline PTX (4 copies x 256 bins x 4 B, static): Triton's
    # metadata.shared does not hold them, the driver's function attribute does, and the occupancy counts them
    from gpuspeed.examples.hand_kernels import histogram as H

    x = torch.randn(1_000_003, device="cuda", dtype=torch.float64)
    rep = kernel_report(H.histogram_triton, x, 256, -4.0, 4.0)
    ref = np.histogram(x.cpu().numpy(), bins=256, range=(-4.0, 4.0))[0]
    assert np.array_equal(rep.output.cpu().numpy(), ref)
    d = rep.to_dict()
    _common(d)
    (la,) = d["launches"]
    assert la["kernel"] == "histogram_kernel" and la["shared_static"] == 4096 and la["shared_dynamic"] == 0
    assert la["instruction_mix"]["kinds"].get("shared atomic", 0) >= 1
