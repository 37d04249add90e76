"""A histogram of measurements: np.histogram over a large float64 sample into fixed bins.

Integer counts compare exactly, so a candidate must bin every value as NumPy does.
"""

import numpy as np

from gpuspeed.examples.hand_kernels import lazy  # the hand kernels load on first call: no Triton or Numba import here


def original(samples, bins, lo, hi):
    counts, _ = np.histogram(samples, bins=bins, range=(lo, hi))
    return counts


def inputs(rng, scale=1.0):
    n = max(10_000, int(50_000_000 * scale))
    return rng.standard_normal(n), 256, -4.0, 4.0


# hand-written kernels (gpuspeed/examples/hand_kernels/histogram.py), given torch tensors on the GPU
variants = {
    "triton": lazy("histogram", "histogram_triton"),
    "numba_cuda": lazy("histogram", "histogram_numba"),
    # no float32 variant: NumPy bins the float64 values against float64 edges, a float32 cast moves values near an
    # edge into the next bin, and the integer counts compare exactly (no TOLERANCE)
}
