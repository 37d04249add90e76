"""Row softmax: the bundled example of `gpuspeed bench`.

`softmax_numpy` is what a user writes first; `softmax_torch` runs the same math on the device. The
demo times both through bench(), checks the fast one against a float64 reference through check(), and
compares them with a bootstrap confidence interval.
"""

from __future__ import annotations

import numpy as np

GPU_SHAPE = (8192, 8192)  # 256 MiB in fp32: far past L2, long enough to time cleanly
CPU_SHAPE = (1024, 2048)  # small enough for a 2-core machine to time in a few seconds


def make_inputs(shape=GPU_SHAPE, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32) * 4


def softmax_numpy(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=1, keepdims=True)  # subtract the row max so exp() cannot overflow
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def softmax_torch(x):
    import torch

    return torch.softmax(x, dim=1)


def softmax_reference(x: np.ndarray) -> np.ndarray:
    return softmax_numpy(np.asarray(x, dtype=np.float64))
