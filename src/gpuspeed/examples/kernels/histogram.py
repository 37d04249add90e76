"""np.histogram(samples, bins, range=(lo, hi)) with NumPy's exact binning, as a Triton kernel (privatized
per-program histograms merged with one atomic per bin) and a Numba CUDA kernel (a shared-memory
histogram per block, merged with global atomics).

Exact binning: a bin index from (x - lo) / (hi - lo) * bins, then corrected against the bin edges
NumPy itself uses (np.linspace(lo, hi, bins + 1), computed once on the host and cached on the device),
as np.histogram does; values outside [lo, hi] and NaN are dropped, hi falls in the last bin. Counts
are int64 (NumPy's dtype). Precision: float64 (the index arithmetic must match NumPy's bit for bit), so no
float32 variant: samples cast to float32 land in the neighbouring bin near an edge, and counts compare exactly.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import triton
import triton.language as tl

from gpuspeed.examples.kernels import cudasim, device_tensor, interpreting, launch, numba_array, numba_stream, sm_count

try:  # a module global, as Numba's simulator expects (it swaps `cuda` in the kernel's globals)
    from numba import cuda, float64, int32
except ImportError:  # the Triton kernel works without Numba
    cuda = float64 = int32 = None

# PER_SM: programs per SM of the persistent grid (each loops over BLOCK-sized tiles, then merges once)
# 8 values per thread per tile kept ~74 registers (ptxas, sm_90); 16 per thread took 128-133. The H200 (b919814)
# chose 1024 x 16 per SM at 4 warps, register-limited to 38 % occupancy: the verdict's 2 warps on that tile, and 512
# at 2 warps with twice the programs, replace the 16-warp 4096 tile and the 2-stage 2048 one
CONFIGS = [triton.Config({"BLOCK": b, "PER_SM": p}, num_warps=w, num_stages=s)
           for b, p, w, s in ((2048, 4, 8, 1), (1024, 8, 4, 1), (2048, 8, 8, 1), (1024, 16, 2, 1),
                              (1024, 16, 4, 1), (1024, 16, 4, 2), (512, 32, 2, 1), (512, 16, 2, 1))]


@triton.autotune(configs=CONFIGS, key=["n", "bins"], reset_to_zero=["out_ptr"])
@triton.jit
def histogram_kernel(x_ptr, edges_ptr, range_ptr, out_ptr, n, bins,
                     BINS: tl.constexpr, BLOCK: tl.constexpr, PER_SM: tl.constexpr):
    """A persistent grid: each program bins its BLOCK-sized tiles into a private histogram in registers
    (tl.histogram), then adds it to the global counts with one atomic per bin, so the atomics do not
    grow with the sample count. Dropped values (and the padding lanes of the last tile) are binned as
    0 and taken off bin 0 at the end.

    Tuning note (gpuspeed kernel, H200, commit 1bac8bf): grid 2112, num_warps 4, num_stages 1 (autotuned:
    BLOCK=1024, PER_SM=16); 64 registers, 0 spills, 1024 B shared; occupancy 50 % (registers-limited); 286.0 us,
    1398 GB/s = 32 % of the copy roof; 1.68x the best automatic candidate (cupy). Verdict: register-limited to
    50 % occupancy: try num_warps=2.
    """
    pid = tl.program_id(0)
    lo = tl.load(range_ptr)  # float64 from memory: a Python float argument would arrive as float32
    hi = tl.load(range_ptr + 1)
    step = tl.num_programs(0) * BLOCK
    offs0 = tl.arange(0, BLOCK)
    hist = tl.zeros((BINS,), dtype=tl.int32)
    dropped = tl.zeros((BLOCK,), dtype=tl.int32)  # lanes binned as 0 but not counted: summed once, at the end
    # a multiply, not NumPy's divide: float64 division is a ~20-instruction sequence a sample; the estimate differs
    # from NumPy's by an ulp at most, so it is off by at most one bin, and the edge corrections below (NumPy's own)
    # land both on the same bin
    scale = bins / (hi - lo)
    for start in range(pid * BLOCK, n, step):
        offs = start + offs0
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m, other=0.0)
        keep = m & (x >= lo) & (x <= hi)
        idx = ((tl.where(keep, x, lo) - lo) * scale).to(tl.int32)  # dropped lanes (NaN too): bin 0
        idx = tl.where(idx == bins, bins - 1, idx)  # x == hi lands in the last bin
        lower = tl.load(edges_ptr + idx)
        idx = tl.where(keep & (x < lower), idx - 1, idx)  # NumPy's correction within ~1 ulp of an edge
        upper = tl.load(edges_ptr + idx + 1)
        idx = tl.where(keep & (x >= upper) & (idx != bins - 1), idx + 1, idx)
        hist += tl.histogram(idx, BINS)
        dropped += (~keep).to(tl.int32)
    b = tl.arange(0, BINS)
    hist -= tl.where(b == 0, tl.sum(dropped, axis=0), 0)
    tl.atomic_add(out_ptr + b, hist.to(tl.int64), mask=b < bins)


@functools.lru_cache(maxsize=64)
def _edges_host(bins: int, lo: float, hi: float):
    """np.histogram's range and edges: (lo, hi) widened by 0.5 when equal, np.linspace(lo, hi, bins + 1)."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise ValueError(f"supplied range of [{lo}, {hi}] is not finite")
    if lo > hi:
        raise ValueError("max must be larger than min in range parameter.")
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    return lo, hi, np.linspace(lo, hi, bins + 1)


