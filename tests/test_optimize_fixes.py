"""CPU tests for what the H200 runs of `gpuspeed optimize` showed: the chunk plan of the two-stream pipeline
(two chunks in flight, re-planned from the pipeline's measured peak), torch.compile over a workload module
loaded under a synthetic name, Numba's unsupported constructs and cupy.fuse's reach."""

import importlib.util
import sys
import types

import numpy as np
import pytest

from gpuspeed.memory import HEADROOM
from gpuspeed.optimize import budget
from signal_helpers import at_a_terminal

MiB = 2**20
# pairwise_distance at scale 0.1 (n = m = 3794 points in 3-d, float64) under a 256 MiB budget: per row of `a`
# one chunk holds the (m, 3) difference and its square (91,056 B each) and the (m,) sum (30,352 B)
PER_ITEM = 2 * 91_056 + 30_352
FIXED = 120_000
BUDGET = 256 * MiB


def _peak(size):
    return FIXED + PER_ITEM * size


def test_one_in_flight_plan_overflows_the_two_stream_pipeline():
    # what the H200 run did: a chunk sized for one chunk at a time, run two at a time, needs more than the cap
    one = budget.plan_for_pipeline(118, _peak(118), 237, _peak(237), BUDGET, in_flight=1, max_size=3794)
    assert one.max_chunk and FIXED + 2 * PER_ITEM * one.max_chunk > BUDGET


def test_two_in_flight_plan_fits_the_budget_with_headroom():
    two = budget.plan_for_pipeline(118, _peak(118), 237, _peak(237), BUDGET, in_flight=2, max_size=3794)
    one = budget.plan_for_pipeline(118, _peak(118), 237, _peak(237), BUDGET, in_flight=1, max_size=3794)
    assert two.max_chunk >= 1
    usable = BUDGET * (1 - budget.PIPELINE_SLACK) * (1 - HEADROOM)  # a little slack for per-stream caching
    assert FIXED + 2 * PER_ITEM * two.max_chunk <= usable
    assert FIXED + 2 * PER_ITEM * (two.max_chunk + 1) > usable  # the largest such chunk, not a timid one
    assert two.predicted_peak_bytes == pytest.approx(FIXED + 2 * PER_ITEM * two.max_chunk, rel=1e-6)
    assert 0.45 < two.max_chunk / one.max_chunk < 0.55


def test_pipeline_plan_when_peak_does_not_grow_and_when_nothing_fits():
    flat = budget.plan_for_pipeline(10, 5 * MiB, 20, 5 * MiB, BUDGET, in_flight=2, max_size=500)
    assert flat.max_chunk == 500
    huge = budget.plan_for_pipeline(10, BUDGET, 20, BUDGET + 10 * MiB, BUDGET, in_flight=2, max_size=500)
    assert not huge.max_chunk


def test_replan_from_the_h200_pipeline_peak():
    # the H200 run: the planned chunk's two-stream pipeline measured 254 MiB against the 218 MiB limit (256 MiB,
    # 15 % headroom); 254 MiB is at the cap, where CuPy's pool frees its cache to stay under, so the demand was
    # higher. Re-planned from that peak, the chunk's predicted peak must sit under the limit with room to spare,
    # even if the true per-item cost were what the peak shows at the cap.
    limit = BUDGET * (1 - HEADROOM)
    two = budget.plan_for_pipeline(118, _peak(118), 237, _peak(237), BUDGET, in_flight=2, max_size=3794)
    size = two.max_chunk
    new, why = budget.replan_from_measured(size, 254 * MiB, FIXED, BUDGET, max_size=3794)
    assert 1 <= new < size and "re-planned" in why and "at the cap" in why
    per_item_seen = (254 * MiB - FIXED) / size
    assert FIXED + per_item_seen * new <= limit * budget.REPLAN_TARGET * budget.CAPPED_TARGET + 1
    # what the pipeline really holds per item, two chunks in flight, each the (m, 3) difference, its square and
    # the sum: the new chunk fits that too, with 15 % headroom
    assert FIXED + 2 * PER_ITEM * new <= limit
    # a peak under the limit keeps the chunk; one over it but below the cap aims at REPLAN_TARGET of the limit
    assert budget.replan_from_measured(size, 200 * MiB, FIXED, BUDGET)[0] == size
    mid, why = budget.replan_from_measured(size, 230 * MiB, FIXED, BUDGET)
    assert "at the cap" not in why
    assert FIXED + (230 * MiB - FIXED) / size * mid <= limit * budget.REPLAN_TARGET + 1
    assert FIXED + (230 * MiB - FIXED) / size * (mid + 1) > limit * budget.REPLAN_TARGET  # the largest such
    # a fixed part from a noisy fit (negative, or above the peak) is clamped; the chunk never grows or hits 0
    assert 1 <= budget.replan_from_measured(size, 250 * MiB, -5 * MiB, BUDGET)[0] < size
    assert budget.replan_from_measured(2, 250 * MiB, 300 * MiB, BUDGET)[0] == 1


