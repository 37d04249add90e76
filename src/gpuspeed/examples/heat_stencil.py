"""Heat diffusion on a 2-D plate: a 5-point Jacobi stencil iterated in NumPy slices, float64.

A stencil: each step reads a neighbourhood and writes a new grid; the steps depend on each other, the
points within a step do not.
"""

import numpy as np

from gpuspeed.examples.hand_kernels import INTERPRETED_SCALE, lazy  # no Triton or Numba import here (loaded on first call)

TOLERANCE = dict(rtol=1e-5, atol=1e-6)  # temperatures of order 1, after many smoothing steps


def original(grid, alpha, steps):
    u = np.array(grid, dtype=np.float64)  # a working copy
    for _ in range(steps):
        lap = u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4.0 * u[1:-1, 1:-1]
        u[1:-1, 1:-1] = u[1:-1, 1:-1] + alpha * lap
    return u


def inputs(rng, scale=1.0):
    n, steps = max(32, int(2048 * scale ** 0.5)), 40
    if scale <= INTERPRETED_SCALE:  # the hand kernels' CPU check: a grid no block divides, an odd step count, seconds
        n, steps = 45, 7
    grid = rng.random((n, n))
    return grid, 0.2, steps


# hand-written kernels (gpuspeed/examples/hand_kernels/heat_stencil.py), given torch tensors on the GPU
variants = {
    "triton": lazy("heat_stencil", "heat_triton"),
    "numba_cuda": lazy("heat_stencil", "heat_numba"),
    # float32 grids (half the bytes), judged under TOLERANCE as optimize's own float32 candidates are
    "triton_fp32": lazy("heat_stencil", "heat_triton_fp32", precision="float32"),
}
