"""QA round 5 on the measurement core's Python API (CPU): check(), bench(), compare(), peak_memory's budgets and
roofline.place, called the way users call them."""

import asyncio
import importlib
import math
import warnings

import numpy as np
import pytest
import torch

import gpuspeed
from gpuspeed import bench, check, compare
from gpuspeed.errors import UserError
from gpuspeed.memory import check_budget, plan_chunks
from gpuspeed.roofline.ceilings import Ceiling, Ceilings
from gpuspeed.stats import summarize

place_mod = importlib.import_module("gpuspeed.roofline.place")  # the package's `place` is the function

FAST = dict(budget_s=0.1, device="cpu")


# --- check() ---------------------------------------------------------------------------------------------


def test_check_float64_values_past_1e154_are_judged_on_their_scale():
    # squaring them overflowed: atol and the L2 norms went to inf and inf/inf = NaN failed a right answer
    ref = np.array([1e200, -3e199, 2e200])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warnings either
        right = check(ref * (1 + 1e-14), ref)
        wrong = check(np.array([1e160, 1.1e160]), np.array([1e160, 1e160]))
    assert right.passed, right.summary
    assert right.rel_l2_err == pytest.approx(1e-14, rel=1e-3)
    assert not wrong.passed
    assert math.isfinite(wrong.leaves[0].atol) and wrong.n_over_tol == 1, wrong.summary


def test_check_tiny_values_keep_their_scale():
    # squares under ~1e-324 underflowed to 0: atol (rtol x RMS) became 0 and the small element was judged alone
    ref = np.array([1e-170, 1e-185])
    r = check(ref + np.array([0.0, 1e-190]), ref)
    assert r.passed, r.summary
    assert r.leaves[0].atol == pytest.approx(1e-12 * 1e-170 / math.sqrt(2), rel=1e-6)
    assert r.rel_l2_err == pytest.approx(1e-20, rel=1e-3)


def test_check_keys_message_tells_int_and_str_keys_apart():
    r = check({1: 1.0, "b": 2.0}, {"1": 1.0, "b": 2.0})
    assert not r.passed
    assert "missing '1'" in r.summary and "unexpected 1" in r.summary, r.summary
    assert "['1'] vs ['1']" not in r.summary


def test_check_accepts_a_longdouble_reference():
    ref = np.array([1.0, 2.0], dtype=np.longdouble)
    r = check(np.array([1.0, 2.0], dtype=np.float32), ref)
    assert r.passed and r.leaves[0].rtol == 1e-5, r.summary  # the less precise side, float32, sets it
    assert not check(np.array([1.0, 2.1], dtype=np.float32), ref).passed


def test_check_failure_names_nan_in_the_reference():
    r = check(np.array([1.0, 2.0]), np.array([1.0, np.nan]))
    assert not r.passed
    assert "reference holds 1 NaN" in r.summary and "equal_nan" in r.summary, r.summary
    assert check(np.array([1.0, np.nan]), np.array([1.0, np.nan]), equal_nan=True).passed


@pytest.mark.parametrize("bad", [dict(rtol="1e-3"), dict(atol="0"), dict(rtol=True), dict(atol=b"1")])
def test_check_refuses_non_numeric_tolerances_in_one_line(bad):
    with pytest.raises(UserError, match="must be a number"):
        check(np.ones(3), np.ones(3), **bad)


def test_check_sparse_tensor_is_compared_densely_and_meta_or_strings_refused():
    assert check(torch.eye(3).to_sparse(), torch.eye(3)).passed
    assert not check(torch.eye(3).to_sparse(), 2 * torch.eye(3)).passed
    with pytest.raises(UserError, match="meta tensor"):
        check(torch.empty(3, device="meta"), torch.empty(3))
    with pytest.raises(UserError, match="compares numbers"):
        check(np.array(["a", "b"]), np.array(["a", "b"]))


# --- bench() ---------------------------------------------------------------------------------------------


def _gen(n):
    yield from range(n)


async def _coro():
    return 1


def test_bench_refuses_generator_and_async_functions():
    with pytest.raises(UserError, match="generator"):
        bench(_gen, 10, **FAST)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 'coroutine was never awaited' neither
        with pytest.raises(UserError, match="coroutine"):
            bench(_coro, **FAST)
        with pytest.raises(UserError, match="coroutine"):
            bench(lambda: _coro(), **FAST)  # seen on the first result
    with pytest.raises(UserError, match="generator"):
        bench(lambda: (i for i in range(10)), **FAST)
    assert bench(lambda: list(_gen(10)), **FAST).median > 0  # the suggested form works
    with pytest.raises(UserError, match="generator"):  # peak_memory measured the generator's creation: ~0 B
        gpuspeed.peak_memory(_gen, 10)
    assert asyncio.run(_coro()) == 1


