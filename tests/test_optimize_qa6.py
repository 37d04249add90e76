"""Workloads as a first user writes them from the docs (QA pass 6), CPU only: a misspelled TOLERANCE / BATCH_AXIS /
variants (silently ignored before), BATCH_AXIS by parameter name, a bad TOLERANCE value said where it was written,
inputs() that return None, a dict or a generator, Numba's "no implementation ... for signature:" with the signature,
no duplicate prange candidate for a loop prange cannot rewrite, no NumbaPerformanceWarning from a sequential loop,
and the emitted script's docstring when the original or a CPU candidate is the primary."""

import textwrap
import warnings

import numpy as np
import pytest

from gpuspeed.errors import UserError
from gpuspeed.optimize import candidates as C
from gpuspeed.optimize import workload as W
from gpuspeed.optimize.pipeline import optimize

BODY = '''

def original(x, w):
    return x @ w


def inputs(rng):
    return rng.standard_normal((40, 8)), rng.standard_normal((8, 3))
'''


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


@pytest.mark.parametrize("line, meant", [
    ("TOLERANCES = dict(rtol=1e-3, atol=1e-6)", "TOLERANCE"),
    ("tolerance = dict(rtol=1e-3)", "TOLERANCE"),
    ("TOL = {'atol': 1e-6}", "TOLERANCE"),
    ("BATCH_AXES = {0: 0}", "BATCH_AXIS"),
    ("batch_axis = {0: 0}", "BATCH_AXIS"),
    ("VARIANTS = {'fast': lambda x, w: x @ w}", "variants"),
])
def test_a_misspelled_setting_is_a_one_line_error_not_silently_ignored(tmp_path, line, meant):
    # TOLERANCES = dict(rtol=1e-3) ran under float64's rtol 1e-12 (every float32 candidate skipped), exit 0
    p = _write(tmp_path, "typo.py", "import numpy as np\n" + line + BODY)
    with pytest.raises(UserError, match=rf"typo.py: {line.split()[0]} is not a setting .* did you mean {meant}"):
        W.load(p, gpu=False)


def test_names_the_code_itself_uses_are_not_taken_for_settings(tmp_path):
    p = _write(tmp_path, "solver.py", '''
        import numpy as np

        tolerance = 1e-10  # the original's own convergence threshold
        CONFIG = {"max_iter": 50}
        TOLERANCE = dict(rtol=1e-6)
        FP32_TOL = dict(rtol=1e-4)  # a second dict of rtol beside a TOLERANCE: the user's own


        def original(x):
            y = x.copy()
            for _ in range(CONFIG["max_iter"]):
                y = 0.5 * (y + x / y)
                if np.abs(y * y - x).max() < tolerance:
                    break
            return y


        def inputs(rng):
            return rng.uniform(1, 2, 100)
    ''')
    wl = W.load(p, gpu=False)
    assert wl.rtol == 1e-6


def test_batch_axis_takes_a_parameter_name(tmp_path):
    # BATCH_AXIS = {"x": 0} was refused ("must be a dict {arg_index: axis}") though the README writes {arg: axis}
    p = _write(tmp_path, "named.py", "BATCH_AXIS = {'x': 0}" + BODY)
    assert W.load(p, gpu=False).batch_axis == {0: 0}
    p = _write(tmp_path, "named_w.py", "BATCH_AXIS = {'w': 1}" + BODY)
    assert W.load(p, gpu=False).batch_axis == {1: 1}
    bad = _write(tmp_path, "badname.py", "BATCH_AXIS = {'X': 0}" + BODY)
    with pytest.raises(UserError, match=r"BATCH_AXIS names 'X', which is not a positional parameter .*\(x, w\)"):
        W.load(bad, gpu=False)


def test_a_bad_tolerance_value_says_where_it_was_written(tmp_path):
    # "rtol must be a number >= 0, got -0.001": neither the file nor TOLERANCE named
    p = _write(tmp_path, "neg.py", "TOLERANCE = dict(rtol=-1e-3)" + BODY)
    with pytest.raises(UserError, match=r"^neg.py: TOLERANCE's rtol must be a number >= 0, got -0.001$"):
        W.load(p, gpu=False)
    ok = _write(tmp_path, "ok.py", "TOLERANCE = dict(rtol=1e-3)" + BODY)
    with pytest.raises(UserError, match=r"^--atol must be a number >= 0"):
        W.load(ok, atol=-1.0, gpu=False)


