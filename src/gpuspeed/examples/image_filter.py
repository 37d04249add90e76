"""Denoise a stack of float64 images with SciPy: a Gaussian blur per image, then a logistic contrast curve.

NumPy and SciPy together, as image code is usually written: the CuPy drop-in maps scipy.ndimage and
scipy.special to cupyx.scipy; torch.compile does not trace SciPy, so it is skipped with that reason.
"""

import numpy as np
from scipy import ndimage, special

TOLERANCE = dict(rtol=1e-5, atol=1e-6)
BATCH_AXIS = {0: 0}  # images are independent


def original(stack, sigma, gain):
    blurred = ndimage.gaussian_filter(stack, sigma=(0, sigma, sigma), mode="reflect")
    centered = blurred - np.mean(blurred, axis=(1, 2), keepdims=True)
    return special.expit(gain * centered)


def inputs(rng, scale=1.0):
    n = max(4, int(64 * scale))
    return rng.random((n, 512, 512)), 2.0, 8.0
