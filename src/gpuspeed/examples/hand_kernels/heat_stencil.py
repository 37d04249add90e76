"""The 5-point Jacobi heat stencil between two ping-pong buffers, one step per launch, as a Triton kernel
(float64, and float32 for the float32 variant) and a Numba CUDA kernel; the step launches of one call are
replayed from a CUDA graph.

The first launch reads the caller's grid (never written) and every launch writes the whole grid, the
fixed boundary copied through, so neither buffer needs a copy of the grid first. Precision: float64, the
example's own dtype (memory-bound: 16 bytes moved per point per step against 7 flops); the float32 variant
(heat_triton_fp32, `precision = "float32"`) steps float32 grids, half the bytes, the like-for-like answer to
optimize's float32 candidates (kept only within the example's TOLERANCE).

One step a launch. Float64 (tile kernel): the neighbours read through L1, each point loaded 5 times, 4 of them
cache hits, so DRAM sees one read and one write per point per step. Float32 (strip kernel): both grids live in
L2, which the tile kernel's up and down rows (other programs' centre rows) each cross again; a program steps 4
rows and loads each of its 6 rows once, every load issued before the first store. A strip that loaded each row
after storing the one before (89c290e, results/nvidia-h200/kernels_89c290e.json) reached 48 % of the copy roof:
a load cannot move above a store to a buffer that may alias its own. What was measured against it on the H200
(results/nvidia-h200/kernels_1bac8bf.json): temporal blocking (two steps a launch, each output recomputing
the first step at itself and its four neighbours from 13 inputs) ran at 26 % (float64) and 15 % (float32) of the
copy roof, load-instruction bound, against 74 % and 60 % for one step a launch; and a Numba kernel that staged a
shared-memory tile with its halo and ran every step in one cooperative launch (grid.sync between steps) reached
22 %. Both were removed.

A step at 2048 x 2048 moves 64 MiB (float64), tens of microseconds of GPU time, about what Python takes to launch
a Triton kernel and less than a Numba launch: the launches are captured once per kernel, shape and step count
(gpuspeed.graphs) and replayed, all but the first and the last: those two run eagerly, the first writing into
the graph's input buffer and the last reading its output into a fresh grid, so the graph costs no copy of the grid
in or out (two copies cost about 5 % of a call before). Under `gpuspeed kernel`'s launch capture, under the
interpreters and inside a caller's own graph capture all the launches run eagerly, so their geometry is seen.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from gpuspeed.examples.hand_kernels import (
    autotune, cudasim, device_tensor, interpreting, launch, numba_array, numba_stream, require_numba)

try:  # a module global, as Numba's simulator expects (it swaps `cuda` in the kernel's globals)
    from numba import cuda
except ImportError:  # the Triton kernel works without Numba
    cuda = None

# the configs an H200 sweep (40 steps replayed from a graph) ranked first; tiles of 16 and 32 rows ran slower
CONFIGS = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
           for m, n, w, s in ((8, 256, 4, 1), (2, 128, 1, 1), (4, 256, 2, 1), (4, 256, 4, 1), (2, 512, 4, 1),
                              (1, 256, 2, 1), (8, 128, 4, 1), (4, 512, 4, 1))]
# float32: four rows a program, each row loaded once (strip_step), the shapes an H200 sweep (40 steps replayed from a
# graph) ranked first; 128- and 2048-column strips, 2-row strips and every tile of the tile kernel ran slower. In
# float64 (two 32 MiB grids: DRAM-bound) the strip and the tile ran alike, so the float64 kernel keeps its tiles
CONFIGS_F32 = [triton.Config({"BLOCK_M": 4, "BLOCK_N": n}, num_warps=w, num_stages=1)
               for n, w in ((512, 8), (256, 4), (512, 4), (256, 2), (1024, 8))]


@triton.jit
def _lr(p, interior):
    """The left and right neighbours of a row's points (misaligned by one element: L1 hits after the centre load)."""
    return tl.load(p - 1, mask=interior, other=0.0), tl.load(p + 1, mask=interior, other=0.0)


