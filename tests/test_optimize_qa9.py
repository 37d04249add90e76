"""`gpuspeed optimize` as a demanding user drives it (QA pass 9), CPU only: a 0-d `--input x=float64[]` is the same
0-d array in the run and in the emitted script."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

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
    run = optimize(p, device="cpu", out=out, inputs=specs, backends=["numpy"], time_budget=180, bench_budget_s=0.05)
    assert run.results["original"]["status"] == "ok", run.results["original"]
    # --resume under other settings names the one that differs (it said only "another workload or settings")
    import pytest

    from gpuspeed.errors import UserError

    with pytest.raises(UserError, match=r"input_specs .*'x=float64\[\]'.* there, .*'x=float64\[1\]'.* now"):
        optimize(p, device="cpu", out=out, inputs=["x=float64[1]"] + specs[1:], backends=["numpy"], resume=True)
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


TIMED_WHERE = '''
import numpy as np


def original(x):
    return np.tanh(x) * 2.0


def plain(x):
    return np.tanh(x) + np.tanh(x)


variants = {"plain": plain}
TOLERANCE = dict(rtol=1e-4)  # NumPy in float32 is tried too


def inputs(rng):
    return (rng.standard_normal(3000),)
'''


def _load_script(path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"emitted_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_emitted_benchmark_times_where_the_chosen_candidate_runs_not_by_its_label(tmp_path):
    # the script chose CUDA events vs the host clock by `"CPU" not in how`: "PyTorch on cpu (...)" and "user variant
    # 'plain' (numpy inputs)" read as GPU work. It now asks the built implementation where it runs (its device)
    from gpuspeed.optimize import worker

    p = _write(tmp_path, "where.py", TIMED_WHERE)
    out = tmp_path / "out"
    run = optimize(p, device="cpu", out=out, backends=["numpy", "variant"], time_budget=180, bench_budget_s=0.05)
    script = _load_script(out / "optimized_where.py")
    wl = W.load(p, gpu=False)
    want = {"original": "cpu", "numpy-fp32": "cpu", "variant:plain": "host"}
    assert set(want) <= set(run.results), sorted(run.results)
    for name, row in run.results.items():
        if row.get("status") != "ok":
            continue
        impl = worker.build({"recipe": dict(row["recipe"]), "device": "cpu"}, wl, W.import_workload(p, unique=True))
        assert script.timing_device(impl) == want[name], (name, row.get("label"))
    fn, how = script.build_optimized()
    assert script.timing_device(fn) == want[run.choice["primary"]], how
    # what a GPU run builds: an Impl on cuda, and the in-place wrapper around it, time on the GPU's clock
    on_gpu = script.Impl(lambda x: x, device="cuda")
    assert script.timing_device(on_gpu) == "cuda"
    assert script.timing_device(script.in_place_call(on_gpu, [0])) == "cuda"
    assert script.timing_device(script.in_place_call(script.Impl(lambda x: x, device="host"), [0])) == "host"


MEMO = '''
import functools

import numpy as np


def original(x):
    y = x
    for _ in range(20):
        y = np.sin(y) + 0.5 * np.cos(y)
    return y


_by_id = {}


def by_id(x):  # a dict keyed on the argument's id(): every timing call after the first is a lookup
    if id(x) not in _by_id:
        _by_id[id(x)] = original(x)
    return _by_id[id(x)]


@functools.lru_cache(maxsize=64)
def _cached(key):
    return original(np.frombuffer(key, dtype=np.float64))


def by_value(x):  # functools.lru_cache on the bytes: a copy of the same values hits too
    return _cached(x.tobytes())


variants = {"by_id": by_id, "by_value": by_value}


def inputs(rng):
    return (rng.standard_normal(5000),)
'''


def test_a_variant_that_caches_its_results_by_input_is_not_timed_on_cache_hits(tmp_path):
    # bench() calls a candidate again and again on the same arguments: a variant caching its result by id() or by
    # value was timed on lookups, 59000x "faster" than the original it calls. Its time is now that of calls on
    # inputs it has not seen, and the choice says so
    p = _write(tmp_path, "memo.py", MEMO)
    run = optimize(p, device="cpu", out=tmp_path / "out", backends=["variant"], time_budget=180, bench_budget_s=0.1)
    orig = run.results["original"]["device_time"]["median"]
    for name in ("variant:by_id", "variant:by_value"):
        r = run.results[name]
        assert r["status"] == "ok", r
        # it calls the original on a miss: no faster than it, give or take the noise of a few calls
        assert r["device_time"]["median"] > orig / 3, (name, r["device_time"]["median"], orig)
        assert r["e2e_time"]["median"] > orig / 3, (name, r["e2e_time"]["median"], orig)
        assert r["speedup"]["speedup"] < 3, r["speedup"]
        assert r["caches_results"]["repeated_median"] * 20 < r["caches_results"]["fresh_median"], r["caches_results"]
    # an honest candidate is probed too, and left as it was timed
    assert "timing (fresh inputs)" in run.results["original"]["stage_s"], run.results["original"]["stage_s"]
    assert "caches_results" not in run.results["original"]
    if run.choice["primary"] != "original":
        assert any("caches its results" in c for c in run.choice["caveats"]), run.choice


DICTS = '''
import numpy as np


def same_types(x):
    out = {}
    out["double"] = x * 2.0
    out["plus_one"] = x + 1.0
    return out


def mixed_types(x):
    return {"double": x * 2.0, "total": x.sum()}


def inputs(rng):
    return (rng.standard_normal(257),)
'''


def test_numba_of_an_original_returning_a_dict(tmp_path):
    # a dict of arrays came back from Numba as a numba.typed.Dict: the check read one opaque value, "WRONG
    # shape/dtype: returns 1 values, the original 2", for a right answer. A dict of mixed value types cannot come
    # back at all ("TypeError: cannot convert native LiteralStrKey[Dict]... to Python object"): it was 'failed', read
    # as a crash, where it is a construct Numba cannot return (unavailable, as its typing errors are)
    import pytest

    pytest.importorskip("numba")
    from gpuspeed.optimize import worker
    from gpuspeed.optimize.backends import numba_cpu
    from gpuspeed.verify import check

    p = _write(tmp_path, "dicts.py", DICTS)
    x = np.random.default_rng().standard_normal(257)
    module = W.import_workload(p, unique=True)
    want = module.same_types(x)
    got = numba_cpu.build(W.import_workload(p, unique=True), func="same_types")(x)
    assert type(got) is dict and list(got) == list(want)
    assert worker._structure_problem(got, want) is None
    assert check(got, want).passed
    impl = numba_cpu.build(W.import_workload(p, unique=True), func="mixed_types")
    with pytest.raises(ImportError) as err:
        impl(x)
    assert worker.classify(err.value) == "unavailable"
    assert "cannot return mixed_types's result" in str(err.value) and "differ in type" in str(err.value)


def test_an_input_name_the_function_lacks_is_a_one_line_error_not_a_positional_stand_in(tmp_path):
    # slow(a, b) with --input a --input c: c was passed as b by position (a typo went unseen); names that all
    # differ from the parameters (x, y for a, b) still pass by position, in the order given
    f = tmp_path / "u.py"
    f.write_text("import numpy as np\ndef slow(a, b):\n    return np.sqrt(a * a + b * b)\n")
    with pytest.raises(W.UserError, match=r"--input c: slow has no parameter 'c' \(its parameters: a, b\)"):
        W.load(f, func="slow", input_specs=["a=float64[8]", "c=float64[8]"], gpu=False)
    wl = W.load(f, func="slow", input_specs=["x=float64[8]", "y=float64[3,1]"], gpu=False)
    assert [a.shape for a in wl.make_args(1)] == [(8,), (3, 1)]
    wl = W.load(f, func="slow", input_specs=["b=float64[3,1]", "a=float64[8]"], gpu=False)  # named: by name
    assert [a.shape for a in wl.make_args(1)] == [(8,), (3, 1)]


def test_file_colon_name_points_to_func(tmp_path):
    f = tmp_path / "u.py"
    f.write_text("def slow(a):\n    return a\n")
    with pytest.raises(W.UserError, match=rf"use {f} --func slow"):
        W.resolve_path(f"{f}:slow")
