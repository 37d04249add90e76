"""Per-row weighted statistics of a float64 matrix (mean, standard deviation, skewness): reductions.

Each statistic is a reduction along a row; the rows are independent.
"""

import numpy as np

from gpuspeed.examples.hand_kernels import INTERPRETED_SCALE, lazy  # no Triton or Numba import here (loaded on first call)

TOLERANCE = dict(rtol=1e-5, atol=1e-7)
BATCH_AXIS = {0: 0}


def original(x, w):
    wsum = w.sum()
    mean = (x * w).sum(axis=1) / wsum
    centered = x - mean[:, None]
    var = (centered ** 2 * w).sum(axis=1) / wsum
    std = np.sqrt(var)
    skew = (centered ** 3 * w).sum(axis=1) / wsum / std ** 3
    return mean, std, skew


def inputs(rng, scale=1.0):
    rows, cols = max(64, int(16_384 * scale)), 2048
    if scale <= INTERPRETED_SCALE:  # the hand kernels' CPU check: sizes no block or unrolled loop divides, in seconds
        rows, cols = 19, 333
    x = rng.standard_normal((rows, cols)) + rng.uniform(-1, 1, (rows, 1))
    w = rng.uniform(0.5, 1.5, cols)
    return x, w


# hand-written kernels (gpuspeed/examples/hand_kernels/row_stats.py), given torch tensors on the GPU
variants = {
    "triton": lazy("row_stats", "row_stats_triton"),
    "numba_cuda": lazy("row_stats", "row_stats_numba"),
}
