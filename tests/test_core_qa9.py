"""QA round 9 on the measurement core (CPU): check() of masked and quantized arrays, dataclass arguments,
Measurement records read back from strict JSON."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from gpuspeed.errors import UserError
from gpuspeed.verify import check


def _rng():
    return np.random.default_rng()


# --- check(): NumPy masked arrays -------------------------------------------------------------------------


def test_check_masked_arrays_compare_only_the_unmasked_values():
    x = _rng().standard_normal(64)
    mask = _rng().random(64) < 0.3
    mask[5] = True
    other = x.copy()
    other[mask] = _rng().standard_normal(int(mask.sum())) + 100  # garbage under the mask
    other[5] = np.nan  # a masked NaN is not looked at
    res = check(np.ma.array(other, mask=mask), np.ma.array(x, mask=mask))
    assert res.passed, res.summary  # it failed on the masked garbage
    assert res.leaves[0].n_elements == int((~mask).sum())
    # a wrong unmasked value still fails, and its index is the one in the array
    i = int(np.flatnonzero(~mask)[-1])
    other[i] += 1.0
    res = check(np.ma.array(other, mask=mask), np.ma.array(x, mask=mask))
    assert not res.passed and res.worst_index == (i,)


def test_check_masked_arrays_with_different_masks_fail_naming_the_mask():
    x = _rng().standard_normal((4, 5))
    mask = np.zeros((4, 5), dtype=bool)
    mask[2, 3] = True
    res = check(np.ma.array(x, mask=mask), np.ma.array(x.copy()))  # it passed: the mask was dropped
    assert not res.passed and "masks differ" in res.summary and "(2, 3)" in res.summary
    res = check(np.ma.array(x, mask=mask), x.copy())  # a plain array has nothing masked
    assert not res.passed and "masks differ" in res.summary
    assert check(np.ma.array(x), x.copy()).passed  # nothing masked: a plain compare


# --- check(): quantized torch tensors ---------------------------------------------------------------------


def _quantized(x, scale=0.05):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch >= 2.10 deprecates its quantized tensors
        return torch.quantize_per_tensor(x, scale, 0, torch.qint8)


def test_check_compares_quantized_tensors_by_their_dequantized_values():
    x = torch.randn(32)
    q = _quantized(x)
    # it was a TypeError from NumPy ("Got unsupported ScalarType QInt8")
    assert check(q, q.dequantize(), rtol=0, atol=0).passed
    assert check(q, x, rtol=0, atol=0.05 / 2 + 1e-6).passed  # within half a step of the real values
    wrong = _quantized(x + 0.5)
    res = check(wrong, x, rtol=0, atol=0.05)
    assert not res.passed and "dtype qint8 vs reference float32" in res.summary


def test_check_of_a_quantized_tensor_needs_a_stated_tolerance():
    q = _quantized(torch.randn(8))
    with pytest.raises(UserError, match="quantized dtype 'qint8'.*pass rtol= and atol="):
        check(q, q.dequantize())
