"""QA pass 13 on optimized_<name>.py: does the optimized function return exactly what the user's original returns,
for the caller's own inputs? Dtypes for float32, float64 and integer inputs (a float32 primary's results cast back to
what the original returns for them), NumPy scalars and Python numbers kept as the original's, its containers, the
arguments it hands back, keyword-only calls, strided inputs, two shapes in a row, the CPU fallback. CPU only: small
real runs (--device cpu, a short bench budget) and the emitted script imported in a subprocess."""

import subprocess
import sys

import pytest
from optimize_script_helpers import LOAD_OPTIMIZED, optimize_text, rewrite


def _lines(tmp_path, script, text):
    p = tmp_path / "use_it.py"
    p.write_text(text)
    r = subprocess.run([sys.executable, str(p), str(script)], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.splitlines()


RETURNS_INPUT = """
    import numpy as np

    TOLERANCE = dict(rtol=1e-4, atol=1e-5)  # loose enough for the float32 candidate


    def original(x, w, *, scale=1.0):
        y = np.zeros(x.shape)  # float32 under the float32 candidate
        y += x * w * scale
        return {"x": x, "y": y, "same": [y, y], "parts": [p.sum() for p in np.array_split(y, len(y) // 25)]}


    def inputs(rng):
        return rng.standard_normal(200), rng.standard_normal(200) + 2.0
    """


@pytest.fixture(scope="module")
def returns_input(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("returns_input")
    run = optimize_text(tmp_path, "passthrough", RETURNS_INPUT, ["numpy"])
    return run, tmp_path


CALL_RETURNS_INPUT = LOAD_OPTIMIZED + '''
import numpy as np

original = opt.load_workload("_mine").original
rng = np.random.default_rng(9)
x, w = rng.standard_normal(50), rng.standard_normal(50) + 2.0
r = fn(x, w)
print("x", r["x"] is x, bool(np.array_equal(r["x"], x)), r["x"].dtype)
print("twice", r["same"][0] is r["same"][1], r["same"][0] is r["y"], type(r["same"]).__name__, list(r))
print("parts", len(r["parts"]), {type(v).__name__ for v in r["parts"]})  # 2 here, 8 on the run's inputs
r2 = fn(x, w, scale=3.0)  # scale is keyword-only: the call is the original's, as written (float64)
ref = original(x, w, scale=3.0)
print("keyword", r2["y"].dtype, bool(np.array_equal(r2["y"], ref["y"])))
'''


def test_a_keyword_only_call_gets_the_original_as_written(returns_input):
    """A call giving a keyword-only argument is the original's: it ran the original of the module the float32
    primary was built from, whose np.zeros the build had made float32 (float32 results, rounded, from 'the original')."""
    run, tmp_path = returns_input
    lines = _lines(tmp_path, rewrite(run, "numpy-fp32"), CALL_RETURNS_INPUT)
    assert "keyword float64 True" in lines, lines
