"""check(), the tolerance table, poison(), verify_function() -- including property tests."""

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes

from gpuspeed.errors import UserError
from gpuspeed.verify import (TOLERANCES, check, count_poisoned, default_rtol, poison, poison_value,
                             verify_function)

FLOAT_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def test_tolerance_table_is_what_the_docs_say():
    assert TOLERANCES["float64"] == 1e-12
    assert TOLERANCES["float32"] == 1e-5
    assert TOLERANCES["tf32"] == 3e-4
    assert TOLERANCES["float16"] == 1e-3
    assert TOLERANCES["bfloat16"] == 1e-2
    assert default_rtol("torch.bfloat16") == 1e-2
    assert default_rtol("int32") == 0 and default_rtol("bool") == 0
    with pytest.raises(UserError):
        default_rtol("quaternion")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(1,), (7, 13), (3, 1, 129)])
def test_rounded_copy_passes_and_planted_error_fails(dtype, shape):
    ref = torch.randn(shape, dtype=torch.float64)
    out = ref.to(dtype)  # one rounding to the output dtype is within its default tolerance
    r = check(out, ref)
    assert r.passed, r.summary
    bad = out.clone()
    idx = tuple(s // 2 for s in shape)
    bad[idx] = bad[idx] + 1.0 + abs(float(ref[idx])) * 0.5
    r = check(bad, ref)
    assert not r.passed
    assert r.n_over_tol >= 1
    assert r.worst_index == idx
    assert "FAIL" in r.summary


def test_reports_every_field():
    ref = np.array([1.0, 2.0, 4.0, 8.0])
    out = np.array([1.0, 2.5, np.nan, np.inf])
    r = check(out, ref)
    assert not r.passed
    assert r.nan_count == 1 and r.inf_count == 1
    assert r.max_abs_err == pytest.approx(math.inf) or r.max_abs_err >= 0.5
    assert r.n_over_tol == 3
    leaf = r.leaves[0]
    assert leaf.shape == (4,) and leaf.dtype == "float64"


def test_nan_never_passes_unless_asked():
    ref = np.array([1.0, np.nan])
    assert not check(np.array([1.0, np.nan]), ref).passed
    assert check(np.array([1.0, np.nan]), ref, equal_nan=True).passed
    assert not check(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]) * 0 + 1).passed


def test_matching_infinities_pass():
    assert check(np.array([np.inf, -np.inf, 1.0]), np.array([np.inf, -np.inf, 1.0])).passed
    assert not check(np.array([np.inf]), np.array([-np.inf])).passed


def test_shape_and_dtype_mismatch_reported():
    r = check(np.zeros((2, 3)) + 1, np.ones((3, 2)))
    assert not r.passed and "shape" in r.summary
    r = check(np.ones(3, dtype=np.float32), np.ones(3, dtype=np.float64))
    assert r.passed and "dtype float32 vs reference float64" in r.leaves[0].message


def test_integers_and_bools_compare_exactly():
    assert check(np.arange(10), np.arange(10)).passed
    r = check(np.arange(10), np.arange(10) + np.eye(10, dtype=int)[3])
    assert not r.passed and r.n_over_tol == 1 and r.worst_index == (3,)
    assert check(torch.tensor([True, False]), np.array([True, False])).passed
    assert not check(torch.tensor([True, True]), np.array([True, False])).passed
    assert check(np.array([2**63], dtype=np.uint64), np.array([2**63], dtype=np.uint64)).passed


def test_nested_structures_and_scalars():
    out = {"a": (torch.ones(3), 2.0), "b": [np.arange(4), 7]}
    ref = {"a": (np.ones(3), 2.0), "b": [np.arange(4), 7]}
    assert check(out, ref).passed
    assert not check({"a": 1}, {"b": 1}).passed
    assert not check([1, 2], [1, 2, 3]).passed
    assert not check((1.0,), 1.0).passed
    r = check({"a": (torch.ones(3), 2.0)}, {"a": (np.ones(3), 2.5)})
    assert not r.passed and "out['a'][1]" in r.summary
    assert check(3, 3).passed and not check(3, 4).passed


def test_none_against_a_value_fails_and_none_beside_a_value_passes():
    # a function that returns None where the reference returns an array: a failed check, not an exception
    r = check(None, np.ones(3))
    assert not r.passed and "output NoneType, reference ndarray" in r.summary
    assert not check(np.ones(3), None).passed
    assert not check((np.ones(2), None), (np.ones(2), np.ones(2))).passed
    assert check((np.ones(2), None), (np.ones(2), None)).passed
    assert not check(None, None).passed  # two missing returns compare nothing (test_core_qa22)


