"""bench() and peak_memory() on a GPU another process is computing on (NVML's process lists and SM samples).
Run alone (in the serial GPU set): other test processes on the GPU are exactly what this detects."""

import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from gpuspeed import bench, device, peak_memory  # noqa: E402

pytestmark = pytest.mark.gpu

BUSY = """
import sys, time, torch
a = torch.randn(4096, 4096, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
t0 = time.time()
while time.time() - t0 < float(sys.argv[1]):
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
"""


def busy_neighbour(seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", BUSY, str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)  # its matmuls are running
    return proc


def test_bench_says_another_process_computed_on_the_gpu_and_not_when_alone():
    x = torch.randn(2**24, device="cuda")
    proc = busy_neighbour(12)
    try:
        listed, sampled = device.gpu_processes(), device.process_sm_busy(None, int((time.time() - 1) * 1e6))
        if not listed and not sampled:
            pytest.skip(f"NVML sees no processes on this GPU here (process list {listed!r}, SM samples {sampled!r})")
        m = bench(lambda: x.mul(2), max_noise=0.0, max_samples=10**6, budget_s=3.0)
    finally:
        proc.wait(timeout=60)
    assert m.shared_gpu, (m.gpu_sharing, m.notes)
    assert any("other process(es) computed on this GPU" in n for n in m.notes), m.notes
    assert "SHARED-GPU" in str(m)
    alone = bench(lambda: x.mul(2), max_noise=0.0, max_samples=10**6, budget_s=3.0)
    assert not alone.shared_gpu, (alone.gpu_sharing, alone.notes)
    assert alone.gpu_sharing.get("other_busy", {}) == {}, alone.gpu_sharing


def test_peak_memory_notes_a_busy_neighbour_holding_memory():
    proc = busy_neighbour(8)
    try:
        if not device.gpu_processes() and not device.process_sm_busy(None, int((time.time() - 1) * 1e6)):
            pytest.skip("NVML sees no processes on this GPU here")

        def work():
            y = torch.randn(2**26, device="cuda")
            time.sleep(2.0)  # long enough for NVML to sample the neighbour's SM use
            return float(y.sum())

        rep = peak_memory(work)
    finally:
        proc.wait(timeout=60)
    assert rep.gpu_sharing.get("other_processes", 0) >= 1 or rep.gpu_sharing.get("other_busy"), rep.gpu_sharing
    assert any("other process" in n and "may include theirs" in n for n in rep.notes), rep.notes
