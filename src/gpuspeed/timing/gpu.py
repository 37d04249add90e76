"""The device-side pieces bench() is built from: L2 flush, a spin to keep the stream busy, waiting for
results, CUDA event pairs, and the one CUDA-graph primitive (graphs.capture() builds on it too)."""

from __future__ import annotations

import itertools
import warnings

from typing import Any, Callable

from gpuspeed import device as _device
from gpuspeed import trees
from gpuspeed.errors import UserError

_flush_buffers: dict = {}
_spin_rate: dict = {}
FLUSH_ROW = 4096  # float32 per row of the flush buffer: the read is a row sum, one kernel, 16 KiB per row
FLUSH_L2S = 3  # the flush reads this many times L2: 2x evicts it, the third keeps the GPU busy ~15 us longer


_profiled = False  # a profiler session (gpuspeed's own: profile(), kernel mode) has run in this process
PROFILED_NOTE = ("a profiler session (gpuspeed.profile or mode='kernel') ran earlier in this process: Kineto leaves "
                 "CUPTI's callbacks on every later launch (pytorch/pytorch#144455), so a host-bound call reads slower "
                 "here than in a fresh process: time before profiling, or in another process")


def mark_profiled() -> None:
    """Record that a torch.profiler session with CUDA activities ran in this process (bench notes it after)."""
    global _profiled
    _profiled = True


def profiled_before() -> bool:
    return _profiled


def _need_cuda(what: str) -> None:
    """A one-line error for the GPU-only building blocks called on a machine without CUDA (torch's own is an
    AssertionError about how torch was compiled)."""
    import torch

    from gpuspeed.errors import UserError

    if not torch.cuda.is_available():
        raise UserError(f"{what} needs a CUDA device; none is available here (bench() times on the CPU without one)")