def test_tf32_dtype_row_and_explicit_tolerances():
    ref = np.ones(100)
    out = ref * (1 + 1e-4)
    assert not check(out.astype(np.float32), ref).passed
    assert check(out.astype(np.float32), ref, dtype="tf32").passed
    assert check(out, ref, rtol=2e-4, atol=0).passed
    with pytest.raises(UserError):
        check(out, ref, rtol=-1)


def test_unsupported_type_is_a_user_error():
    with pytest.raises(UserError):
        check(object(), object())


def test_complex():
    z = np.exp(1j * np.linspace(0, 3, 50))
    assert check(z.astype(np.complex64), z).passed
    bad = z.copy()
    bad[5] += 0.1j
    assert not check(bad, z).passed


def test_poison_and_count():
    t = torch.empty(10)
    poison(t)
    assert count_poisoned(t) == 10
    t[:7] = 1.0
    assert count_poisoned(t) == 3
    a = np.empty(5, dtype=np.int32)
    poison(a)
    assert (a == np.iinfo(np.int32).max).all() and count_poisoned(a) == 5
    assert poison_value("bool") is True
    with pytest.raises(UserError):
        poison((1, 2))
    # a poisoned output that a kernel never wrote fails check()
    ref = np.ones(4)
    out = poison(np.empty(4))
    out[:3] = 1
    assert not check(out, ref).passed


def test_verify_function_fresh_seeds():
    seen = []

    def make(seed):
        seen.append(seed)
        return (np.random.default_rng(seed).standard_normal(64).astype(np.float32),)

    results = verify_function(lambda x: np.sort(x), lambda x: np.sort(x.astype(np.float64)), make)
    assert len(results) == 3 and all(r.passed for r in results)
    assert len(set(seen)) == 3
    wrong = verify_function(lambda x: x, lambda x: np.sort(x.astype(np.float64)), make, seeds=[1, 2, 3])
    assert not any(r.passed for r in wrong)
    assert wrong[0].summary.startswith("seed 1:")


# ----------------------------------------------------------------------------- property tests

_np_float = st.sampled_from([np.float64, np.float32, np.float16])


@settings(max_examples=60, deadline=None)
@given(shape=array_shapes(min_dims=1, max_dims=3, max_side=9), dtype=_np_float, seed=st.integers(0, 2**31))
def test_identical_inputs_always_pass(shape, dtype, seed):
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    assert check(x, x.copy()).passed


@settings(max_examples=60, deadline=None)
@given(shape=array_shapes(min_dims=1, max_dims=3, max_side=9), dtype=_np_float, seed=st.integers(0, 2**31),
       where=st.floats(0, 1, exclude_max=True), sign=st.sampled_from([-1, 1]),
       scale=st.floats(10, 1e6))
def test_planted_error_is_always_found(shape, dtype, seed, where, sign, scale):
    ref = np.random.default_rng(seed).standard_normal(shape).astype(np.float64)
    out = ref.astype(dtype).astype(np.float64)
    flat = out.reshape(-1)
    i = int(where * flat.size)
    rtol = default_rtol(np.dtype(dtype).name)
    rms = float(np.sqrt(np.mean(ref ** 2)))
    # an error `scale` times the element's whole tolerance budget
    flat[i] += sign * scale * (rtol * rms + rtol * abs(ref.reshape(-1)[i]) + 1e-300)
    r = check(out.astype(dtype) if dtype == np.float64 else out, ref, rtol=rtol)
    assert not r.passed
    assert np.ravel_multi_index(r.worst_index, shape) == i


@settings(max_examples=40, deadline=None)
@given(shape=array_shapes(min_dims=1, max_dims=2, max_side=8), seed=st.integers(0, 2**31),
       dtype=st.sampled_from([np.int8, np.int32, np.int64, np.uint8]))
def test_integer_planted_error_found(shape, seed, dtype):
    x = np.random.default_rng(seed).integers(0, 100, size=shape).astype(dtype)
    assert check(x, x.copy()).passed
    y = x.copy().reshape(-1)
    y[seed % y.size] += 1
    r = check(y.reshape(shape), x)
    assert not r.passed and r.n_over_tol == 1


# ----------------------------------------------------------------------------- the stated rule (issue 14)


