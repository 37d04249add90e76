"""Escape-time Mandelbrot counts, as a Triton kernel (the iteration in registers over a tile of pixels,
finished pixels masked) and a Numba CUDA kernel (one thread per pixel, each leaving its loop on escape).

The counts must equal the original's exactly (integers), so the iteration is float64, as Python's
complex arithmetic is: z = z * z + c while |z| <= 2 (tested as zr^2 + zi^2 <= 4, the same set of points
but for rounding at the circle itself). Compute-bound: a few bytes per pixel against up to 8 * max_iter
float64 operations. The compilers contract a * b + c into an FMA (one rounding instead of two); simulated in
NumPy over six seeds of the example's inputs, that changed no count, and the GPU tests compare exactly.

Why neither kernel can reach 70 % of the fp64 roof, at any size: the roof is the FMA rate (2 flops per FP64
instruction), while an iteration is 8 counted flops (benchmarks/kernels.py counts 8 per iteration a pixel needs)
for 8 FP64 instructions in the Triton kernel's PTX loop (2 multiplies, 3 FMAs, 2 adds, 1 compare), so a perfectly
issued kernel with no idle lane tops out at 50 %. Written tighter (|z|^2 as one FMA on zi^2, zr^2 + cr as one FMA,
zi' as one FMA on 2 zr) it is 7, 57 %; testing for escape only every few steps and backing up still leaves 6, 67 %.
At the example's 38,400 pixels the kernels are launch-bound (7 % and 5 % in kernels.json). At 64x the pixels
(kernels.json's scaled_up, 2f01d3e) the Triton kernel reaches 28 % and the Numba kernel 31 %: the Triton tile
iterates all max_iter steps, of which 74 % count there (a ceiling of 37 % for it); the Numba warps run until their
slowest pixel escapes.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from gpuspeed.examples.hand_kernels import (
    autotune, check_out, cudasim, device_tensor, interpreting, launch, numba_array, numba_stream, require_numba)

try:  # a module global, as Numba's simulator expects (it swaps `cuda` in the kernel's globals)
    from numba import cuda
except ImportError:  # the Triton kernel works without Numba
    cuda = None

CONFIGS = [triton.Config({"BLOCK_Y": y, "BLOCK_X": x}, num_warps=w, num_stages=s)
           for y, x, w, s in ((4, 32, 4, 1), (8, 32, 8, 1), (2, 64, 4, 1), (4, 64, 8, 1), (1, 128, 4, 1),
                              (2, 32, 2, 1), (8, 16, 4, 1), (1, 64, 2, 1))]


@autotune(configs=CONFIGS, key=["width", "height", "max_iter"])
@triton.jit
def mandelbrot_kernel(xs_ptr, ys_ptr, out_ptr, width, height, max_iter,
                      BLOCK_Y: tl.constexpr, BLOCK_X: tl.constexpr):
    """A BLOCK_Y x BLOCK_X tile of pixels iterates together: an escaped pixel keeps its z (already past
    the circle, so it stays escaped) and stops counting; the tile runs until max_iter. Small tiles keep
    a tile's pixels alike (neighbours escape at similar counts), so little work is masked off.

    Tuning note (gpuspeed kernel, H200, commit c9c4f64): grid 40x8, num_warps 4, num_stages 1 (autotuned:
    BLOCK_Y=4, BLOCK_X=32); 26 registers, 0 spills, 0 B shared; occupancy 100 % (warps-limited); 6.9 us, 45 GB/s
    = 7 % of the fp64 roof; 25396.81x the best automatic candidate (torch-compile). Verdict: launch-bound: 6.9
    us per call at 7 % of the roof; next: fuse launches / more work per launch / a CUDA graph.
    """
    rows = tl.program_id(0) * BLOCK_Y + tl.arange(0, BLOCK_Y)
    cols = tl.program_id(1) * BLOCK_X + tl.arange(0, BLOCK_X)
    rm, cm = rows < height, cols < width
    ci = tl.load(ys_ptr + rows, mask=rm, other=0.0)[:, None] + tl.zeros((BLOCK_Y, BLOCK_X), dtype=tl.float64)
    cr = tl.load(xs_ptr + cols, mask=cm, other=0.0)[None, :] + tl.zeros((BLOCK_Y, BLOCK_X), dtype=tl.float64)
    zr = tl.zeros((BLOCK_Y, BLOCK_X), dtype=tl.float64)
    zi = tl.zeros((BLOCK_Y, BLOCK_X), dtype=tl.float64)
    count = tl.zeros((BLOCK_Y, BLOCK_X), dtype=tl.int64)
    for _ in range(max_iter):
        alive = zr * zr + zi * zi <= 4.0
        new_r = zr * zr - zi * zi + cr  # Python's complex product: (zr zr - zi zi) + i (zr zi + zi zr)
        new_i = zr * zi + zi * zr + ci
        zr = tl.where(alive, new_r, zr)
        zi = tl.where(alive, new_i, zi)
        count += alive.to(tl.int64)
    m = rm[:, None] & cm[None, :]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * width + cols[None, :], count, mask=m)


def _inputs(xs, ys, max_iter, sim: bool, out):
    """The axes as float64 vectors (anything else refused, as the original's complex() refuses it), the step count
    the original's `while n < max_iter` makes (ceil of a fractional one), and the int64 counts (`out` checked)."""
    xs, ys = device_tensor(xs, sim), device_tensor(ys, sim)
    if xs.dim() != 1 or ys.dim() != 1:
        raise ValueError(f"xs and ys must be 1-D axes, got shapes {tuple(xs.shape)} and {tuple(ys.shape)}")
    it = float(max_iter)
    if math.isnan(it) or it == math.inf:
        raise ValueError(f"max_iter must be a finite number of steps, got {max_iter}")
    shape = (ys.numel(), xs.numel())
    if out is None:
        out = torch.empty(shape, dtype=torch.int64, device=xs.device)
    else:
        check_out(out, shape, torch.int64, xs.device)
    return xs.to(torch.float64), ys.to(torch.float64), max(0, math.ceil(it)), out


def mandelbrot_triton(xs, ys, max_iter, config=None, out=None):
    """The example's `original(xs, ys, max_iter)` on the GPU: int64 counts, (len(ys), len(xs)) (into `out`
    when given: a test passes a poisoned buffer)."""
    xs, ys, max_iter, out = _inputs(xs, ys, max_iter, interpreting(), out)
    width, height = xs.numel(), ys.numel()
    if out.numel() == 0:
        return out
    launch(mandelbrot_kernel, lambda meta: (triton.cdiv(height, meta["BLOCK_Y"]), triton.cdiv(width, meta["BLOCK_X"])),
           xs, ys, out, width, height, max_iter, config=config)
    return out


# Numba CUDA: 32 x 8 = 256 threads per block (the brief's 128-256 range); a warp is 32 neighbouring pixels
# of one row, which escape at similar counts, so the warp's threads leave their loops at similar times.
THREADS_X, THREADS_Y = 32, 8


@functools.lru_cache(maxsize=None)
def _numba_kernel():
    @cuda.jit
    def mandelbrot_numba_kernel(xs, ys, max_iter, out):
        """One pixel per thread; the loop ends at escape (a warp runs until its slowest pixel ends).

        Tuning note (gpuspeed kernel, H200, commit c9c4f64): grid 8x20, block 32x8; 26 registers, 0 spills,
        0 B shared; occupancy 100 % (warps-limited); 8.6 us, 36 GB/s = 5 % of the fp64 roof; 20223.39x the
        best automatic candidate (torch-compile). Verdict: launch-bound: 8.6 us per call at 5 % of the roof;
        next: fuse launches / more work per launch / a CUDA graph.
        """
        i, j = cuda.grid(2)  # i: column (x), j: row (y)
        if j < out.shape[0] and i < out.shape[1]:
            cr, ci = xs[i], ys[j]
            zr = 0.0
            zi = 0.0
            n = 0
            while n < max_iter and zr * zr + zi * zi <= 4.0:
                zr, zi = zr * zr - zi * zi + cr, zr * zi + zi * zr + ci
                n += 1
            out[j, i] = n

    return mandelbrot_numba_kernel




def mandelbrot_numba(xs, ys, max_iter, out=None):
    """The example's `original(xs, ys, max_iter)` on the GPU through Numba CUDA."""
    require_numba(cuda)
    xs, ys, max_iter, out = _inputs(xs, ys, max_iter, cudasim(), out)
    if out.numel() == 0:  # a grid of no blocks is an invalid launch on the GPU
        return out
    blocks = (triton.cdiv(xs.numel(), THREADS_X), triton.cdiv(ys.numel(), THREADS_Y))
    _numba_kernel()[blocks, (THREADS_X, THREADS_Y), numba_stream()](numba_array(xs), numba_array(ys), int(max_iter),
                                                             numba_array(out))
    return out
