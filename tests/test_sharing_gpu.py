"""bench() and peak_memory() on a GPU another process uses (NVML's process lists and per-process SM samples).
Run alone (in the serial GPU set): other test processes on the GPU are exactly what this detects."""

import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from gpuspeed import bench, device, peak_memory  # noqa: E402

pytestmark = pytest.mark.gpu

# a neighbour: holds 256 MiB, runs matmuls until told to stop, allocates 1 GiB more when told to
NEIGHBOUR = """
import sys, threading, torch
a = torch.randn(8192, 8192, device="cuda")
stop, extra = threading.Event(), []
def spin():
    global a
    while not stop.is_set():
        for _ in range(10):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
torch.cuda.synchronize()
threading.Thread(target=spin, daemon=True).start()
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "alloc":
        extra.append(torch.ones(2**28, device="cuda"))
        torch.cuda.synchronize()
        print("done", flush=True)
    else:
        break
stop.set()
"""


@pytest.fixture
def neighbour():
    proc = subprocess.Popen([sys.executable, "-c", NEIGHBOUR], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(1.5)  # its matmuls are running, long enough for NVML to have sampled them
    yield proc
    if proc.poll() is None:
        proc.stdin.write("quit\n")
        proc.stdin.flush()
    proc.wait(timeout=60)


def long_bench(fn):
    return bench(fn, max_noise=1e-9, max_samples=10**6, budget_s=2.0)  # sampling runs the whole 2 s


def test_bench_reports_a_busy_neighbour_and_nothing_alone(neighbour):
    listed = device.gpu_processes()
    if not listed:
        pytest.skip(f"NVML lists no processes on this GPU here ({listed!r})")
    x = torch.randn(2**24, device="cuda")
    sampled = device.process_sm_busy(None, int((time.time() - 1.5) * 1e6)) or {}
    m = long_bench(lambda: x.mul(2))
    assert m.gpu_sharing["other_processes"] >= 1, m.gpu_sharing
    if sampled.get(neighbour.pid, 0) > 0:  # NVML samples processes here: it must be flagged
        assert m.shared_gpu and f"pid {neighbour.pid}" in " ".join(m.notes), (m.gpu_sharing, m.notes)
        assert "SHARED-GPU" in str(m)
    else:  # it cannot: the report says it could not tell, and claims no sharing
        assert not m.shared_gpu and any("whether they computed" in n for n in m.notes), (sampled, m.notes)
    neighbour.stdin.write("quit\n")
    neighbour.stdin.flush()
    neighbour.wait(timeout=60)
    alone = long_bench(lambda: x.mul(2))
    assert not alone.shared_gpu and alone.gpu_sharing.get("other_processes") == 0, alone.gpu_sharing
    # "process(es)": the sharing notes' words, not the CUPTI note a profiler run earlier in this process leaves
    assert not any("other process(es)" in n for n in alone.notes), alone.notes


def test_peak_memory_notes_a_neighbour_allocating_during_the_call(neighbour):
    if not device.gpu_processes():
        pytest.skip("NVML lists no processes on this GPU here")

    def work():
        y = torch.randn(2**26, device="cuda")
        neighbour.stdin.write("alloc\n")
        neighbour.stdin.flush()
        assert neighbour.stdout.readline().strip() == "done"
        return float(y.sum())

    rep = peak_memory(work, warmup=0)
    assert rep.gpu_sharing.get("other_processes", 0) >= 1, rep.gpu_sharing
    grew = rep.gpu_sharing["other_used_bytes_after"] - rep.gpu_sharing["other_used_bytes_before"]
    assert grew >= 2**30, rep.gpu_sharing
    assert any("other processes' memory on this GPU changed by +" in n for n in rep.notes), rep.notes
    # the neighbour's 1 GiB is not the call's: its 256 MiB is
    assert 2**28 - 2**20 <= rep.peak_bytes < 2**28 + 64 * 2**20, (rep.peak_bytes, rep.notes)
