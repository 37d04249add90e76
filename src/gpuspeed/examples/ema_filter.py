"""An exponential moving average over a long signal, one sample at a time: a sequential recurrence.

Each output needs the previous one, so a GPU cannot run the steps in parallel: the example where a GPU
does not help. Compiling the loop (Numba, on the CPU) is the fast route.
"""

import numpy as np

TOLERANCE = dict(rtol=1e-9, atol=1e-12)


def original(x, alpha):
    y = np.empty_like(x)
    acc = x[0]
    for i in range(len(x)):
        acc = alpha * x[i] + (1.0 - alpha) * acc
        y[i] = acc
    return y


def inputs(rng, scale=1.0):
    n = max(1000, int(1_000_000 * scale))
    return rng.standard_normal(n), 0.05
