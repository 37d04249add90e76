"""Standardize each row of a matrix in a Python loop that calls NumPy once per row.

The loop is over rows, the work inside is array code: vectorizing the loop (or a GPU library that fuses
it) removes thousands of small calls.
"""

import numpy as np

from gpuspeed.examples.hand_kernels import lazy  # the hand kernels load on first call: no Triton or Numba import here

TOLERANCE = dict(rtol=1e-5, atol=1e-6)
BATCH_AXIS = {0: 0}


def original(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        row = x[i]
        out[i] = (row - row.mean()) / (row.std() + 1e-8)
    return out


def inputs(rng, scale=1.0):
    rows = max(32, int(4096 * scale))
    return (rng.standard_normal((rows, 1024)) * rng.uniform(0.5, 2.0, (rows, 1)),)


# hand-written kernels (gpuspeed/examples/hand_kernels/row_normalize.py), given torch tensors on the GPU
variants = {
    "triton": lazy("row_normalize", "normalize_rows_triton"),
    # float32 rows (half the bytes), judged under TOLERANCE as optimize's own float32 candidates are
    "triton_fp32": lazy("row_normalize", "normalize_rows_triton_fp32", precision="float32"),
}