@pytest.mark.parametrize("bad", [dict(warmup_s=float("nan")), dict(warmup_s=-1.0), dict(warmup_s="0.1"),
                                 dict(budget_s="1"), dict(min_samples=3.5), dict(max_samples=float("inf")),
                                 dict(max_noise="0.01"), dict(graph_calls=-5), dict(graph_calls=0),
                                 dict(graph_calls=2.5), dict(kwargs=[("n", 1)]), dict(flush=None),
                                 dict(flush="no")])
def test_bench_option_mistakes_are_one_line(bad):
    with pytest.raises(UserError):
        bench(lambda: None, **(FAST | bad))


def test_bench_checks_numpy_scalar_options_and_takes_good_ones():
    with pytest.raises(UserError, match="warmup_s"):  # a NaN warm-up budget never ran out: it could hang
        bench(lambda: None, warmup_s=np.float64("nan"), budget_s=0.1, device="cpu")
    m = bench(lambda: None, budget_s=np.float64(0.1), warmup_s=np.float32(0.01), min_samples=np.int64(5),
              device="cpu")
    assert m.n >= 5
    assert bench(lambda: None, flush=np.bool_(False), **FAST).n >= 10


# --- compare() -------------------------------------------------------------------------------------------


def _m(scale):
    return summarize([scale * v for v in (1.0, 1.1, 1.0, 1.05, 1.0)], name="x", device="cpu", mode="cpu")


@pytest.mark.parametrize("bad", [dict(confidence=95), dict(confidence=1.0), dict(threshold=-0.5),
                                 dict(n_boot=0)])
def test_compare_option_mistakes_are_one_line(bad):
    with pytest.raises(UserError):
        compare(_m(1.0), _m(0.5), **bad)


def test_compare_needs_measurements():
    with pytest.raises(UserError, match="Measurements"):
        compare(1.0, 0.5)
    with pytest.raises(UserError, match="positive median"):
        compare(_m(1.0), _m(0.0))
    assert compare(_m(1.0), _m(0.5)).verdict == "faster"


# --- memory budgets --------------------------------------------------------------------------------------


@pytest.mark.parametrize("headroom", [15, -0.1, 1.0, float("nan"), "15%"])
def test_headroom_is_a_share_in_0_1(headroom):
    with pytest.raises(UserError, match="headroom"):
        check_budget(2**20, "1GiB", headroom=headroom)
    with pytest.raises(UserError, match="headroom"):
        plan_chunks(1, 2**20, 2, 2**21, "1GiB", headroom=headroom)
    assert check_budget(2**20, "1GiB", headroom=np.float32(0.5)).usable_bytes == 2**29


def test_peak_memory_of_a_non_callable_is_one_line():
    with pytest.raises(UserError, match="callable"):
        gpuspeed.peak_memory(3)


# --- roofline.place --------------------------------------------------------------------------------------


CEIL = Ceilings("cpu", "test", [Ceiling("copy", "memory", 20.0), Ceiling("fp32", "compute", 0.5),
                                Ceiling("bf16", "compute", 2.0)])


def test_place_refuses_an_unknown_unit_and_reads_dtype_names():
    a = torch.randn(32, 32)
    with pytest.raises(UserError, match="unknown compute unit"):
        place_mod.place(torch.mm, a, a, ceilings=CEIL, unit="bogus", **FAST)  # was held to fp32 silently
    p = place_mod.place(torch.mm, a, a, ceilings=CEIL, unit="bfloat16", **FAST)
    assert p.unit == "bf16" and p.compute_ceiling == "bf16"
    assert place_mod.place(torch.mm, a, a, ceilings=CEIL, unit="FP32", **FAST).unit == "fp32"
    with pytest.raises(UserError, match="unknown compute unit"):
        place_mod.locate("k", 1e6, 1e4, 1e-3, CEIL, "fp-32")
    assert place_mod.locate("k", 1e6, 1e4, 1e-3, CEIL, "torch.bfloat16")["compute_ceiling"] == "bf16"


@pytest.mark.parametrize("bad, what", [(dict(flops="1e9"), "flops"), (dict(bytes="1MB"), "bytes"),
                                       (dict(bytes=0.5), "bytes must be"), (dict(flops=True), "flops")])
def test_place_non_numeric_flops_or_bytes_are_one_line(bad, what):
    a = torch.randn(8, 8)
    with pytest.raises(UserError, match=what):
        place_mod.place(torch.mm, a, a, ceilings=CEIL, **bad, **FAST)


def test_place_measures_the_ceilings_of_the_device_it_times_on(monkeypatch):
    seen = []

    def fake(device="auto"):
        seen.append(device)
        return CEIL

    monkeypatch.setattr(place_mod, "cached_ceilings", fake)
    a = torch.randn(8, 8)
    place_mod.place(torch.mm, a, a, **FAST)
    assert seen == ["cpu"]


