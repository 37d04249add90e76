"""The measurement core on a real GPU (skipped without CUDA): bench modes, peak_memory, cap()."""

import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gpuspeed import bench, cap, check, device, peak_memory, poison  # noqa: E402
from gpuspeed.errors import UserError  # noqa: E402
from gpuspeed.verify import count_poisoned  # noqa: E402

pytestmark = pytest.mark.gpu
MiB = 2**20


def test_peak_memory_of_a_known_allocation_within_1_mib():
    n = 256 * MiB

    def alloc():
        x = torch.empty(n, dtype=torch.uint8, device="cuda")
        x.fill_(3)
        return int(x[0])

    rep = peak_memory(alloc)
    assert rep.device == "cuda"
    assert abs(rep.torch_peak_bytes - n) <= MiB, rep
    # NVML wins only by what the device really lost beyond torch's count (rounding), and says so
    assert n - MiB <= rep.peak_bytes <= n + 8 * MiB, rep
    assert rep.peak_source in ("torch", "nvml") and any(rep.peak_source in note.lower() for note in rep.notes)
    if rep.nvml_peak_delta_bytes is not None:  # NVML also sees the allocator's rounding and other processes
        # NVML sees what torch newly reserved from the device; a block carved from a segment torch already
        # held (after earlier tests in this process) is invisible to it, and the report says so
        assert rep.nvml_peak_delta_bytes >= rep.torch_reserved_peak_bytes - MiB
        if rep.torch_reserved_peak_bytes < n - MiB:
            assert any("reserved before the call" in note for note in rep.notes), rep.notes


def test_peak_memory_counts_cupy_pool():
    cupy = pytest.importorskip("cupy")

    def alloc():
        a = cupy.ones(64 * MiB // 4, dtype=cupy.float32)
        return float(a[0])

    rep = peak_memory(alloc)
    assert abs(rep.cupy_peak_bytes - 64 * MiB) <= MiB


def test_cap_raises_oom_past_the_budget_and_restores():
    with cap("1GiB") as c:
        assert c.enforced
        small = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
        with pytest.raises(torch.cuda.OutOfMemoryError):
            torch.empty(2 * 1024 * MiB, dtype=torch.uint8, device="cuda")
        del small
    big = torch.empty(2 * 1024 * MiB, dtype=torch.uint8, device="cuda")  # allowed again after the block
    del big


def test_cap_budget_larger_than_device_is_an_error():
    with pytest.raises(UserError):
        with cap("100TB"):
            pass


def test_bench_events_mode_on_a_matmul():
    a = torch.randn(2048, 2048, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    m = bench(torch.mm, a, a)
    m8 = bench(torch.mm, b, b)
    assert m.mode == "events" and m.n >= 10 and m.device
    assert m.rel_noise < 0.05
    assert 4 < m8.median / m.median < 12, (m.median, m8.median)  # 8x the FLOPs: the time follows the work
    if importlib.util.find_spec("pynvml"):
        assert (m.clocks.get("sm_mhz_before") or 0) > 0, m.clocks  # NVML read the GPU in use


def test_bench_graph_mode_for_tiny_functions():
    x = torch.randn(16, device="cuda")
    m = bench(torch.add, x, x)
    assert m.mode == "graph" and m.calls_per_sample >= 10
    assert m.median < 10e-6


def test_bench_graph_mode_rejects_uncapturable_function():
    x = torch.randn(16, device="cuda")
    with pytest.raises(UserError, match="capture failed"):
        bench(lambda: x.sum().item(), mode="graph")
    assert torch.randn(4, device="cuda").isfinite().all()  # the RNG survives the failed capture
    m = bench(lambda: x.sum().item())  # auto mode falls back to events with a note
    assert m.mode == "events"


def test_bench_rotation_and_cupy_and_numpy_results():
    x = torch.randn(1 << 20, device="cuda")
    seen = set()

    def sin(t):
        seen.add(t.data_ptr())  # which argument set this call got
        return torch.sin(t)

    m = bench(sin, x, rotate=4, mode="events")
    assert m.rotate == 4 and 4 <= len(seen) <= 5, len(seen)  # the calls really rotate over 4 sets
    cupy = pytest.importorskip("cupy")
    n = 1 << 26  # 512 MiB read + written, far past L2: DRAM bandwidth bounds the time from below
    c = cupy.random.standard_normal(n, dtype=cupy.float32)
    m = bench(cupy.sin, c)
    assert m.mode in ("events", "graph")
    sheet = device.datasheet_for(torch.cuda.get_device_name())
    if sheet:
        assert m.median >= 0.9 * (2 * 4 * n) / (sheet.mem_GBps * 1e9), m.median  # synchronized: not just a launch
    # CuPy's own benchmark (CUDA events on its stream) times the same kernel: the two agree
    from cupyx.profiler import benchmark as cupy_benchmark

    theirs = float(np.median(cupy_benchmark(cupy.sin, (c,), n_repeat=50, n_warmup=5).gpu_times))
    assert 0.8 < m.median / theirs < 1.25, (m.median, theirs)
    h = bench(lambda: cupy.asnumpy(cupy.sin(c)))  # a NumPy result still made on the GPU
    assert h.median > m.median  # the copy to the host is timed too


def test_check_and_poison_on_device():
    out = poison(torch.empty(1000, device="cuda"))
    assert count_poisoned(out) == 1000
    x = torch.randn(1000, device="cuda")
    out.copy_(torch.sin(x))
    assert check(out, torch.sin(x.double())).passed


def test_kernel_mode_times_the_kernel_alone():
    a = torch.randn(4096, 4096, device="cuda")
    k = bench(torch.mm, a, a, mode="kernel", min_samples=5, budget_s=5)
    e = bench(torch.mm, a, a, mode="events")
    assert k.mode == "kernel" and k.n >= 5
    assert 0.9 * e.median < k.median <= e.median * 1.01  # no launch latency, same kernel


def test_custom_flush_runs_between_samples():
    calls = []
    x = torch.randn(1 << 20, device="cuda")
    m = bench(torch.sin, x, flush=lambda: calls.append(1), max_samples=40, min_samples=20)
    assert len(calls) >= m.n  # warm-up samples flush too
    with pytest.raises(UserError):
        bench(torch.sin, x, mode="kernel", flush=lambda: None)
