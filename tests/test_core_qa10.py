"""QA round 10 on the measurement core (CPU): check() of infinities, datetimes, large integer references and
object arrays; peak_memory() nested inside a measured call."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuspeed.errors import UserError
from gpuspeed.memory import peak_memory
from gpuspeed.verify import check


def _rng():
    return np.random.default_rng()


# --- check(): an infinity of the other sign, or a finite value where the reference is infinite -----------------


@pytest.mark.parametrize("out_special, ref_special", [(math.inf, -math.inf), (-math.inf, math.inf), (7.5, math.inf)])
def test_an_infinite_atol_does_not_pass_a_wrong_infinity(out_special, ref_special):
    ref = _rng().standard_normal(16)
    out = ref.copy()
    ref[3], out[3] = ref_special, out_special
    r = check(out, ref, atol=math.inf)
    assert not r.passed and r.n_over_tol == 1 and r.worst_index == (3,), r.summary
    assert check(ref.copy(), ref, atol=math.inf).passed  # the same infinity still matches


def test_an_infinite_rtol_reads_a_wrong_infinity_without_a_warning():
    ref = _rng().standard_normal(8)
    out = ref.copy()
    ref[0], out[0] = math.inf, -math.inf
    with np.errstate(all="raise"):  # inf x 0 of the tolerance: a RuntimeWarning on the user's screen
        r = check(out, ref, rtol=math.inf, atol=0)
    assert not r.passed and r.n_over_tol == 1
    same = np.append(0.0, ref[1:])  # a zero in the reference: inf x 0 was NaN room, which failed 0 against 0
    with np.errstate(all="raise"):
        assert check(same.copy(), same, rtol=math.inf, atol=0).passed


# --- check(): datetime64 and timedelta64 ------------------------------------------------------------------------


def _times(unit="ns"):
    base = np.datetime64("2026-01-01T00:00:00", unit)
    return base + _rng().integers(1, 10**12, 6).astype(f"timedelta64[{unit}]")


def test_datetimes_compare_exactly_not_to_a_float_tolerance_of_their_epoch_count():
    ref = _times()
    out = ref.copy()
    out[2] += np.timedelta64(1, "ns")  # ~1.8e18 ns since 1970: rtol 1e-12 of it was a 1.8 ms tolerance
    r = check(out, ref)
    assert not r.passed and r.n_over_tol == 1 and r.worst_index == (2,), r.summary
    assert check(ref.copy(), ref).passed


def test_datetimes_in_different_units_compare_as_the_same_instants():
    ref = _times("s")
    assert check(ref.astype("datetime64[ns]"), ref).passed  # the same instants: counted in ns vs s
    late = ref.astype("datetime64[ns]")
    late[0] += np.timedelta64(1, "ms")
    r = check(late, ref)
    assert not r.passed and r.n_over_tol == 1 and r.worst_index == (0,), r.summary


def test_timedeltas_compare_exactly_and_nat_is_like_nan():
    ref = _rng().integers(10**15, 10**17, 5).astype("timedelta64[ns]")
    out = ref.copy()
    out[4] += np.timedelta64(1, "ns")
    assert not check(out, ref).passed
    ref[1] = out[1] = np.timedelta64("NaT")
    ref[4] = out[4]
    assert not check(out, ref).passed  # NaT, like NaN, matches only with equal_nan=True
    assert check(out, ref, equal_nan=True).passed


def test_a_datetime_against_a_number_is_a_failed_leaf_that_says_so():
    ref = _times()
    r = check(ref.astype(np.int64).astype(np.float64), ref)
    assert not r.passed and "datetime" in r.summary, r.summary


# --- check(): an integer reference past 2**53 matched exactly by a float output ----------------------------------


def test_a_float_output_must_match_a_large_integer_reference_exactly():
    ref = _rng().integers(2**60, 2**62, 4, dtype=np.int64) | 1  # odd: no float64 holds it
    out = ref.astype(np.float64)  # each rounded to a float, ~100 away from the integer
    r = check(out, ref)
    assert not r.passed and r.n_over_tol == 4, r.summary
    assert r.max_abs_err >= 1
    assert check(float(2**62), 2**62 + 1).passed is False  # Python's int and float alike
    exact = np.array([2.0**62, -(2.0**61)])
    assert check(exact, exact.astype(np.int64)).passed  # a float that is the integer still passes


# --- check(): NumPy object arrays ------------------------------------------------------------------------------


def test_an_object_array_of_floats_is_held_to_a_float_tolerance_not_exactness():
    ref = _rng().standard_normal(5)
    out = ref * (1 + 1e-14)
    assert check(out.astype(object), ref.astype(object)).passed
    assert not check((ref * 1.01).astype(object), ref.astype(object)).passed
    big = np.array([2**70, 3], dtype=object)  # Python ints past int64 still compare exactly
    assert not check(big + 1, big).passed and check(big.copy(), big).passed


@pytest.mark.parametrize("value", [[1.0, 2.0], None, "text"])
def test_an_object_array_of_non_numbers_is_one_line(value):
    arr = np.empty(2, dtype=object)
    arr[0], arr[1] = value, value
    with pytest.raises(UserError, match="object array"):
        check(arr, arr.copy())


# --- peak_memory() nested ------------------------------------------------------------------------------------------


def test_a_nested_peak_memory_keeps_the_outer_calls_earlier_peak():
    n = 48_000_000 + int(_rng().integers(0, 2**20))

    def inner():
        return np.empty(16)

    def outer():
        a = np.empty(n, dtype=np.uint8)  # untouched: tracemalloc sees it, the RSS does not
        del a
        return peak_memory(inner, warmup=0)

    rep = peak_memory(outer, warmup=0)
    assert rep.peak_bytes >= n, rep


# --- bench() and peak_memory(): kwargs= with a key that is not a keyword name ----------------------------------------


@pytest.mark.parametrize("key", [1, None, ("y",)])
def test_kwargs_with_a_key_that_is_not_a_string_is_one_line(key):
    from gpuspeed.timing import bench

    x = _rng().standard_normal(8)
    with pytest.raises(UserError, match="keyword names"):
        bench(lambda x, **kw: x, x, kwargs={key: x}, budget_s=0.05)
    with pytest.raises(UserError, match="keyword names"):
        peak_memory(lambda x, **kw: x, x, kwargs={key: x})


def test_a_length_or_structure_mismatch_says_which_side_is_which():
    # "length differs: 2 vs 3" left the user to guess whether their function or the reference returned fewer
    r = check([np.ones(2), np.ones(2)], [np.ones(2), np.ones(2), np.ones(2)])
    assert not r.passed and "output has 2 items, reference 3" in r.summary, r.summary
    r = check((np.ones(2),), np.ones(2))
    assert not r.passed and "output tuple, reference ndarray" in r.summary, r.summary