PAIRWISE = """
import numpy as np

def original(a, b):
    d = a[:, None, :] - b[None, :, :]
    return np.sqrt((d * d).sum(-1)), a.sum(axis=1)
"""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_torch_compile_of_a_module_not_in_sys_modules():
    # dynamo imports the traced function's module by name: a module made with types.ModuleType (or loaded
    # under a synthetic name) failed with ModuleNotFoundError on the H200
    from gpuspeed.optimize.backends import torch_compile

    name = "gpuspeed_test_pw_unregistered"
    sys.modules.pop(name, None)
    mod = types.ModuleType(name)
    exec(PAIRWISE, mod.__dict__)
    impl = torch_compile.build(mod, device="cpu", compile_backend="eager")
    rng = np.random.default_rng(0)
    args = (rng.standard_normal((40, 3)), rng.standard_normal((7, 3)))
    got = impl(*args)
    want = mod.original(*args)
    assert sys.modules[mod.__name__] is mod
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_importable_renames_a_clash_instead_of_replacing():
    from gpuspeed.optimize.backends.common import importable

    mod = types.ModuleType("json")  # a name another module holds
    importable(mod)
    assert sys.modules["json"] is not mod and mod.__name__ != "json" and sys.modules[mod.__name__] is mod
    del sys.modules[mod.__name__]


EXPLICIT_F64 = """
import numpy as np

def original(grid, alpha):
    u = np.array(grid, dtype=np.float64)  # an explicit float64 working copy, as users write it
    u[1:-1] = u[1:-1] + alpha * (u[:-2] + u[2:] - 2.0 * u[1:-1])
    return u, np.zeros(3, dtype=np.float64)
"""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_torch_compile_fp32_demotes_explicit_float64():
    # on the H200 the fp32 torch.compile candidate of heat_stencil ran as fast as the float64 one: the code's
    # own dtype=np.float64 kept it in double precision
    from gpuspeed.optimize.backends import torch_compile

    mod = types.ModuleType("gpuspeed_test_explicit_f64")
    exec(EXPLICIT_F64, mod.__dict__)
    rng = np.random.default_rng(1)
    args = (rng.random(50), 0.2)
    impl = torch_compile.build(mod, device="cpu", precision="float32", compile_backend="eager")
    got = impl(*args)
    assert [g.dtype for g in got] == [np.float32, np.float32]
    want = types.ModuleType("gpuspeed_test_explicit_f64_ref")
    exec(EXPLICIT_F64, want.__dict__)
    np.testing.assert_allclose(got[0], want.original(*args)[0], rtol=1e-5, atol=1e-6)
    whole = torch_compile.build(want, device="cpu", compile_backend="eager")(*args)  # as written: float64 stays
    assert whole[0].dtype == np.float64


ALLOCATES = """
import numpy as np
TOLERANCE = dict(rtol=1e-5, atol=1e-6)
def original(x):
    big = np.repeat(x[None, :], 64, axis=0)  # 64 x 16,384 float64: 8 MiB held during the call
    return big.sum(axis=0)
def inputs(rng):
    return (rng.standard_normal(16_384),)
"""


