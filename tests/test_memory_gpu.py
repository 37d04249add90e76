"""peak_memory() and cap() on a real GPU (skipped without CUDA): CuPy's peak in use, memory outside torch
and CuPy seen through NVML, the warm-up call, nested caps and the GPU being measured."""

import gc
import importlib.util
import time

import pytest

torch = pytest.importorskip("torch")

from gpuspeed import cap, peak_memory  # noqa: E402
from gpuspeed.memory import _fraction_set  # noqa: E402

pytestmark = pytest.mark.gpu
MiB, GiB = 2**20, 2**30
HAS_NVML = importlib.util.find_spec("pynvml") is not None


def test_cupy_figure_is_the_peak_in_use_not_the_pool_total():
    cupy = pytest.importorskip("cupy")

    def grow_then_grow_again():
        a = cupy.ones(16 * MiB // 4, dtype=cupy.float32)
        del a  # back to the pool, too small for the next request: the pool ends holding 16 + 32 MiB
        b = cupy.ones(32 * MiB // 4, dtype=cupy.float32)
        return float(b[0])

    rep = peak_memory(grow_then_grow_again)
    assert abs(rep.cupy_peak_bytes - 32 * MiB) <= MiB, rep
    assert rep.peak_bytes >= rep.cupy_peak_bytes


def test_memory_outside_torch_and_cupy_counts_beside_a_torch_allocation():
    if not HAS_NVML:
        pytest.skip("needs nvidia-ml-py")
    cupy = pytest.importorskip("cupy")

    def torch_and_raw_cuda():
        t = torch.ones(64 * MiB, dtype=torch.uint8, device="cuda")
        ptr = cupy.cuda.runtime.malloc(256 * MiB)  # straight from the driver, as Numba or JAX would
        time.sleep(0.05)  # held long enough for the NVML sampler to see it
        cupy.cuda.runtime.free(ptr)
        return int(t[0])

    rep = peak_memory(torch_and_raw_cuda)
    assert abs(rep.torch_peak_bytes - 64 * MiB) <= MiB
    assert "nvml" in rep.peak_source, rep.notes
    assert rep.peak_bytes >= 64 * MiB + 256 * MiB - 2 * MiB, rep
    assert any(note.startswith("peak from NVML") for note in rep.notes)


def test_numba_memory_beside_a_torch_allocation_is_counted():
    if not HAS_NVML:
        pytest.skip("needs nvidia-ml-py")
    np = pytest.importorskip("numpy")
    try:
        from numba import cuda as numba_cuda

        usable = numba_cuda.is_available()
    except Exception as exc:  # numba without its CUDA parts
        pytest.skip(f"numba.cuda unusable: {exc}")
    if not usable:
        pytest.skip("numba.cuda finds no GPU")

    def torch_and_numba():
        t = torch.ones(64 * MiB, dtype=torch.uint8, device="cuda")
        d = numba_cuda.device_array(256 * MiB, dtype=np.uint8)
        time.sleep(0.05)
        del d
        return int(t[0])

    rep = peak_memory(torch_and_numba)
    assert "nvml" in rep.peak_source, rep.notes
    assert rep.peak_bytes >= 64 * MiB + 256 * MiB - 2 * MiB, rep


def test_first_call_workspace_is_left_out_by_the_warm_up():
    workspace = []

    def call():
        if not workspace:  # a one-time buffer, as a library's first call makes
            workspace.append(torch.empty(128 * MiB, dtype=torch.uint8, device="cuda"))
        x = torch.ones(16 * MiB, dtype=torch.uint8, device="cuda")
        return int(x[0])

    warm = peak_memory(call)
    assert abs(warm.torch_peak_bytes - 16 * MiB) <= MiB, warm
    workspace.clear()
    cold = peak_memory(call, warmup=0)
    assert abs(cold.torch_peak_bytes - 144 * MiB) <= MiB, cold
    workspace.clear()


def test_nested_caps_restore_the_outer_cap_then_the_whole_device():
    index = torch.cuda.current_device()
    gc.collect()
    torch.cuda.empty_cache()
    # the fraction counts everything torch holds, graph pools of earlier tests included: budget above that
    held = torch.cuda.memory_reserved()
    with cap(held + 4 * GiB):
        with cap(held + 1 * GiB):
            with pytest.raises(torch.cuda.OutOfMemoryError):
                torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
        x = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")  # the outer cap holds again
        del x
        with pytest.raises(torch.cuda.OutOfMemoryError):  # ... and only it, not the whole device
            torch.empty(6 * GiB, dtype=torch.uint8, device="cuda")
    assert _fraction_set[index] == pytest.approx(1.0)
    y = torch.empty(6 * GiB, dtype=torch.uint8, device="cuda")
    del y
    torch.cuda.empty_cache()


def test_peak_memory_reads_the_gpu_in_use_on_device_one():
    if not HAS_NVML:
        pytest.skip("needs nvidia-ml-py")
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU")

    def alloc():
        x = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
        x.fill_(1)
        return int(x[0])

    with torch.cuda.device(1):
        rep = peak_memory(alloc)
    # NVML's rise on GPU 0 would be about nothing; on GPU 1 it is the allocation
    assert rep.nvml_peak_delta_bytes >= 512 * MiB - MiB, rep
    assert abs(rep.torch_peak_bytes - 512 * MiB) <= MiB


def test_fits_prints_the_measured_peak():
    def alloc():
        x = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
        x.fill_(3)
        return int(x[0])

    rep = peak_memory(alloc)
    msg = rep.fits("8GiB").message
    assert msg.startswith("peak 25") and "MiB fits in 8.00 GiB" in msg, msg
    assert not rep.fits("256MiB").fits