def test_explicit_atol_means_exactly_the_elementwise_rule():
    ref = np.linspace(-1.0, 1.0, 101)
    out = ref + 1e-4
    assert check(out, ref, rtol=0, atol=1e-3).passed  # every |err| = 1e-4 <= 1e-3
    assert not check(out, ref, rtol=0, atol=1e-5).passed
    zero = np.zeros(64)
    assert check(zero + 1e-9, zero, atol=1e-6).passed  # rel L2 is inf, but atol was stated
    assert not check(zero + 1e-5, zero, atol=1e-6).passed
    f32 = (ref + 1e-4).astype(np.float32)
    assert check(f32, ref, atol=1e-3).passed  # float32 rtol 1e-5 plus the stated atol


def test_default_atol_keeps_the_relative_l2_rule():
    # every element just inside atol + rtol|ref| with atol = rtol * RMS: the spread error fails on L2
    ref = np.ones(1000)
    out = ref + 1.9e-5
    r = check(out, ref, rtol=1e-5)
    assert r.n_over_tol == 0 and not r.passed
    assert "> rtol" in r.summary
    r = check(np.zeros(8) + 1e-9, np.zeros(8))
    assert not r.passed and "atol=" in r.summary  # a zero reference sets no scale: the message says so


def test_python_float_from_float32_gets_float32_tolerance():
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    ref = x.double().sum()
    assert check(x.sum(), ref).passed
    assert check(x.sum().item(), ref).passed  # the same value as a Python float
    assert check(x.sum().item(), float(ref)).passed
    assert not check(x.sum().item(), float(ref), dtype="float64").passed
    assert check(np.float64(1.0) + 1e-9, np.float64(1.0)).leaves[0].rtol == 1e-12  # NumPy scalars keep theirs
    assert check(1.0 + 1e-9, 1.0).leaves[0].rtol == 1e-5
    assert not check(2.0, 2.5).passed


def test_dtype_and_rtol_together_is_an_error_not_silently_ignored():
    ref = np.ones(4)
    with pytest.raises(UserError, match="not both"):
        check(ref, ref, rtol=1e-3, dtype="float16")
    with pytest.raises(UserError):
        check(ref, ref, dtype="quaternion")
    assert check(ref * (1 + 5e-4), ref, dtype="float16").passed
    assert check(ref * (1 + 5e-4), ref, dtype="float16", atol=0).passed


def test_lazy_torch_views_complex32_numpy_dtype_types_and_huge_ints():
    assert check(torch.tensor([1 + 1j]).conj().imag, torch.tensor([-1.0])).passed  # a negated view
    assert check(torch.tensor([1 + 2j]).conj(), np.array([1 - 2j])).passed  # a conjugated view
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "ComplexHalf support is experimental"
        half = torch.tensor([1 + 1j], dtype=torch.complex32)
    assert check(half, torch.tensor([1 + 1j])).passed
    assert check(np.ones(3, np.float32), np.ones(3), dtype=np.float32).passed
    assert check(np.ones(3, np.float32), np.ones(3), dtype=np.dtype("float16")).passed
    assert check(2**70, 2**70).passed and not check(2**70, 2**70 + 1).passed  # exact past int64


def test_an_inf_or_nan_the_reference_lacks_fails_whatever_the_tolerance():
    assert not check(np.array([1.0, np.inf]), np.array([1.0, 2.0]), atol=math.inf).passed
    assert not check(np.array([1.0, np.nan]), np.array([1.0, 2.0]), rtol=math.inf, atol=math.inf).passed
    assert check(np.array([1.0, np.inf]), np.array([1.0, np.inf]), atol=math.inf).passed
    for bad in (dict(rtol=math.nan), dict(atol=math.nan), dict(rtol=-1.0)):
        with pytest.raises(UserError, match="must be >= 0"):
            check(1.0, 1.0, **bad)


def test_exact_comparisons_report_their_relative_l2_error():
    res = check(np.array([1, 2]), np.array([1, 30]))
    assert not res.passed and res.rel_l2_err == pytest.approx(28 / math.hypot(1, 30)) and "rel L2 0.933" in res.summary
    assert check(np.array([1, 2]), np.array([1, 2])).rel_l2_err == 0.0


def test_an_integer_reference_is_matched_exactly_even_by_a_float():
    """A count returned as a float must be the count: no float32 tolerance on an integer answer."""
    assert not check(1000001.0, 1000000).passed
    assert check(1000000.0, 1000000).passed
    assert not check(np.array([1.0, 2.5]), np.array([1, 2])).passed
    assert check(np.array([1.0, 2.0]), np.array([1, 2])).passed