_EDGES: dict = {}


def _setup(samples, bins, lo, hi, sim):
    x = device_tensor(samples, sim).reshape(-1).to(torch.float64)
    bins = int(bins)
    lo, hi, edges = _edges_host(bins, float(lo), float(hi))
    key = (bins, lo, hi, str(x.device))
    if key not in _EDGES:  # copied to the device once, not on every call
        _EDGES[key] = (torch.from_numpy(edges).to(x.device), torch.tensor([lo, hi], dtype=torch.float64, device=x.device))
    out = torch.zeros(bins, dtype=torch.int64, device=x.device)
    return x, bins, lo, hi, _EDGES[key], out


def histogram_triton(samples, bins, lo, hi, config=None):
    """The example's `original(samples, bins, lo, hi)` on the GPU: int64 counts per bin."""
    x, bins, lo, hi, (edges, bounds), out = _setup(samples, bins, lo, hi, interpreting())
    n = x.numel()
    sms = sm_count(x.device.index or 0) if x.device.type == "cuda" else 4
    launch(histogram_kernel, lambda meta: (max(1, min(triton.cdiv(n, meta["BLOCK"]), sms * meta["PER_SM"])),),
           x, edges, bounds, out, n, bins, config=config, BINS=triton.next_power_of_2(bins))
    return out


# Numba CUDA: 256 threads per block (the brief's 128-256 range) and 8 blocks per SM in a grid-stride loop:
# 2048 resident threads per SM, full occupancy, since a block needs only bins * 4 + (bins + 1) * 8 bytes of
# shared memory (3 KiB for 256 bins). Warp aggregation (one atomic per distinct bin per warp) does not pay
# here: 256 bins over spread data give few same-bin collisions in a warp, and shared-memory atomics are cheap.
THREADS = 256
BLOCKS_PER_SM = 8


@functools.lru_cache(maxsize=None)
def numba_kernel(bins: int):
    """The Numba CUDA kernel for `bins` bins (shared-array sizes must be constants)."""
    n_edges = bins + 1  # a literal for Numba: an expression in the shape would not be one

    @cuda.jit
    def histogram_numba_kernel(x, edges, lo, hi, out):
        """Shared-memory histogram per block (and the edges staged beside it), then one global atomic per
        non-empty bin per block.

        Tuning note (gpuspeed kernel, H200, commit 1bac8bf): grid 1056, block 256; 46 registers, 0 spills,
        3080 B shared; occupancy 62 % (registers-limited); 261.1 us, 1532 GB/s = 35 % of the copy roof;
        2.02x the best automatic candidate (cupy). Verdict: latency-bound at 35 % of the copy roof with 62 %
        occupancy; next: more work per program / fuse (more loads in flight per thread).
        """
        h = cuda.shared.array(bins, int32)
        e = cuda.shared.array(n_edges, float64)
        t = cuda.threadIdx.x
        for i in range(t, bins, cuda.blockDim.x):
            h[i] = 0
        for i in range(t, n_edges, cuda.blockDim.x):
            e[i] = edges[i]
        cuda.syncthreads()
        # NumPy's divide, kept here: with the Triton kernel's multiply this kernel ran 380 us on the H200
        # (results/nvidia-h200/kernels_c68085a.json), 254 us with the divide (kernels.json, efc5c2d)
        span = hi - lo
        for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
            v = x[i]
            if v >= lo and v <= hi:
                j = int((v - lo) / span * bins)
                if j == bins:
                    j = bins - 1
                if v < e[j]:
                    j -= 1
                if v >= e[j + 1] and j != bins - 1:
                    j += 1
                cuda.atomic.add(h, j, 1)
        cuda.syncthreads()
        for i in range(t, bins, cuda.blockDim.x):
            if h[i] != 0:
                cuda.atomic.add(out, i, h[i])

    return histogram_numba_kernel


def histogram_numba(samples, bins, lo, hi):
    """The example's `original(samples, bins, lo, hi)` on the GPU through Numba CUDA."""
    sim = cudasim()
    x, bins, lo, hi, (edges, _), out = _setup(samples, bins, lo, hi, sim)
    n = x.numel()
    sms = sm_count(x.device.index or 0) if x.device.type == "cuda" else 4
    blocks = max(1, min(triton.cdiv(n, THREADS), sms * BLOCKS_PER_SM))
    numba_kernel(bins)[blocks, THREADS, numba_stream()](numba_array(x), numba_array(edges), lo, hi, numba_array(out))
    return out
