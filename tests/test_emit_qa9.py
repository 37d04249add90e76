"""The emitted optimized_<name>.py run as a user runs it (QA pass 9 on emit), CPU only: each test makes the script
from a small real `gpuspeed optimize` run in tmp_path and runs it in a subprocess."""

import re
import subprocess
import sys
import textwrap

from gpuspeed.optimize.pipeline import optimize


def _script(tmp_path, name, text, backends):
    p = tmp_path / f"{name}.py"
    p.write_text(textwrap.dedent(text))
    out = tmp_path / "out"
    optimize(p, device="cpu", out=out, backends=backends, time_budget=60, bench_budget_s=0.05)
    return out / f"optimized_{name}.py"


def _run(script, *argv, cwd):
    r = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, cwd=cwd, timeout=120)
    return r.returncode, r.stdout + r.stderr


INT_FN = '''
import numpy as np


def original(a):
    return np.cumsum(a * 3 + 1)


def inputs(rng, scale=1.0):
    return (rng.integers(0, 100, 5000),)
'''


def test_bench_of_a_script_that_keeps_the_original_prints_no_speedup(tmp_path):
    # nothing beat the original: --bench timed the same function twice and printed "original 11.9 ms, optimized
    # 22.3 ms: 0.53x", noise presented as the optimized version being twice slower
    script = _script(tmp_path, "ints", INT_FN, ["numpy"])
    assert "RECIPE = {'name': 'original'" in script.read_text()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rc, out = _run(script, "--bench", cwd=elsewhere)
    assert rc == 0, out
    assert "correctness: PASS" in out
    assert not re.search(r"\d\.\d\dx", out), out
    assert "optimized version is the original itself (chosen)" in out, out
