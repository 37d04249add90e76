"""np.histogram(samples, bins, range=(lo, hi)) with NumPy's exact binning, as a Triton kernel (privatized
per-program histograms merged with one atomic per bin) and a Numba CUDA kernel (a shared-memory
histogram per block, merged with global atomics).

Exact binning: a bin index estimated as (x - lo) * (bins / (hi - lo)), then, only for a value whose estimate
lies within 1e-9 of a bin's width of an edge, corrected against the bin edges NumPy itself uses
(np.linspace(lo, hi, bins + 1), computed once on the host and cached on the device), as np.histogram does.
Farther from an edge the estimate is NumPy's bin: it and NumPy's own estimate differ from the exact position
by a few ulps (~1e-13 of a bin at 256 bins), and the edges from linspace by as little, so neither crosses an
edge. The two edge loads a sample cost the kernels more than the sample's own load (gathered loads, a few
cache lines a warp). Values outside [lo, hi] and NaN are dropped, hi falls in the last bin. Counts are int64
(NumPy's dtype). Precision: float64 (the index arithmetic must match NumPy's bit for bit), so no
float32 variant: samples cast to float32 land in the neighbouring bin near an edge, and counts compare exactly.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import triton
import triton.language as tl

from gpuspeed.examples.kernels import cudasim, device_tensor, interpreting, launch, numba_array, numba_stream, sm_count

try:  # a module global, as Numba's simulator expects (it swaps `cuda` in the kernel's globals)
    from numba import cuda, float64, int32
except ImportError:  # the Triton kernel works without Numba
    cuda = float64 = int32 = None

NEAR_EDGE = 1e-9  # a bin-position fraction this close to 0 or 1 is checked against NumPy's edges
_NEAR_EDGE = tl.constexpr(NEAR_EDGE)  # the same, as Triton reads a global

# PER_SM: programs per SM of the persistent grid (each loops over BLOCK-sized tiles, then merges once)
# 8 values per thread per tile kept ~64-74 registers (ptxas, sm_90); 16 per thread took 128-133. Ordered as an H200
# sweep (edge loads gated) ranked them; 2 warps on 1024 and 4096 at 8 warps were the slowest there and are gone
CONFIGS = [triton.Config({"BLOCK": b, "PER_SM": p}, num_warps=w, num_stages=s)
           for b, p, w, s in ((1024, 32, 4, 1), (2048, 16, 8, 1), (1024, 16, 4, 1), (2048, 8, 8, 1),
                              (512, 32, 2, 1), (1024, 8, 4, 1), (512, 64, 4, 1), (1024, 64, 8, 1))]


@triton.autotune(configs=CONFIGS, key=["n", "bins"], reset_to_zero=["out_ptr"])
@triton.jit
def histogram_kernel(x_ptr, edges_ptr, range_ptr, out_ptr, n, bins,
                     BINS: tl.constexpr, BLOCK: tl.constexpr, PER_SM: tl.constexpr):
    """A persistent grid: each program bins its BLOCK-sized tiles into a private histogram in registers
    (tl.histogram), then adds it to the global counts with one atomic per bin, so the atomics do not
    grow with the sample count. Dropped values (and the padding lanes of the last tile) are binned as
    0 and taken off bin 0 at the end.

    Tuning note (gpuspeed kernel, H200, commit 008aad4): grid 4224, num_warps 4, num_stages 1 (autotuned:
    BLOCK=1024, PER_SM=32); 56 registers, 0 spills, 1024 B shared; occupancy 56 % (registers-limited); 252.7 us,
    1583 GB/s = 37 % of the copy roof; 2.09x the best automatic candidate (cupy). Verdict: latency-bound at 37 %
    of the copy roof with 56 % occupancy; next: more work per program / fuse (more loads in flight per thread).
    """
    pid = tl.program_id(0)
    lo = tl.load(range_ptr)  # float64 from memory: a Python float argument would arrive as float32
    hi = tl.load(range_ptr + 1)
    step = tl.num_programs(0) * BLOCK
    offs0 = tl.arange(0, BLOCK)
    hist = tl.zeros((BINS,), dtype=tl.int32)
    dropped = tl.zeros((BLOCK,), dtype=tl.int32)  # lanes binned as 0 but not counted: summed once, at the end
    # a multiply, not NumPy's divide: float64 division is a ~20-instruction sequence a sample; the estimate differs
    # from NumPy's by an ulp at most, so it is off by at most one bin, and only near an edge, where the corrections
    # below (NumPy's own) land both on the same bin
    scale = bins / (hi - lo)
    for start in range(pid * BLOCK, n, step):
        offs = start + offs0
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m, other=0.0)
        keep = m & (x >= lo) & (x <= hi)
        pos = (tl.where(keep, x, lo) - lo) * scale  # dropped lanes (NaN too): bin 0
        idx = pos.to(tl.int32)
        frac = pos - idx.to(tl.float64)
        near = keep & ((frac < _NEAR_EDGE) | (frac > 1.0 - _NEAR_EDGE))  # x == hi too (frac 0)
        idx = tl.where(idx >= bins, bins - 1, idx)  # x == hi lands in the last bin
        # (skipping these four lines for a tile with no value near an edge, after one tl.max over it, ran slower on
        # the H200: more registers, 38 % occupancy; results/nvidia-h200/kernels_f16b397.json)
        lower = tl.load(edges_ptr + idx, mask=near, other=0.0)  # the masked-off lanes load nothing
        idx = tl.where(near & (x < lower), idx - 1, idx)  # NumPy's correction within ~1 ulp of an edge
        upper = tl.load(edges_ptr + idx + 1, mask=near, other=0.0)
        idx = tl.where(near & (x >= upper) & (idx != bins - 1), idx + 1, idx)
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


# Numba CUDA: 256 threads per block (the brief's 128-256 range) and 8 blocks per SM in a grid-stride loop, each
# thread loading UNROLL samples before binning them (loads in flight), into one of COPIES shared-memory histograms
# (warp w adds to copy w % COPIES: fewer same-address atomics where the data pile up, a normal's central bins) and
# the edges staged beside them: 4 KiB + 2 KiB for 256 bins. In an H200 sweep (50 M normal samples) each of the
# three paid: the multiply over NumPy's divide, 4 loads over 1, 4 copies over 1 (8 copies: no better).
THREADS = 256
BLOCKS_PER_SM = 8
UNROLL = 4  # the loop below loads v0..v3
COPIES = 4


@functools.lru_cache(maxsize=None)
def numba_kernel(bins: int):
    """The Numba CUDA kernel for `bins` bins (shared-array sizes must be constants)."""
    n_edges = bins + 1  # literals for Numba: an expression in the shape would not be one
    n_counts = bins * COPIES

    @cuda.jit(device=True)
    def bin_of(v, lo, hi, scale, e):
        """v's bin as np.histogram gives it, -1 for a dropped value (outside [lo, hi], NaN)."""
        if not (v >= lo and v <= hi):
            return -1
        pos = (v - lo) * scale
        j = int(pos)
        frac = pos - j
        if frac < NEAR_EDGE or frac > 1.0 - NEAR_EDGE or j >= bins:  # near an edge: NumPy's corrections
            if j >= bins:
                j = bins - 1
            if v < e[j]:
                j -= 1
            if v >= e[j + 1] and j != bins - 1:
                j += 1
        return j

    @cuda.jit
    def histogram_numba_kernel(x, edges, lo, hi, out):
        """Shared-memory histograms per block (COPIES of them, and the edges staged beside them), then one global
        atomic per non-empty bin per block.

        Tuning note (gpuspeed kernel, H200, commit 008aad4): grid 1056, block 256; 32 registers, 0 spills,
        6152 B shared; occupancy 100 % (warps-limited); 128.3 us, 3117 GB/s = 72 % of the copy roof; 4.11x
        the best automatic candidate (cupy). Verdict: at 72 % of the copy roof; next: tune the block shape
        and the work per thread (time a few).
        """
        h = cuda.shared.array(n_counts, int32)
        e = cuda.shared.array(n_edges, float64)
        t = cuda.threadIdx.x
        for i in range(t, n_counts, cuda.blockDim.x):
            h[i] = 0
        for i in range(t, n_edges, cuda.blockDim.x):
            e[i] = edges[i]
        cuda.syncthreads()
        scale = bins / (hi - lo)
        mine = ((t // 32) % COPIES) * bins  # this warp's histogram
        n, g = x.shape[0], cuda.gridsize(1)
        for i in range(cuda.grid(1), n, g * UNROLL):
            v0 = x[i]  # the UNROLL loads first, then the binning: four loads in flight
            v1 = x[i + g] if i + g < n else math.nan
            v2 = x[i + 2 * g] if i + 2 * g < n else math.nan
            v3 = x[i + 3 * g] if i + 3 * g < n else math.nan
            for v in (v0, v1, v2, v3):
                j = bin_of(v, lo, hi, scale, e)
                if j >= 0:
                    cuda.atomic.add(h, mine + j, 1)
        cuda.syncthreads()
        for i in range(t, bins, cuda.blockDim.x):
            total = 0
            for c in range(COPIES):
                total += h[c * bins + i]
            if total != 0:
                cuda.atomic.add(out, i, total)

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
