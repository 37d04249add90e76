"""`gpuspeed optimize` as a demanding user drives it (QA pass 9), CPU only: a 0-d `--input x=float64[]` is the same
0-d array in the run and in the emitted script."""

import subprocess
import sys
import textwrap

import numpy as np

from gpuspeed.optimize import workload as W
from gpuspeed.optimize.pipeline import optimize


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


SPECS_FN = '''
import numpy as np


def original(x, h, m, k, n, f):
    assert np.ndim(x) == 0, np.shape(x)  # a 0-d input, as --input x=float64[] says
    return np.sin(x) * n + f + np.sum(h, dtype=np.float64) + m.sum() + k.astype(np.float64).sum()
'''

DUMP = '''
import importlib.util, sys
import numpy as np
spec = importlib.util.spec_from_file_location("emitted", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
module = mod.load_workload("_dump")
for seed in (7, 101):
    args = mod.make_args(module, seed)
    np.savez(f"{sys.argv[2]}{seed}.npz", *[np.asarray(a) for a in args], types=[type(a).__name__ for a in args])
'''


def test_a_0d_input_spec_is_0d_in_the_run_and_in_the_emitted_script(tmp_path):
    # --input x=float64[] made a (1,) array in the run (np.ascontiguousarray makes a 0-d array 1-d) and a 0-d one
    # in the emitted script: the script checked and timed another workload than the one optimize verified
    p = _write(tmp_path, "specs.py", SPECS_FN)
    specs = ["x=double[]", "h=half[3, 2]", "m=bool[5]", "k=int32[4]", "n=int:3", "f=float:0.25"]
    wl = W.load(p, input_specs=specs, gpu=False)
    assert np.shape(wl.make_args(0)[0]) == ()
    out = tmp_path / "out"
    run = optimize(p, device="cpu", out=out, inputs=specs, backends=["numpy"], time_budget=60, bench_budget_s=0.05)
    assert run.results["original"]["status"] == "ok", run.results["original"]
    script = out / "optimized_specs.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "correctness: PASS" in done.stdout
    dumper = _write(tmp_path, "dump.py", DUMP)
    done = subprocess.run([sys.executable, str(dumper), str(script), str(tmp_path / "args")], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for seed in (7, 101):
        got = np.load(tmp_path / f"args{seed}.npz")
        ours = wl.make_args(seed)
        assert list(got["types"]) == [type(a).__name__ for a in ours]
        for i, a in enumerate(ours):
            b = got[f"arr_{i}"]
            assert b.shape == np.shape(a) and b.dtype == np.asarray(a).dtype, (i, b.shape, np.shape(a))
            assert np.array_equal(b, np.asarray(a))