def test_original_worker_checks_once_and_measures_memory_on_that_call(tmp_path):
    # the original is the reference: one check seed, and that call is its memory pass (no extra call)
    from gpuspeed.optimize.pipeline import optimize

    p = tmp_path / "alloc.py"
    p.write_text(ALLOCATES)
    run = optimize(p, device="cpu", out=tmp_path / "out", backends=["numpy"], time_budget=120, bench_budget_s=0.2)
    orig = run.results["original"]
    assert orig["status"] == "ok" and len(orig["checks"]) == 1
    assert "memory" not in orig["stage_s"]
    assert orig["peak_bytes"] >= 8 * 2**20
    assert orig["device_time"]["n"] >= 3
    numpy32 = run.results["numpy-fp32"]
    assert numpy32["status"] == "ok" and len(numpy32["checks"]) == 3  # candidates still check every seed


def test_static_positions_are_the_integer_arguments():
    # JAX traced heat_stencil's `steps` and failed at range(steps): integers become jit constants
    from gpuspeed.optimize.backends.common import static_positions

    assert static_positions((np.ones(3), 0.2, 40)) == (2,)
    assert static_positions((np.int64(5), True, "edge", 1.5, np.float64(2.0), np.ones(2))) == (0, 1, 2)
    assert static_positions(()) == ()


def _module(name, src):
    mod = types.ModuleType(name)
    exec(src, mod.__dict__)
    return mod


STENCIL = """
import numpy as np

def original(grid, alpha, steps):
    u = np.array(grid, dtype=np.float64)  # heat_stencil's working copy: np.array of an array, with a dtype
    for _ in range(steps):
        lap = u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4.0 * u[1:-1, 1:-1]
        u[1:-1, 1:-1] = u[1:-1, 1:-1] + alpha * lap
    return u
"""

BROADCAST = """
import numpy as np

def original(x, w):
    mean = (x * w).sum(axis=1) / w.sum()
    return ((x - mean[:, None]) ** 2).sum(axis=1)  # a length-1 axis broadcast: parallel=True rejects it
"""

UNSUPPORTED = """
import numpy as np

def original(x):
    return np.apply_along_axis(np.sort, 1, x)
"""


def test_numba_candidate_compiles_an_array_copy_and_falls_back_on_a_broadcast():
    pytest.importorskip("numba")
    from gpuspeed.optimize.backends import numba_cpu

    rng = np.random.default_rng(3)
    grid = rng.random((37, 29))  # odd sizes
    ref = _module("st_ref", STENCIL).original(grid, 0.2, 5)
    impl = numba_cpu.build(_module("st_nb", STENCIL))
    out = impl(grid, 0.2, 5)
    assert not np.shares_memory(out, grid) and np.allclose(out, ref, rtol=1e-12, atol=0)
    assert "parallel=True" in impl.label

    x, w = rng.standard_normal((33, 17)), rng.uniform(0.5, 1.5, 17)
    impl = numba_cpu.build(_module("bc_nb", BROADCAST))
    out = impl(x, w)
    assert np.allclose(out, _module("bc_ref", BROADCAST).original(x, w), rtol=1e-12, atol=0)
    assert "serial" in impl.label and any("rejected a broadcast" in n for n in impl.notes)
    out2 = impl(x[:5], w)  # the serial version serves later calls (new shapes too)
    assert np.allclose(out2, _module("bc_ref2", BROADCAST).original(x[:5], w), rtol=1e-12, atol=0)


def test_numba_unsupported_construct_is_unavailable_with_its_reason():
    pytest.importorskip("numba")
    from gpuspeed.optimize import worker
    from gpuspeed.optimize.backends import numba_cpu

    impl = numba_cpu.build(_module("un_nb", UNSUPPORTED))
    with pytest.raises(ImportError) as info:
        impl(np.random.default_rng(0).standard_normal((5, 4)))
    assert worker.classify(info.value) == "unavailable"
    assert "Numba nopython mode cannot compile original" in str(info.value)
    assert "apply_along_axis" in str(info.value)