# --- poison() and verify_function() ----------------------------------------------------------------------


def test_verify_function_with_no_seeds_is_refused_not_a_vacuous_pass():
    make = lambda seed: (np.random.default_rng(seed).random(4),)  # noqa: E731
    from gpuspeed.verify import verify_function

    for seeds in (0, [], ()):
        with pytest.raises(UserError, match="at least one seed"):
            verify_function(lambda x: x * 3, lambda x: x * 2, make, seeds=seeds)  # wrong fn: all([]) read True
    assert [r.passed for r in verify_function(lambda x: x * 2, lambda x: x + x, make, seeds=(1, 2))] == [True, True]


def test_poison_read_only_numpy_is_one_line_and_a_grad_buffer_is_filled():
    with pytest.raises(UserError, match="read-only"):
        gpuspeed.poison(np.broadcast_to(np.zeros(3), (2, 3)))
    buf = gpuspeed.poison(torch.zeros(3, requires_grad=True))
    assert torch.isnan(buf).all() and buf.requires_grad


def test_sample_bounds_error_names_the_values():
    with pytest.raises(UserError, match="min_samples=10, max_samples=5"):  # the default min_samples is the clash
        bench(lambda: None, max_samples=5, **FAST)


# --- clone_tree (rotate=, verify_function's reference copy) ----------------------------------------------


def test_clone_keeps_lazy_conj_and_neg_views():
    from gpuspeed.trees import clone_tree
    from gpuspeed.verify import verify_function

    x = torch.tensor([1 + 2j, 3 - 1j]).conj()  # lazy: the conj bit over unconjugated bytes
    assert torch.equal(clone_tree(x).resolve_conj(), x.resolve_conj())
    y = torch.tensor([1 + 2j, 5j]).conj().imag  # lazy negation
    assert torch.equal(clone_tree(y).resolve_neg(), y.resolve_neg())
    a = torch.tensor([1 + 2j, 3 - 1j])
    ca, cb = clone_tree((a, a.conj()))
    ca[0] = 9
    assert cb.resolve_conj()[0] == 9  # still one buffer
    # the reference ran on a clone that had lost the bit: a right function failed
    results = verify_function(lambda z: z * 2, lambda z: z + z, lambda s: (torch.tensor([1 + 2j, 3 - 1j]).conj(),))
    assert all(r.passed for r in results), [r.summary for r in results]


def test_check_dtype_takes_gpuspeeds_short_names():
    out, ref = np.array([1.0, 2.0 + 5e-3]), np.array([1.0, 2.0])
    assert check(out, ref, dtype="bf16").leaves[0].rtol == 1e-2  # was: no default tolerance for 'bf16'
    assert check(out, ref, dtype="fp16").leaves[0].rtol == 1e-3
    assert not check(out, ref, dtype="fp32").passed


def test_one_pass_iterator_arguments_are_refused_not_timed_empty():
    # the first call used the iterator up: every sample after it timed sum() of nothing
    for arg in ((x for x in range(1000)), map(abs, range(1000)), iter(list(range(1000))),
                zip(range(3), range(3), strict=True)):
        with pytest.raises(UserError, match="one-pass iterator"):
            bench(sum, arg, **FAST)
    with pytest.raises(UserError, match="keyword argument 'it'"):
        bench(lambda it=(): sum(it), kwargs={"it": iter(range(10))}, **FAST)
    assert bench(sum, range(1000), **FAST).median > 0  # a range is re-iterable
    # peak_memory's warm-up used it up in the same way: the measured call saw it empty
    with pytest.raises(UserError, match="one-pass iterator"):
        gpuspeed.peak_memory(lambda it: np.array(list(it)), iter(range(100_000)))
    # host memory: device="auto" would measure the GPU's on a GPU machine, where this NumPy call allocates nothing
    rep = gpuspeed.peak_memory(lambda it: np.array(list(it)), iter(range(100_000)), warmup=0, device="cpu")
    assert rep.peak_bytes > 400_000


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a CUDA device")
@pytest.mark.parametrize("call", [lambda t: t.flush_l2(), lambda t: t.hold_gpu(1e-4),
                                  lambda t: t.record_graph(lambda: None)], ids=["flush_l2", "hold_gpu", "record_graph"])
def test_gpu_only_timing_blocks_say_so_in_one_line_without_a_device(call):
    # torch's own errors were an AssertionError ("Torch not compiled with CUDA enabled") or a RuntimeError
    from gpuspeed import timing

    with pytest.raises(UserError, match=r"needs a CUDA device; none is available here"):
        call(timing)