def flush_l2() -> None:
    """Evict L2 by reading a buffer of three times its size (allocated once per device; summed row by row).

    A read, not a write: evicting the previous call's dirty lines writes them back inside the flush, and L2 is
    left holding clean lines, which the timed call drops for free. A written flush buffer left L2 full of dirty
    lines, and the timed call paid for writing them back: in a scratch sweep on the H200 (60 MiB L2), a 16 MiB
    copy ran markedly slower after a write flush than after this read, the gap shrinking with size to nothing
    at 1 GiB, while a buffer written or read just before the read flush came back no faster than a cold one
    (2x and 3x L2 timed alike). Committed figures: the hand kernels' rows before and after (kernels_9200d2d.json,
    kernels_f869982.json). Three times, not two: the
    row sum costs the host more to issue than a fill did, and the samples need the GPU still busy with the flush
    while the host queues the timed call behind it (at 2x, a 16-element add was sometimes timed with its launch
    latency on the H200's host, and bench() then chose events over graph mode)."""
    import torch

    _need_cuda("flush_l2()")
    idx = torch.cuda.current_device()
    pair = _flush_buffers.get(idx)
    if pair is None:
        rows = max(1, -(-FLUSH_L2S * _device.l2_bytes() // (4 * FLUSH_ROW)))
        buf = torch.ones(rows, FLUSH_ROW, dtype=torch.float32, device="cuda")  # written once, here
        pair = _flush_buffers[idx] = (buf, torch.empty(rows, dtype=torch.float32, device="cuda"))
    buf, sums = pair
    torch.sum(buf, dim=1, out=sums)


def hold_gpu(seconds: float) -> None:
    """Keep the current stream busy for about `seconds` (a spin kernel), so later launches queue up."""
    import torch

    _need_cuda("hold_gpu()")
    if not hasattr(torch.cuda, "_sleep"):
        return
    idx = torch.cuda.current_device()
    if idx not in _spin_rate:  # SM cycles per second of the spin kernel, measured once with events
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        torch.cuda.synchronize()
        _spin_rate[idx] = 10_000_000 / (start.elapsed_time(end) * 1e-3)
    torch.cuda._sleep(int(seconds * _spin_rate[idx]))


def needs_wait(obj) -> bool:
    """Whether block_until_ready(obj) has anything to wait for (a JAX or CuPy array among its first 256 leaves:
    a long list of Python numbers is not walked to its end)."""
    return any(trees.module_of(x) in ("jax", "jaxlib", "cupy") for x in itertools.islice(trees.leaves(obj), 256))


def block_until_ready(obj) -> None:
    """Wait for results that CUDA events on the torch stream would not see (JAX, CuPy side streams)."""
    for x in trees.leaves(obj):
        mod = trees.module_of(x)
        if mod in ("jax", "jaxlib") and hasattr(x, "block_until_ready"):
            x.block_until_ready()
        elif mod == "cupy":
            import cupy

            stream = cupy.cuda.get_current_stream()
            if stream.ptr != 0:
                stream.synchronize()


def synchronize() -> None:
    """Wait for all work on the current device, from any stream or library (cudaDeviceSynchronize)."""
    import torch

    torch.cuda.synchronize()


class EventPairs:
    """(start, end) CUDA event pairs handed out per batch and taken back once read."""

    def __init__(self):
        self._free: list = []

    def take(self, n: int) -> list:
        import torch

        while len(self._free) < n:
            self._free.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
        taken, self._free = self._free[:n], self._free[n:]
        return taken

    def give_back(self, pairs: list) -> None:
        self._free += pairs


def elapsed(pairs: list, calls_per_sample: int = 1) -> list[float]:
    """Per-call seconds of queued (start, end) pairs, once the last one has completed."""
    pairs[-1][1].synchronize()
    return [s.elapsed_time(e) * 1e-3 / calls_per_sample for s, e in pairs]


def record_graph(body: Callable[[], Any], *, warmup: int = 3, pool=None):
    """Warm `body` up on a side stream, then capture one call of it into a CUDA graph.

    Returns (graph, output of the captured call). Raises whatever capture raises (a host sync, a CPU
    tensor, a data-dependent shape); callers turn that into their own message. A body that queued no GPU
    work on the capture stream (its tensors on the CPU, or on another GPU) raises EmptyGraph: torch only
    warns, and the graph's replay would do nothing while the body's outputs stay as the capture left them.
    """
    import torch

    _need_cuda("record_graph()")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            body()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    _own_cublas_workspace()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.current_stream()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.cuda.graph(graph, pool=pool):
                out = body()
    except BaseException:
        # a failing body makes the context's capture_end raise before it restores the stream
        torch.cuda.set_stream(stream)
        _reset_generators_after_failed_capture()
        raise
    finally:
        _own_cublas_workspace()  # the graph's workspace stays in its pool, out of torch's cache
    torch.cuda.synchronize()
    empty = False
    for w in caught:  # capture_end's own warning (CUDAGraph.cpp: no nodes); the body's warnings pass on
        if str(w.message).startswith(EMPTY_GRAPH_WARNING):
            empty = True
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    if empty:
        raise EmptyGraph("the CUDA graph recorded no GPU work: the function's tensors are on the CPU or on "
                         "another GPU, so a replay would do nothing")
    return graph, out


EMPTY_GRAPH_WARNING = "The CUDA Graph is empty"


class EmptyGraph(UserError):
    """A capture that recorded no GPU work (see record_graph)."""


def _own_cublas_workspace() -> None:
    """Drop torch's cached cuBLAS workspaces, before a capture (so it allocates its own, in its own pool) and
    after it (so nothing outside the graph holds that workspace).

    Every capture runs on torch's one capture stream, and torch keys cuBLAS workspaces by (handle, stream): a
    later graph would bake in the workspace an earlier capture allocated in that graph's pool. Where destroying
    a graph frees the stream's workspace (pytorch/pytorch#175276; #193402, open), the survivors replay GEMMs
    into freed memory: an illegal address once the allocator returns it, silent corruption before. Inductor's
    CUDA-graph trees clear the same cache before and after each capture (clear_cublas_manager). Added after the
    H200's 8B decode study hit an illegal address replaying V4's graph once V5's engine was dropped (54cc11a);
    a two-graph probe on that torch 2.11 did not fault without this, so the cause there is not isolated."""
    import torch

    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def _reset_generators_after_failed_capture() -> None:
    """A capture that fails midway never runs the RNG's capture epilogue, and every later random op
    then fails ("Offset increment outside graph capture"). Swap in a fresh state with the same seed
    and offset so the process stays usable."""
    import torch

    for gen in torch.cuda.default_generators:
        if not hasattr(gen, "graphsafe_get_state"):
            continue
        try:
            fresh = torch.Generator(device=gen.device)
            fresh.set_state(gen.get_state())
            gen.graphsafe_set_state(fresh.graphsafe_get_state())
        except Exception:
            pass
