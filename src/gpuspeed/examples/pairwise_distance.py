"""All-pairs Euclidean distances between two point clouds by broadcasting, as NumPy makes it easy to write.

Done naively the (n, m, 3) difference and its square need more than 8 GB at the typical size: the
pipeline has to chunk it along the rows of `a` (BATCH_AXIS) to fit the budget.
"""

import numpy as np

from gpuspeed.examples.hand_kernels import lazy  # the hand kernels load on first call: no Triton or Numba import here

TOLERANCE = dict(rtol=1e-6, atol=1e-9)
BATCH_AXIS = {0: 0}  # rows of `a` are independent: output rows follow them


def original(a, b):
    diff = a[:, None, :] - b[None, :, :]
    return np.sqrt((diff ** 2).sum(axis=-1))


def inputs(rng, scale=1.0):
    n = max(64, int(12_000 * scale ** 0.5))
    return rng.standard_normal((n, 3)), rng.standard_normal((n, 3))


# hand-written kernels (gpuspeed/examples/hand_kernels/pairwise_distance.py), given torch tensors on the GPU
variants = {
    "triton": lazy("pairwise_distance", "pairwise_triton"),
    "numba_cuda": lazy("pairwise_distance", "pairwise_numba"),
}