@pytest.mark.parametrize("ret, hint", [
    ("x = rng.standard_normal((40, 8))", r"inputs\(rng\) returned None: is its `return` missing"),
    ("return {'x': rng.standard_normal((40, 8)), 'w': rng.standard_normal((8, 3))}",
     r"inputs\(rng\) returned a dict: it is passed whole as the only argument, not as keyword arguments"),
    ("yield rng.standard_normal((40, 8))", r"inputs\(rng\) returned a generator"),
])
def test_inputs_returning_none_a_dict_or_a_generator_say_so(tmp_path, ret, hint):
    # only "original(NoneType None) raised TypeError: unsupported operand ..." before: no word on inputs()
    p = _write(tmp_path, "odd.py", f'''
        def original(x, w=None):
            return x @ (w if w is not None else x.T)


        def inputs(rng):
            {ret}
    ''')
    with pytest.raises(UserError, match=hint):
        W.reference(W.load(p, gpu=False), [1])


def test_numba_names_the_call_it_has_no_implementation_for():
    # the reason ended at "... Function(<function argsort at 0x7f..>) found for signature:", the call left off
    numba = pytest.importorskip("numba")
    from gpuspeed.optimize.backends.numba_cpu import _what_failed

    def knn(d, k):
        return np.argsort(d, axis=1)[:, :k]

    with pytest.raises(Exception) as info:
        numba.njit(knn)(np.ones((4, 3)), 2)
    text = _what_failed(info.value)
    assert "argsort(array(float64, 2d, C)" in text and "axis" in text and not text.endswith(":)"), text
    assert "signature:" not in text and "0x" not in text, text


def test_no_prange_candidate_for_a_loop_prange_cannot_rewrite():
    # `for g, v in zip(ids, values)` gave a "numba-prange" row identical to "numba", compiled and timed twice
    def zipped(ids, values, n):
        sums = np.zeros(n)
        for g, v in zip(ids, values, strict=True):
            sums[g] += v
        return sums

    def ranged(ids, values, n):
        sums = np.zeros(ids.shape[0])  # each iteration its own element (`sums[ids[i]] +=` would race: qa14)
        for i in range(ids.shape[0]):
            sums[i] += values[i] * ids[i]
        return sums

    assert not C.range_loops(zipped) and C.range_loops(ranged)

    class Wl:
        kind, rtol, atol, in_place, variants, module = "numpy", 1e-9, None, None, {}, np

    for fn, want in ((zipped, {"numba", "numba-serial"}), (ranged, {"numba", "numba-serial", "numba-prange"})):
        Wl.original = staticmethod(fn)
        _, recs = C.plan(Wl, "cpu", {"loop_bound": True, "float64": True}, requested=["numba"])
        assert {r["name"] for r in recs} == want


def test_a_sequential_loop_compiles_without_numbas_parallel_warning():
    # the emitted script printed "NumbaPerformanceWarning: ... parallel=True was specified but no transformation
    # for parallel execution was possible" (a dozen lines) on every run of a sequential recurrence
    pytest.importorskip("numba")
    from gpuspeed.optimize.backends.numba_cpu import _Compiled

    def scan(r):
        out = np.empty_like(r)
        acc = 1.0
        for i in range(r.shape[0]):
            acc *= 1.0 + r[i]
            out[i] = acc
        return out

    r = np.full(10, 0.1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = _Compiled(scan, "scan")(r)
    assert np.allclose(out, np.cumprod(1.0 + r))
    assert not [w for w in seen if "Performance" in type(w.message).__name__], [str(w.message) for w in seen]


def test_the_emitted_script_does_not_promise_a_gpu_fallback_when_the_original_stays(tmp_path):
    # "Without a GPU (or without it) it falls back to the original." in the script of a run that kept the original
    p = _write(tmp_path, "keep.py", '''
        import numpy as np


        def original(x):
            return np.sqrt(np.abs(x))


        def inputs(rng):
            return rng.standard_normal(100)
    ''')
    run = optimize(str(p), device="cpu", backends=["numpy"], time_budget=180, out=tmp_path / "out")
    assert run.choice["primary"] == "original"
    text = (tmp_path / "out" / "optimized_keep.py").read_text()
    assert "Nothing beat the original" in text and "falls back" not in text.split('"""')[1]
