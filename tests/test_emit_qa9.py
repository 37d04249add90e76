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
    optimize(p, device="cpu", out=out, backends=backends, time_budget=180, bench_budget_s=0.05)
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


EMA_FN = '''
import numpy as np


def original(x, alpha):
    y = np.empty_like(x)
    acc = x[0]
    for i in range(len(x)):
        acc = alpha * x[i] + (1.0 - alpha) * acc
        y[i] = acc
    return y


def inputs(rng, scale=1.0):
    return rng.standard_normal(3000), 0.05
'''

USE = '''
import importlib.util, sys
import numpy as np
spec = importlib.util.spec_from_file_location("opt", sys.argv[1])
opt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(opt)
fn, how = opt.build_optimized()
print(how)
original = getattr(opt.load_workload("_mine"), opt.FUNC)
rng = np.random.default_rng(11)
for dtype in (np.float64, np.float32):
    x = rng.standard_normal(2 * 777).astype(dtype)[::2]  # the user's own: a strided view, another size
    out, ref = fn(x, 0.1), original(x, 0.1)
    print(dtype.__name__, out.dtype, out.shape, bool(np.allclose(out, ref, rtol=1e-5, atol=1e-6)))
'''


def test_the_numba_script_called_on_other_dtypes_says_nothing_on_stderr(tmp_path):
    # imported and called on float32 after its float64 check, the Numba primary compiled the new types with
    # parallel=True's "no transformation for parallel execution was possible" warning: a dozen lines on stderr
    # of the user's program at each new dtype or layout
    script = _script(tmp_path, "ema", EMA_FN, ["numba"])
    assert "'backend': 'numba'" in script.read_text()
    use = tmp_path / "use.py"
    use.write_text(USE)
    r = subprocess.run([sys.executable, str(use), str(script)], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Numba njit" in r.stdout
    assert "float64 float64 (777,) True" in r.stdout and "float32 float32 (777,) True" in r.stdout, r.stdout
    assert "NumbaPerformanceWarning" not in r.stderr and "parallel=True" not in r.stderr, r.stderr


BROADCAST_FN = '''
import numpy as np


def original(x, w):
    wsum = w.sum()
    mean = (x * w).sum(axis=1) / wsum
    centered = x - mean[:, None]
    var = (centered ** 2 * w).sum(axis=1) / wsum
    std = np.sqrt(var)
    skew = (centered ** 3 * w).sum(axis=1) / wsum / std ** 3
    return mean, std, skew


def inputs(rng, scale=1.0):
    return rng.standard_normal((256, 2048)), rng.uniform(0.5, 1.5, 2048)
'''


def test_the_script_names_numbas_serial_fallback_it_ran(tmp_path):
    # Numba's parallel=True rejected the length-1 broadcast and the primary ran as a serial njit (the report's
    # label says so), but the script printed only the label it had before its first call: "njit(parallel=True)"
    script = _script(tmp_path, "bcast", BROADCAST_FN, ["numba"])
    assert "Primary: Numba njit(serial, parallel=True rejected)" in script.read_text()
    rc, out = _run(script, cwd=tmp_path)
    assert rc == 0 and "correctness: PASS" in out, out
    assert "ran as: Numba njit(serial, parallel=True rejected)" in out, out
