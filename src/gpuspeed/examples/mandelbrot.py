"""Escape-time Mandelbrot, written the way it is taught: two Python loops over pixels and a while loop.

Loop-bound: nearly all of the time is the interpreter stepping through scalar complex arithmetic.
Numba compiles the loops; array drop-ins would launch GPU work for every pixel.
"""

import numpy as np

from gpuspeed.examples.hand_kernels import lazy  # the hand kernels load on first call: no Triton or Numba import here


def original(xs, ys, max_iter):
    counts = np.zeros((len(ys), len(xs)), dtype=np.int64)
    for j in range(len(ys)):
        for i in range(len(xs)):
            c = complex(xs[i], ys[j])
            z = 0j
            n = 0
            while n < max_iter and abs(z) <= 2.0:
                z = z * z + c
                n += 1
            counts[j, i] = n
    return counts


def inputs(rng, scale=1.0):
    width = max(16, int(240 * scale ** 0.5))
    height = max(12, int(160 * scale ** 0.5))
    # a random window near the set's boundary, where the iteration counts vary most
    cx, cy = rng.uniform(-0.8, -0.6), rng.uniform(0.2, 0.4)
    xs = np.linspace(cx - 0.6, cx + 0.6, width)
    ys = np.linspace(cy - 0.4, cy + 0.4, height)
    return xs, ys, 64


# hand-written kernels (gpuspeed/examples/hand_kernels/mandelbrot.py), given torch tensors on the GPU
variants = {
    "triton": lazy("mandelbrot", "mandelbrot_triton"),
    "numba_cuda": lazy("mandelbrot", "mandelbrot_numba"),
}