def _from_file(tmp_path, name, src):
    path = tmp_path / f"{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cupy_fuse_is_planned_only_for_whole_array_code(tmp_path):
    from gpuspeed.optimize.candidates import fuse_applies

    assert fuse_applies(_from_file(tmp_path, "f1", "def original(x, y):\n    return (x * y + 1.0).sum()\n").original)[0]
    assert not fuse_applies(_from_file(tmp_path, "f2", STENCIL).original)[0]  # heat_stencil's trace failure
    ok, why = fuse_applies(_from_file(tmp_path, "f4", "def original(x):\n    return x[1:] - x[:-1]\n").original)
    assert not ok and "slices" in why
    ok, why = fuse_applies(_from_file(tmp_path, "f3", "def original(x):\n    s = 0.0\n    for v in x:\n"
                                                      "        s += v\n    return s\n").original)
    assert not ok and "loops" in why


SLOW = """
import time
import numpy as np

def original(x):
    time.sleep(0.4)  # slow enough that its worker is still running when the run is stopped
    return x * 2.0

def inputs(rng):
    return (rng.standard_normal(17),)
"""


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_stopped_optimize_run_stops_its_workers(tmp_path):
    # benchmarks/optimize.py --limit (or `timeout`) stops an example with SIGTERM: its workers, each in its own
    # process group, must not outlive it holding the device
    import json
    import os
    import signal
    import subprocess
    import time

    wl = tmp_path / "slow.py"
    wl.write_text(SLOW)
    out = tmp_path / "o"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in ["src", os.environ.get("PYTHONPATH")] if p))
    proc = subprocess.Popen([sys.executable, "-m", "gpuspeed", "optimize", str(wl), "--device", "cpu", "--out",
                             str(out), "--time-budget", "120"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, preexec_fn=at_a_terminal)
    pids, t0 = [], time.monotonic()
    while not pids and time.monotonic() - t0 < 60 and proc.poll() is None:
        time.sleep(0.2)
        for f in (out / "work").glob("*.result.json") if (out / "work").is_dir() else []:
            try:
                pid = json.loads(f.read_text()).get("pid")
            except (json.JSONDecodeError, OSError):
                continue
            if pid and _alive(pid):
                pids.append(pid)
    assert pids, "no worker started"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    # one line says so, and what is kept (it exited 143 in silence); 143 as a shell reports a SIGTERM
    said = [ln for ln in err.splitlines() if ln.startswith("gpuspeed: ")]
    assert proc.returncode == 143 and "Traceback" not in err, (proc.returncode, err[-3000:])
    assert said == ["gpuspeed: stopped by SIGTERM: the candidates measured are kept; the same command with --resume "
                    "goes on from them"], err[-3000:]
    time.sleep(0.5)
    assert not [p for p in pids if _alive(p)]


def test_benchmark_limit_starts_nothing_it_cannot_finish(tmp_path):
    import json
    import subprocess

    r = subprocess.run([sys.executable, "benchmarks/optimize.py", "--out", str(tmp_path), "--device", "cpu",
                        "--examples", "row_normalize_loop,histogram", "--limit", "5"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "optimize.json").read_text())
    assert [row["example"] for row in doc["rows"]] == ["row_normalize_loop", "histogram"]
    assert all(not row["ok"] and "limit" in row["error"][0] for row in doc["rows"])
    assert doc["params"]["limit_s"] == 5 and doc["summary"]["examples"] == 2


def test_a_run_sharing_the_lock_waits_for_a_measurement_before_its_host_work(held_lock_run):
    # benchmarks/optimize.py runs examples side by side under one lock: a run's own host work (references,
    # hotspots) must not run while another run's candidate holds the measure slot
    import time

    proc, out = held_lock_run.start(60)
    time.sleep(6)
    started = (out / "run.json").exists()
    held_lock_run.release()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert not started  # nothing computed while the measurement held the lock
    assert (out / "report.md").is_file()


FLOAT32_VARIANT = """
import numpy as np
TOLERANCE = dict(rtol=1e-5, atol=1e-6)
def original(x, s):
    return x * s + 1.0
def inputs(rng):
    return rng.standard_normal(1001), 0.5
def half(x, s):
    assert x.dtype == np.float32 and type(s) is float, (x.dtype, type(s))  # cast before the call, as demoted ones are
    return x * np.float32(s) + np.float32(1.0)
half.precision = "float32"
def plain(x, s):
    assert x.dtype == np.float64, x.dtype  # no declaration: the original's float64
    return x * s + 1.0
variants = {"half": half, "plain": plain}
"""


def test_a_variant_declaring_float32_takes_the_demoted_candidates_path(tmp_path):
    # fn.precision = "float32": inputs cast to float32 before the call, outputs cast back to the original's float64
    # (else the dtype check would reject it), judged under the workload's tolerance, labelled float32
    from gpuspeed.optimize.pipeline import optimize

    p = tmp_path / "f32v.py"
    p.write_text(FLOAT32_VARIANT)
    run = optimize(p, device="cpu", out=tmp_path / "out", backends=["variant"], time_budget=120, bench_budget_s=0.1)
    half, plain = run.results["variant:half"], run.results["variant:plain"]
    assert half["status"] == "ok", half.get("reason")
    assert half["precision"] == "float32" and "float32" in half["label"]
    assert 0 < half["rel_l2_err"] < 1e-6  # float32 rounding shows, within the tolerance
    assert plain["status"] == "ok" and plain["precision"] == "as-written" and plain["max_abs_err"] == 0
    # a tolerance float32 cannot meet: the float32 variant is rejected by its check, as a demoted candidate would be
    tight = optimize(p, device="cpu", out=tmp_path / "tight", backends=["variant"], rtol=1e-12, atol=0.0,
                     time_budget=120, bench_budget_s=0.1)
    assert tight.results["variant:half"]["status"] == "incorrect"
    assert tight.results["variant:plain"]["status"] == "ok"


def test_a_float32_variant_taking_torch_inputs_gets_float32_tensors_and_returns_the_originals_dtype():
    # the hand kernels' path (gpuspeed_inputs = "torch"): cast on the host, then moved once; fetch casts back
    torch = pytest.importorskip("torch")
    from gpuspeed.optimize.backends import variant

    seen = []

    def kernel(x, steps):
        seen.append((x.dtype, type(steps)))
        return x * 2.0
    kernel.gpuspeed_inputs, kernel.precision = "torch", "float32"
    module = types.SimpleNamespace(variants={"k": kernel})
    x = np.random.default_rng(5).standard_normal((7, 13))
    impl = variant.build(module, precision="float32", out_dtypes=["float64"], variant="k", device="cpu")
    dev = impl.prepare((x, 3))
    assert dev[0].dtype == torch.float32 and dev[1] == 3
    out = impl.fetch(impl.run(*dev))
    assert out.dtype == np.float64 and seen == [(torch.float32, int)]
    np.testing.assert_allclose(out, x * 2.0, rtol=1e-6)
    assert "float32" in impl.label
    plain = variant.build(module, variant="k", device="cpu")  # as written: float64 in and out, as before
    assert plain.prepare((x, 3))[0].dtype == torch.float64 and plain.fetch(plain.run(*plain.prepare((x, 3)))).dtype == np.float64


def test_a_numpy_scalar_argument_saved_as_a_0d_array_is_unchanged():
    # the worker saves each argument as a host array: np.float64(0.5) comes back as a 0-d array, which is the
    # same input (a host-input variant given a NumPy scalar was rejected as mutating its inputs)
    from gpuspeed.optimize.workload import same_inputs

    x = np.arange(5.0)
    assert same_inputs((np.array(x, copy=True), np.array(np.float64(0.5))), (x, np.float64(0.5)))
    assert not same_inputs((np.array(x, copy=True), np.array(np.float64(0.5))), (x, np.float64(0.25)))
    y = x.copy()
    y[2] = -1
    assert not same_inputs((np.array(x, copy=True), np.float64(0.5)), (y, np.float64(0.5)))


SLOW_VARIANT = """
import time
import numpy as np
def original(x):
    return x * 2.0
def inputs(rng):
    return (rng.standard_normal(1000),)
def slow(x):
    time.sleep(120)  # never finishes within the run's time budget
    return x * 2.0
def fast(x):
    return x + x
variants = {"fast": fast, "slow": slow}  # one job at a time on the CPU: fast first
"""


def test_the_time_budget_bounds_the_whole_run_and_stops_a_candidate_still_running_at_its_end(tmp_path):
    # --time-budget is the whole run (H200: examples took 6.1 min under the default 300 s, lock waits uncounted):
    # a candidate still running at the deadline is stopped and recorded, the others and the report are kept
    import time

    from gpuspeed.optimize.pipeline import REPORT_RESERVE_S, optimize

    p = tmp_path / "slow.py"
    p.write_text(SLOW_VARIANT)
    t0 = time.perf_counter()
    # 30 s: the candidates' deadline at 15 s (the half of the budget), ample for the original and fast
    run = optimize(p, device="cpu", out=tmp_path / "out", backends=["variant"], time_budget=30, bench_budget_s=0.1)
    elapsed = time.perf_counter() - t0
    assert elapsed < 30, elapsed
    slow = run.results["variant:slow"]
    assert slow["status"] == "timeout" and "time budget" in slow["reason"]
    assert run.results["variant:fast"]["status"] == "ok"
    assert run.results["original"]["status"] == "ok"
    assert (tmp_path / "out" / "report.md").is_file() and elapsed > max(30 - REPORT_RESERVE_S, 30 / 2) - 10


def test_numba_candidate_compiles_helpers_imported_from_a_file_beside_the_workload(tmp_path, monkeypatch):
    """`from nb_helpers import scaled` in the workload: Numba must compile the user's own helper too (nopython
    mode rejects a call to a plain Python function: "Untyped global name"), but never a library's function."""
    pytest.importorskip("numba")
    from gpuspeed.loading import load_module
    from gpuspeed.optimize.backends import numba_cpu

    (tmp_path / "nb_helpers.py").write_text("import numpy as np\n\ndef scaled(row):\n    return np.exp(row) * 2.0\n")
    (tmp_path / "nb_work.py").write_text(
        "import numpy as np\nfrom numpy.linalg import norm\nfrom nb_helpers import scaled\n\n"
        "def original(x):\n    out = np.empty_like(x)\n    for i in range(x.shape[0]):\n"
        "        out[i] = scaled(x[i]) / (1.0 + np.abs(x[i]).sum())\n    return out\n")
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_module puts tmp_path on it
    x = np.random.default_rng(5).standard_normal((13, 7))
    ref = load_module(tmp_path / "nb_work.py", "nb_work_ref").original(x)
    mod = load_module(tmp_path / "nb_work.py", "nb_work_jit")
    out = numba_cpu.build(mod)(x)
    assert np.allclose(out, ref, rtol=1e-12, atol=0)
    assert hasattr(mod.scaled, "py_func")  # compiled, bound in the workload only
    assert not hasattr(sys.modules["nb_helpers"].scaled, "py_func")  # the neighbour module is untouched
    assert not hasattr(mod.norm, "py_func")  # a library's function is left alone


def test_a_float_where_the_original_returns_an_int_is_a_structure_problem():
    from gpuspeed.optimize.worker import _structure_problem

    assert "the original returns int" in _structure_problem(1000001.0, 1000000)
    assert _structure_problem(np.int64(7), 7) is None and _structure_problem((3, 1.5), (3, 1.5)) is None


def test_a_speedup_from_unreliable_timings_carries_a_caveat():
    import types

    from gpuspeed.optimize.pipeline import _timing_caveats

    noisy = {"unreliable": True, "notes": ["unreliable: IQR/median is 90% beside a median error of 40%"]}
    run = types.SimpleNamespace(results={
        "original": {"device_time": noisy},
        "fast": {"name": "fast", "device_time": {}, "speedup": {"speedup": 15.6, "ci_low": 0.01, "ci_high": 197,
                                                                  "verdict": "same"}},
        "clean": {"name": "clean", "device_time": {}, "speedup": {"speedup": 3, "ci_low": 2.9, "ci_high": 3.1,
                                                                    "verdict": "faster"}}})
    said = _timing_caveats(run, run.results["fast"], "device_time")
    assert "original's timing is unreliable: IQR/median is 90%" in said[0] and "not established" in said[1]
    run.results["original"]["device_time"] = {}
    assert _timing_caveats(run, run.results["clean"], "device_time") == []


def test_a_generator_result_and_a_nan_scale_are_one_line_errors(tmp_path, capsys):
    from gpuspeed.cli import main

    (tmp_path / "gen_wl.py").write_text("import numpy as np\n\ndef original(x):\n    return (v for v in x)\n\n"
                                        "def inputs(rng, scale=1.0):\n    return (rng.standard_normal(int(10 * scale)),)\n")
    assert main(["optimize", str(tmp_path / "gen_wl.py"), "--device", "cpu", "--out", str(tmp_path / "o")]) == 2
    assert "returned a generator" in capsys.readouterr().err
    assert main(["optimize", str(tmp_path / "gen_wl.py"), "--device", "cpu", "--scale", "nan",
                 "--out", str(tmp_path / "o")]) == 2
    assert "--scale must be a positive finite number" in capsys.readouterr().err


@pytest.mark.parametrize("make", [
    lambda: np.empty(()),  # CuPy's float(x[i]) / complex(...) on a 0-d device array makes one of these
    lambda: np.empty((3, 4), order="F"),
    lambda: np.empty_like(np.zeros((2, 3, 4)).transpose(2, 0, 1)),  # neither C- nor F-contiguous
    lambda: np.empty(5, dtype=np.int32),
    lambda: np.empty(3, dtype=np.complex64),
    lambda: np.empty(2, dtype=[("a", "f8"), ("b", "i4")]),
], ids=["0-d", "fortran", "permuted", "int32", "complex64", "structured"])
def test_poisoned_numpy_empty_fills_any_shape_and_layout(make):
    """The H200 run: CuPy's scalar conversion allocates a 0-d host array through np.empty, and the correctness
    runs' poisoning (a.view(np.uint8)) raised on it, so the CuPy candidate of a per-element loop failed."""
    from gpuspeed.optimize.worker import _Poison

    with _Poison(torch_fill=False):
        a = make()
    flat = a.ravel()
    for name in a.dtype.names or (None,):
        v = flat[name] if name else flat
        assert (np.isnan(v) if v.dtype.kind in "fc" else v == -1).all(), (name, v)
    assert np.empty.__module__ == "numpy"  # outside the context np.empty is NumPy's own again
    with _Poison(torch_fill=False):
        objects = np.empty(2, dtype=object)  # left alone: no byte pattern means anything there
    assert list(objects) == [None, None]


def test_pipeline_plan_when_the_first_measured_peak_is_the_larger():
    # the H100 run at 194c40c: pairwise_distance on CuPy under 256 MiB measured a larger peak at the smaller chunk
    # (a first-use cost), so the line fell; doubling its falling slope for two chunks in flight made a negative
    # "peak" (-85 MB) that plan_chunks refused, and the chunked candidate ended as an error instead of running
    fell = budget.plan_for_pipeline(118, 150 * MiB, 237, 40 * MiB, BUDGET, in_flight=2, max_size=3794)
    assert fell.max_chunk == 3794  # what was measured fits: the peak does not grow with the chunk
    assert fell.predicted_peak_bytes == 150 * MiB  # judged by the larger measured peak, never a negative one
    over = budget.plan_for_pipeline(118, BUDGET, 237, 40 * MiB, BUDGET, in_flight=2, max_size=3794)
    assert not over.max_chunk


def test_a_pair_of_chunk_peaks_that_does_not_grow_is_measured_again_and_keeps_the_lower_readings():
    # the H100 GPU suite (six test processes on one GPU): NVML's device-wide count put another process's memory into
    # the smaller chunk's peak, the pair fell, and the plan made the whole input one chunk (432 MiB over 218)
    readings = {118: [150 * MiB, _peak(118)], 237: [_peak(237), _peak(237) + 3 * MiB]}
    pa, pb, note = budget.measured_pair(lambda size: readings[size].pop(0), 118, 237)
    assert (pa, pb) == (_peak(118), _peak(237)) and "measured twice" in note
    two = budget.plan_for_pipeline(118, pa, 237, pb, BUDGET, in_flight=2, max_size=3794)
    assert 1 <= two.max_chunk < 3794
    grows = {118: [_peak(118)], 237: [_peak(237)]}  # a growing pair is measured once
    assert budget.measured_pair(lambda size: grows[size].pop(0), 118, 237) == (_peak(118), _peak(237), "")
