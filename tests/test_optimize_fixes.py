"""CPU tests for what the first H200 run of `gpuspeed optimize` showed: the chunk plan of the two-stream
pipeline (two chunks in flight) and torch.compile over a workload module loaded under a synthetic name."""

import importlib.util
import sys
import types

import numpy as np
import pytest

from gpuspeed.memory import HEADROOM
from gpuspeed.optimize import budget

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