@triton.jit
def _update(up, c, down, left_right, alpha, interior):
    """The original's c + alpha * (up + down + left + right - 4 c), in its order of operations; boundary points
    unchanged."""
    left, right = left_right
    return tl.where(interior, c + alpha * (up + down + left + right - 4.0 * c), c)


@autotune(configs=CONFIGS, key=["n_rows", "n_cols"])
@triton.jit
def heat_step_kernel(src_ptr, dst_ptr, alpha_ptr, n_rows, n_cols,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    """One Jacobi step on a BLOCK_M x BLOCK_N tile (boundary points copied). The four neighbour loads overlap
    the centre loads of the adjacent rows and tiles: they hit L1/L2, so DRAM sees about one read and one
    write per point. PDL (programmatic dependent launch, sm_90): the next step's programs are launched while
    this step's last ones run, and wait (griddepcontrol.wait) for all of it before their first load.

    Tuning note (gpuspeed kernel, H200, commit c9c4f64): grid 1024x4, num_warps 4, num_stages 1 (autotuned:
    BLOCK_M=2, BLOCK_N=512); 48 registers, 0 spills, 0 B shared; occupancy 62 % (registers-limited); 770.2 us,
    3485 GB/s = 81 % of the copy roof; 0.56x the best automatic candidate (torch-compile-fp32). Verdict: at 81 %
    of the copy roof: done; next: none: it is at its roof.
    """
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # every write of the previous step is visible after this
    alpha = tl.load(alpha_ptr)  # float64 from memory: a Python float argument would arrive as float32
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    inside = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    interior = inside & (rows[:, None] > 0) & (rows[:, None] < n_rows - 1) & (cols[None, :] > 0) & \
        (cols[None, :] < n_cols - 1)
    p = src_ptr + rows[:, None] * n_cols + cols[None, :]
    c = tl.load(p, mask=inside, other=0.0)
    up = tl.load(p - n_cols, mask=interior, other=0.0)
    down = tl.load(p + n_cols, mask=interior, other=0.0)
    tl.store(dst_ptr + rows[:, None] * n_cols + cols[None, :], _update(up, c, down, _lr(p, interior), alpha, interior),
             mask=inside)


@triton.jit
def strip_step(src_ptr, dst_ptr, alpha_ptr, n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               PDL: tl.constexpr):
    """One Jacobi step on a strip of BLOCK_M = 4 rows by BLOCK_N columns: the 6 rows it reads (its own and one
    above and below) are each loaded once, as aligned vectors, and serve as the centre of one row and the up and
    down of its neighbours; only the left and right neighbours are loaded per point. Every load is issued before
    the first store (src and dst are different buffers, which the compiler cannot know), so none waits behind a
    store."""
    tl.static_assert(BLOCK_M == 4)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # every write of the previous step is visible after this
    alpha = tl.load(alpha_ptr)  # the grid's dtype, from memory: a Python float argument would arrive as float32
    r0 = tl.program_id(0).to(tl.int64) * BLOCK_M
    cols = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    col_in = col_ok & (cols > 0) & (cols < n_cols - 1)
    r = r0 + tl.zeros((BLOCK_N,), dtype=tl.int64)  # row indices as vectors: the masks below are per point
    above = tl.load(src_ptr + (r - 1) * n_cols + cols, mask=col_ok & (r > 0), other=0.0)
    p0 = src_ptr + r * n_cols + cols
    c0 = tl.load(p0, mask=col_ok & (r < n_rows), other=0.0)
    c1 = tl.load(p0 + n_cols, mask=col_ok & (r + 1 < n_rows), other=0.0)
    c2 = tl.load(p0 + 2 * n_cols, mask=col_ok & (r + 2 < n_rows), other=0.0)
    c3 = tl.load(p0 + 3 * n_cols, mask=col_ok & (r + 3 < n_rows), other=0.0)
    below = tl.load(p0 + 4 * n_cols, mask=col_ok & (r + 4 < n_rows), other=0.0)
    in0 = col_in & (r > 0) & (r < n_rows - 1)
    in1 = col_in & (r + 1 < n_rows - 1)
    in2 = col_in & (r + 2 < n_rows - 1)
    in3 = col_in & (r + 3 < n_rows - 1)
    lr0 = _lr(p0, in0)
    lr1 = _lr(p0 + n_cols, in1)
    lr2 = _lr(p0 + 2 * n_cols, in2)
    lr3 = _lr(p0 + 3 * n_cols, in3)
    q0 = dst_ptr + r * n_cols + cols
    tl.store(q0, _update(above, c0, c1, lr0, alpha, in0), mask=col_ok & (r < n_rows))
    tl.store(q0 + n_cols, _update(c0, c1, c2, lr1, alpha, in1), mask=col_ok & (r + 1 < n_rows))
    tl.store(q0 + 2 * n_cols, _update(c1, c2, c3, lr2, alpha, in2), mask=col_ok & (r + 2 < n_rows))
    tl.store(q0 + 3 * n_cols, _update(c2, c3, below, lr3, alpha, in3), mask=col_ok & (r + 3 < n_rows))


@autotune(configs=CONFIGS_F32, key=["n_rows", "n_cols"])
@triton.jit
def heat_step_f32_kernel(src_ptr, dst_ptr, alpha_ptr, n_rows, n_cols,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    """One Jacobi step on float32 grids (the `triton_fp32` variant, declared precision = "float32"), as strip_step:
    4 rows a program, each row loaded once. At 2048 x 2048 the two ping-pong grids (32 MiB) live in the H200's
    50 MiB L2, so a step is bound by L2 traffic and load instructions, not DRAM: the tile kernel above, whose three
    row loads a point each went to L2 (its 2-D tiles did no better), reached 65 % of the copy roof here
    (results/nvidia-h200/kernels_62a5101.json).

    Tuning note (gpuspeed kernel, H200, commit c9c4f64): grid 512x8, num_warps 4, num_stages 1 (autotuned:
    BLOCK_M=4, BLOCK_N=256); 32 registers, 0 spills, 0 B shared; occupancy 100 % (warps-limited); 310.8 us, 4318
    GB/s = 100 % of the copy roof; 1.39x the best automatic candidate (torch-compile-fp32). Verdict: at 100 % of
    the copy roof: done; next: none: it is at its roof.
    """
    strip_step(src_ptr, dst_ptr, alpha_ptr, n_rows, n_cols, BLOCK_M, BLOCK_N, PDL)


@functools.lru_cache(maxsize=None)
def _pdl(index: int) -> bool:
    """Whether the step kernels launch with PDL on this device: sm_90 or later, a Triton with
    tl.extra.cuda.gdc_wait, and not under the interpreter."""
    if interpreting() or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(index) >= (9, 0) and hasattr(tl.extra.cuda, "gdc_wait")


_ALPHA: dict = {}


def _alpha(alpha: float, device, dtype=torch.float64):
    """alpha as a one-element tensor of the grid's dtype on the device, made once per value (no copy on every
    call)."""
    key = (alpha, str(device), dtype)
    if key not in _ALPHA:
        _ALPHA[key] = torch.tensor([alpha], dtype=dtype, device=device)
    return _ALPHA[key]


def _buffers(u, steps: int, out):
    """The destinations of `steps` ping-pong steps from u: fresh buffers (one or two), the last step into `out`
    when given."""
    fresh = [torch.empty_like(u) for _ in range(min(steps - (out is not None), 2))]
    return [fresh[i % 2] for i in range(steps - (out is not None))] + ([out] if out is not None else [])


def _triton_steps(u, coeff, steps, config, kernel, out=None):
    """`steps` launches of the one-step kernel from u (never written) through fresh ping-pong buffers, the last
    into `out` when given; the grid after them."""
    n_rows, n_cols = u.shape
    pdl = u.device.type == "cuda" and _pdl(u.device.index or 0)
    extra = {"launch_pdl": True} if pdl else {}

    def grid(meta):
        return triton.cdiv(n_rows, meta["BLOCK_M"]), triton.cdiv(n_cols, meta["BLOCK_N"])

    src = u
    for dst in _buffers(u, steps, out):
        launch(kernel, grid, src, dst, coeff, n_rows, n_cols, config=config, PDL=pdl, **extra)
        if config is None and not interpreting():
            config = kernel.best_config  # chosen at the first launch: the rest skip the autotuner
        src = dst
    return src


_GRAPHS: dict = {}


def _eager(u) -> bool:
    """Launch the steps one by one (no graph): under the interpreters, under `gpuspeed kernel`'s launch capture (a
    graph replay goes through no Python launch path), off the GPU, and inside a caller's own capture (which records
    the launches themselves: a graph is not captured inside one)."""
    from gpuspeed.kernel.capture import watching_launches

    return (interpreting() or cudasim() or watching_launches() or u.device.type != "cuda"
            or torch.cuda.is_current_stream_capturing())


def _graphed(key, steps_fn, u, steps: int):
    """steps_fn(u, steps): the first and the last step launched eagerly, the steps between them replayed from the
    CUDA graph kept under `key` (captured on first use). The first step writes straight into the graph's input
    buffer and the last reads its output buffer into a fresh grid, so the graph costs no copy of the grid in or
    out. steps_fn(src, n, out=None) launches n steps from src, the last into `out` when given."""
    from gpuspeed.graphs import capture

    if steps < 3:
        return steps_fn(u, steps)
    g = _GRAPHS.get(key)
    if g is None:
        if len(_GRAPHS) >= 4:  # each graph keeps three grids of its shape: drop the oldest
            _GRAPHS.pop(next(iter(_GRAPHS)))
        # own_inputs: the graph reads its own buffer, which the first step of every later call writes; the key
        # fixes the signature: one graph
        g = _GRAPHS[key] = capture(lambda x: steps_fn(x, steps - 2), own_inputs=True, max_cache=1)
        middle = g(steps_fn(u, 1))  # the capture copies this first step's grid in, once
    else:
        steps_fn(u, 1, out=g.static_inputs[0])
        middle = g.replay()
    return steps_fn(middle, 1)  # a fresh grid: the next replay overwrites `middle`


def _grid_steps(grid, steps, sim: bool, dtype):
    """The grid as the kernels read it (2-D, else refused) and the step count (a whole number, as the original's
    range() needs)."""
    u = device_tensor(grid, sim)
    if u.dim() != 2:
        raise ValueError(f"grid must be a 2-D plate, got shape {tuple(u.shape)}")
    if int(steps) != steps:
        raise ValueError(f"steps must be a whole number, got {steps}")
    return u.to(dtype), int(steps)  # .to() keeps a tensor of that dtype itself: it is only read


def _heat(grid, alpha, steps, config, dtype, kernel):
    u, steps = _grid_steps(grid, steps, interpreting(), dtype)
    if steps <= 0 or u.numel() == 0:
        return u.clone()
    coeff = _alpha(float(alpha), u.device, dtype)
    if _eager(u):
        return _triton_steps(u, coeff, steps, config, kernel)
    # alpha in the key: the graph reads the coefficient tensor it was captured with (one per alpha)
    key = (kernel.fn.__name__, steps, tuple(u.shape), str(u.device), repr(config), float(alpha))
    if key not in _GRAPHS and config is None:  # autotune once, eagerly: a capture cannot time configs
        _triton_steps(u, coeff, steps, None, kernel)
        config = kernel.best_config
    return _graphed(key, lambda x, n, out=None: _triton_steps(x, coeff, n, config, kernel, out), u, steps)


def heat_triton(grid, alpha, steps, config=None):
    """The example's `original(grid, alpha, steps)` on the GPU: the grid after `steps` Jacobi steps."""
    return _heat(grid, alpha, steps, config, torch.float64, heat_step_kernel)


def heat_triton_fp32(grid, alpha, steps, config=None):
    """The same in float32 (optimize casts the grid before the timing, as it does for its float32 candidates; a
    float64 grid given here is cast in the call): a float32 grid after `steps` steps."""
    return _heat(grid, alpha, steps, config, torch.float32, heat_step_f32_kernel)


heat_triton_fp32.precision = "float32"


# Numba CUDA: blocks of 256 threads along a row (the brief's 128-256 range; a warp reads 32 consecutive float64),
# each thread stepping ROWS_PER_THREAD = 8 points down its column, whose up and down neighbours are the column's
# own points (L1 hits); 8 rows a thread beat 1, 2 and 4 in an H200 sweep. No shared-memory tile: L1 already serves
# the neighbours, and a tile costs a barrier.
THREADS = 256
ROWS_PER_THREAD = 8


@functools.lru_cache(maxsize=None)
def _numba_kernel():
    @cuda.jit
    def heat_step_numba_kernel(src, dst, alpha):
        """One Jacobi step: ROWS_PER_THREAD points of one column per thread, boundary points copied through.

        Tuning note (gpuspeed kernel, H200, commit c9c4f64): grid 8x256, block 256; 32 registers, 0 spills,
        0 B shared; occupancy 100 % (warps-limited); 794.2 us, 3380 GB/s = 78 % of the copy roof; 0.54x the
        best automatic candidate (torch-compile-fp32). Verdict: at 78 % of the copy roof; next: tune the
        block shape and the work per thread (time a few).
        """
        n_rows, n_cols = src.shape
        c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if c >= n_cols:
            return
        r0 = cuda.blockIdx.y * ROWS_PER_THREAD
        for i in range(ROWS_PER_THREAD):
            r = r0 + i
            if r < n_rows:
                centre = src[r, c]
                if 0 < r < n_rows - 1 and 0 < c < n_cols - 1:
                    lap = src[r - 1, c] + src[r + 1, c] + src[r, c - 1] + src[r, c + 1] - 4.0 * centre
                    dst[r, c] = centre + alpha * lap
                else:
                    dst[r, c] = centre

    return heat_step_numba_kernel


def _numba_steps(u, alpha: float, steps: int, out=None):
    """`steps` launches of the Numba step kernel from u (never written) through fresh ping-pong buffers, the last
    into `out` when given; the grid after them."""
    n_rows, n_cols = u.shape
    kernel = _numba_kernel()
    blocks = (triton.cdiv(n_cols, THREADS), triton.cdiv(n_rows, ROWS_PER_THREAD))
    stream = numba_stream()
    views = {}  # one Numba view per buffer, not one per launch
    src = u
    for dst in _buffers(u, steps, out):
        for t in (src, dst):
            views.setdefault(id(t), numba_array(t))
        kernel[blocks, THREADS, stream](views[id(src)], views[id(dst)], alpha)
        src = dst
    return src


def heat_numba(grid, alpha, steps):
    """The example's `original(grid, alpha, steps)` on the GPU through Numba CUDA."""
    require_numba(cuda)
    u, steps = _grid_steps(grid, steps, cudasim(), torch.float64)
    alpha = float(alpha)
    if steps <= 0 or u.numel() == 0:  # (a grid of no blocks is an invalid launch on the GPU)
        return u.clone()
    if _eager(u):
        return _numba_steps(u, alpha, steps)
    key = ("heat_step_numba_kernel", steps, tuple(u.shape), str(u.device), alpha)  # alpha is baked into the graph
    return _graphed(key, lambda x, n, out=None: _numba_steps(x, alpha, n, out), u, steps)
