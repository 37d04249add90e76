"""QA round 14, docs: the loop advice a new user reads from `gpuspeed profile`, and the README's commands as a new
user copies them."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuspeed.profiling.loops import loop_nests

ROOT = Path(__file__).resolve().parents[1]
GPUSPEED = [sys.executable, "-m", "gpuspeed"]


def _loop(src: str) -> dict:
    (loop,) = loop_nests(textwrap.dedent(src), 1, {}, 0.0)
    return loop


def test_profile_calls_an_outer_loop_adding_into_the_same_elements_a_reduction_not_a_parallel_map(tmp_path):
    """`for k in range(K): for i in range(n): out[i] += f(x[i], k)`: every k adds into the same out[i], so the outer
    loop is a reduction over k, not "one thread per outer iteration ... iterations independent" (the advice
    `gpuspeed profile` printed: threads over k would race on out[i]); the inner i loop stays the parallel map."""
    script = tmp_path / "acc.py"
    script.write_text(textwrap.dedent("""\
        import numpy as np


        def accumulate(x, K):
            out = np.zeros_like(x)
            for k in range(K):
                for i in range(x.shape[0]):
                    out[i] += x[i] * 0.5 + k
            return out


        if __name__ == "__main__":
            accumulate(np.random.rand(200), 30)
        """))
    run = subprocess.run([*GPUSPEED, "profile", "--device", "cpu", "--json", str(script)], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    loops = json.loads(run.stdout)["hotspots"]["hot_loops"]
    loop = next(lp for lp in loops if lp["line"] == 6)
    assert loop["kind"] == "reduction", loop
    assert [r["name"] for r in loop["dependences"]["reductions"]] == ["out[i]"], loop["dependences"]
    assert loop["inner"] == [{"line": 7, "kind": "parallel-map"}], loop["inner"]
    assert "iterations independent" not in loop["verdict"] and "one thread per outer iteration" not in loop["verdict"]
    assert "inner loop at line 7" in loop["verdict"], loop["verdict"]


@pytest.mark.parametrize("src, kind", [
    # each step reads the previous step's array (copied back): the steps are in order, the inner loop is the map
    ("""\
     def f(u, new, n, steps):
         for t in range(steps):
             for i in range(1, n - 1):
                 new[i] = (u[i - 1] + u[i + 1]) / 2
             for i in range(1, n - 1):
                 u[i] = new[i]
     """, "sequential-loop"),
    # a scratch row each outer iteration writes in full before it reads it: private, the rows stay independent
    ("""\
     def f(a, out, tmp, n, m):
         for r in range(n):
             for j in range(m):
                 tmp[j] = a[r, j] * 2
             for j in range(m):
                 out[r, j] = tmp[j] + 1
     """, "parallel-map"),
    # the outer index is in the element: each outer iteration adds into its own row
    ("""\
     def f(a, out, n, m):
         for r in range(n):
             for j in range(m):
                 out[r] += a[r, j]
     """, "parallel-map"),
])
def test_outer_loop_over_elements_its_inner_loops_touch_again(src, kind):
    """An outer loop whose inner loops write the same elements in every outer iteration carries them (a reduction
    when it only adds into them, steps in order when it reads them back); a scratch row written in full first, or
    an element indexed by the outer variable, carries nothing."""
    loop = _loop(src)
    assert loop["kind"] == kind, (loop["dependences"], loop["verdict"])


def test_a_histogram_is_not_advised_as_prange():
    """`h[b[i]] += 1`: iterations may add into the same bin; the advice was "Numba @njit(parallel=True) with
    prange", which races on the bin (Numba's docs say so); it now says atomic adds."""
    loop = _loop("def f(b, h, n):\n    for i in range(n):\n        h[b[i]] += 1\n")
    assert loop["kind"] == "reduction" and "atomic" in loop["verdict"], loop["verdict"]
    assert "with prange" not in loop["verdict"], loop["verdict"]
