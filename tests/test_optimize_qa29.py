"""QA round 29, optimize on NumPy code written with the idioms scientists use, CPU only.

- `np.vectorize` over a Python scalar function (`vf = np.vectorize(f)`, `@np.vectorize`): the Numba candidates were
  unavailable ("Cannot determine Numba type of <class 'numpy.vectorize'>"), though numba.vectorize compiles the very
  same function; and the hotspots called it "op-bound (array operations, no hot Python loop)", advising the GPU array
  backends, where a Python function runs once per element;
- a loop `for i in range(1, n, 2)` made the prange candidate unavailable ("Only constant step size of 1 is supported
  for prange"): a stepped loop is left serial, the others still become prange.
"""
from __future__ import annotations


import numpy as np
import pytest

from gpuspeed.optimize import workload as W
from optimize_script_helpers import load_text

pytest.importorskip("numba")

VECTORIZED = """
import math
import numpy as np

def f(a, b):
    if a > b:
        return math.sqrt(a - b)
    return a * b

vf = np.vectorize(f)

@np.vectorize
def clip_sq(v):
    return v * v if abs(v) < 1.0 else 1.0

def original(x, y):
    return vf(x, y) + clip_sq(x)

def inputs(rng):
    return rng.standard_normal(2000), rng.standard_normal(2000)
"""

STEPPED = """
import numpy as np

def original(x):
    out = np.zeros_like(x)
    for i in range(1, x.shape[0], 2):
        out[i] = x[i] + x[i - 1]
    for j in range(x.shape[0]):
        out[j] += 2 * x[j]
    return out

def inputs(rng):
    return (rng.standard_normal(301),)
"""


def _numba_impl(wl, **kw):
    from gpuspeed.optimize.backends import numba_cpu

    return numba_cpu.build(wl.module, **kw)


# --- 1. np.vectorize ---

@pytest.mark.parametrize("kw", [{}, {"parallel": False}], ids=["parallel", "serial"])
def test_np_vectorize_over_a_python_function_is_compiled_by_numba(tmp_path, kw):
    wl = load_text(tmp_path, VECTORIZED)
    args = wl.make_args(1)
    want = wl.original(*args)
    impl = _numba_impl(load_text(tmp_path, VECTORIZED, "w2"), **kw)
    got = impl(*args)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_np_vectorize_compiles_in_parallel_under_the_workers_poisoned_allocations(tmp_path):
    # the worker's correctness calls wrap np.empty (fresh arrays hold NaN); a numba.vectorize ufunc compiled in the
    # call left parallel=True's own allocations untyped: "Cannot determine Numba type of <class 'function'>"
    from gpuspeed.optimize.worker import _Poison

    wl = load_text(tmp_path, VECTORIZED)
    args = wl.make_args(1)
    impl = _numba_impl(load_text(tmp_path, VECTORIZED, "w2"))
    with _Poison(torch_fill=False):
        got = impl(*args)
    np.testing.assert_allclose(got, wl.original(*args), rtol=1e-12)
    with _Poison(torch_fill=False):
        wrapped = np.empty
        impl(*(a.astype(np.float32) for a in args))  # a new argument type: the ufunc compiles again
        assert np.empty is wrapped  # what the checker put there is back after the call


def test_np_vectorize_with_a_signature_is_left_to_numpy_and_said_unavailable(tmp_path):
    from gpuspeed.optimize.backends.common import NotApplicable

    code = VECTORIZED.replace("vf = np.vectorize(f)", "vf = np.vectorize(f, signature='(),()->()')")
    impl = _numba_impl(load_text(tmp_path, code))
    with pytest.raises(NotApplicable, match="vectorize"):  # numba.vectorize has no gufunc signature of NumPy's form
        impl(*load_text(tmp_path, code, "w2").make_args(1))


def test_np_vectorize_is_loop_bound_not_op_bound(tmp_path):
    from gpuspeed.optimize import analysis, candidates

    wl = load_text(tmp_path, VECTORIZED)
    hot = analysis.analyze(wl, wl.make_args(0), 1e-3, gpu=True)
    assert hot["loop_bound"], hot["implications"]
    said = " ".join(hot["implications"])
    assert "op-bound (array" not in said and "`f` 2001 times" in said, said
    rows, _ = candidates.plan(wl, "cuda", hot, requested=["numba"])
    numba_row = next(r for r in rows if r["key"] == "numba")
    assert numba_row["decision"] == "tried" and "loop-bound" in numba_row["why"]


def test_a_helper_called_a_few_times_leaves_array_code_op_bound(tmp_path):
    from gpuspeed.optimize import analysis

    code = """
    import numpy as np

    def step(x):
        return np.sqrt(np.abs(x)) + x * 0.5

    def original(x):
        for _ in range(3):
            x = step(x)
        return x

    def inputs(rng):
        return (rng.standard_normal(200_000),)
    """
    wl = load_text(tmp_path, code)
    hot = analysis.analyze(wl, wl.make_args(0), 1e-3, gpu=True)
    assert not hot["loop_bound"], hot["implications"]


# --- 2. prange over a stepped range ---

def test_a_stepped_range_loop_stays_serial_in_the_prange_candidate(tmp_path):
    wl = load_text(tmp_path, STEPPED)
    args = wl.make_args(1)
    impl = _numba_impl(load_text(tmp_path, STEPPED, "w2"), prange=True)
    np.testing.assert_allclose(impl(*args), wl.original(*args), rtol=1e-12)


def test_only_stepped_range_loops_plan_no_prange_candidate(tmp_path):
    from gpuspeed.optimize import candidates

    code = STEPPED.replace("for j in range(x.shape[0]):", "for j in range(x.shape[0] - 1, -1, -1):")
    wl = load_text(tmp_path, code)
    assert not candidates.range_loops(wl.original)
    assert candidates.range_loops(load_text(tmp_path, STEPPED, "w2").original)
    one = code.replace("range(1, x.shape[0], 2)", "range(0, x.shape[0], 1)")  # a step of 1 written out is prange's
    assert candidates.range_loops(load_text(tmp_path, one, "w3").original)


def test_long_double_inputs_made_alike_have_one_fingerprint():
    # inputs(rng) returning np.longdouble arrays stopped the run: "inputs(rng) made other arguments for the same seed"
    # (their 16 bytes hold 10 of value on x86-64; the padding is whatever memory held)
    import numpy as np


    def made(seed):
        rng = np.random.default_rng(seed)
        return (rng.standard_normal(257).astype(np.longdouble), rng.standard_normal(3).astype(np.clongdouble))

    for _ in range(5):  # fresh allocations, other garbage in the padding each time
        assert W._digest(made(1)) == W._digest(made(1))
    assert W._digest(made(1)) != W._digest(made(2))
    assert W._digest((np.ones(4),)) != W._digest((np.ones(4, dtype=np.longdouble),))
