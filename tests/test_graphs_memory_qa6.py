"""QA round 6 on graphs.capture() / Graphed, graph_breaks.explain() and memory's budgets, peak_memory and chunk planner.

Each test failed before its fix; CPU unless marked gpu.
"""

import logging
import warnings

import numpy as np
import pytest
import torch

from gpuspeed import graph_breaks, graphs, memory
from gpuspeed.errors import UserError


def _eager(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return graphs.capture(fn, *args, device="cpu", **kw)


# --- budgets ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["0.5B", "0.1 B", "0.00000001%"])
def test_a_budget_under_one_byte_is_refused_not_read_as_zero(bad):
    with pytest.raises(UserError, match="under one byte"):
        memory.parse_budget(bad, 1000)  # was 0 B: "nothing fits" from a typo
    assert memory.parse_budget("1B", 1000) == 1 and memory.parse_budget("1%", 1000) == 10


@pytest.mark.parametrize("bare", [1048575, 123456.7])
def test_the_unit_suggested_for_a_bare_number_is_a_budget_parse_budget_reads(bare):
    with pytest.raises(UserError) as info:
        memory.parse_budget(bare)
    suggested = str(info.value).split("(or '")[1].split("'")[0]  # the bytes spelling it offers
    assert memory.parse_budget(suggested) == int(bare)  # '1.04858e+06B' was offered, and refused
    with pytest.raises(UserError, match="'8.5GiB'"):
        memory.parse_budget(np.float32(8.5))


@pytest.mark.parametrize("peak", [float("nan"), float("inf"), "5", None, -1, True])
def test_check_budget_refuses_a_peak_that_is_not_a_byte_count(peak):
    with pytest.raises(UserError, match="peak"):  # NaN: ValueError traceback; "5": TypeError; -1: "peak 0 B fits"
        memory.check_budget(peak, "1GiB")
    assert memory.check_budget(np.int64(2**20), "1GiB").fits


def test_peak_memory_takes_a_numpy_whole_number_of_warmups_and_refuses_kwargs_that_are_no_dict():
    calls = []
    rep = memory.peak_memory(lambda: calls.append(1), device="cpu", warmup=np.int64(2))
    assert rep.warmup == 2 and type(rep.warmup) is int and len(calls) == 3
    with pytest.raises(UserError, match="kwargs"):  # was AttributeError: 'list' object has no attribute 'items'
        memory.peak_memory(lambda *, n: n, kwargs=[("n", 1)], device="cpu")
    assert memory.peak_memory(lambda *, n: np.ones(n), kwargs={"n": 10}, device="cpu").device == "cpu"


# --- chunk planner ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [dict(max_size=0), dict(max_size=-5), dict(max_size=2.5), dict(size_a=1000.5),
                                dict(size_a=True), dict(size_a="1000"), dict(peak_a=float("nan")),
                                dict(peak_b=float("inf")), dict(peak_a=-5)])
def test_plan_chunks_refuses_sizes_and_peaks_that_are_not_counts(kw):
    args = dict(size_a=1000, peak_a=104e6, size_b=3000, peak_b=112e6, budget="1GB") | kw
    with pytest.raises(UserError):  # max_size=0 said "the fixed part is too large"; NaN raised ValueError
        memory.plan_chunks(**args)


def test_plan_chunks_without_growth_judges_the_measured_peaks():
    # a falling pair (noise): both measured peaks fit, the line's value at 0 items does not: a chunk fits
    plan = memory.plan_chunks(1000, 840e6, 2000, 700e6, "1GB", max_size=10_000)
    assert plan.max_chunk == 10_000 and plan.predicted_peak_bytes == 840e6
    # flat and over the budget: nothing fits, said as 0 (None reads as "unbounded")
    over = memory.plan_chunks(1000, 2e9, 3000, 2e9, "1GB")
    assert over.max_chunk == 0 and over.predicted_peak_bytes is None and "exceeds" in over.note
    flat = memory.plan_chunks(1000, 1e6, 3000, 1e6, "1GB")
    assert flat.max_chunk is None and flat.predicted_peak_bytes == 1e6
    tiny = memory.plan_chunks(1, 0, 2, 1e-300, "1GB")  # was OverflowError: cannot convert float infinity
    assert tiny.max_chunk is None


# --- capture() ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [dict(warmup=-1), dict(warmup=1.5), dict(warmup="3"), dict(max_cache="8"),
                                dict(max_cache=1.5), dict(max_cache=True)])
def test_capture_refuses_a_warmup_or_cache_size_that_is_not_a_count(kw):
    with pytest.raises(UserError, match="warmup|max_cache"):  # -1 ran no warm-up, "8" raised TypeError
        _eager(lambda x: x + 1, torch.ones(2), **kw)
    assert _eager(lambda x: x + 1, torch.ones(2), warmup=np.int64(1), max_cache=np.int64(2)).max_cache == 2


def _gen(x):
    yield x * 2


async def _coro(x):
    return x * 2


@pytest.mark.parametrize("fn", [_gen, _coro])
def test_capture_refuses_generator_and_async_functions(fn):
    with pytest.raises(UserError, match="does its work only when consumed"):  # was a graph of nothing
        _eager(fn, torch.ones(2))


def test_clone_true_holds_in_eager_mode():
    state = torch.zeros(3)

    def accumulate(x):  # returns its own state, as a step updating a cache in place would
        state.add_(x)
        return state, {"in": x}

    g = _eager(accumulate, torch.ones(3), clone=True)
    x = torch.ones(3)
    first, extra = g(x)
    g(x)
    assert first is not state and torch.equal(first, torch.ones(3))  # was `state` itself: 2.0 after the next call
    assert extra["in"] is not x and torch.equal(extra["in"], x)
    plain = _eager(accumulate, torch.ones(3))
    assert plain(x)[0] is state  # clone=False: what fn returned


def test_static_buffers_of_an_eager_capture_say_why_there_are_none():
    g = _eager(lambda x: x * 2, torch.ones(2))
    g(torch.ones(2))
    for attr in ("static_inputs", "static_outputs"):
        with pytest.raises(UserError, match="eagerly"):  # was "nothing captured yet" after several calls
            getattr(g, attr)


def test_signature_tells_one_tensor_passed_twice_from_two():
    a, b = torch.ones(3), torch.ones(3)
    # a graph captured from f(a, a) reads one static buffer for both: f(b, c) copied c over b, wrong result
    assert graphs.signature((a, a)) != graphs.signature((a, b))
    assert graphs.signature((a, b)) == graphs.signature((torch.ones(3), torch.ones(3)))
    assert graphs.signature((a, [a])) == graphs.signature((b, [b]))


def test_signature_keys_baked_in_values_exactly():
    # 0.0 == -0.0, so x / -0.0 replayed the +inf graph; NaN != NaN re-captured every call
    assert graphs.signature((0.0,)) != graphs.signature((-0.0,))
    assert graphs.signature((float("nan"),)) == graphs.signature((float("nan"),))
    # a NumPy array was keyed by its repr, which rounds and elides: two arrays, one graph
    assert graphs.signature((np.array([1.0]),)) != graphs.signature((np.array([1.0000000001]),))
    big = np.arange(5000.0)
    changed = big.copy()
    changed[2500] += 1
    assert graphs.signature((big,)) != graphs.signature((changed,))
    assert graphs.signature((big,)) == graphs.signature((big.copy(),))


@pytest.mark.gpu
def test_a_graph_captured_with_one_tensor_twice_is_not_replayed_for_two():
    def f(x, y):
        return x * 2 + y

    a = torch.randn(64, device="cuda")
    g = graphs.capture(f, a, a, clone=True)
    b, c = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    assert torch.equal(g(b, c), b * 2 + c)  # was c * 3: both copied into a
    assert g.captures == 2
    d = torch.randn(64, device="cuda")
    assert torch.equal(g(d, d), d * 3) and g.captures == 2
    own = graphs.capture(lambda x, y: x.add_(1) + y, a.clone(), a.clone(), own_inputs=True)
    x, y = own.static_inputs
    assert x is not y  # two tensors, two buffers
    same = torch.zeros(4, device="cuda")
    both = graphs.capture(lambda x, y: (x.add_(0), y)[1], same, same, own_inputs=True)
    x, y = both.static_inputs
    assert x is y  # one tensor twice: one private buffer, as the signature says


# --- explain() ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [_gen, _coro])
def test_explain_refuses_generator_and_async_functions(fn):
    with pytest.raises(UserError, match="does its work only when consumed"):  # was "0 graph(s)" and a fullgraph error
        graph_breaks.explain(fn, torch.ones(3))


def test_explain_refuses_a_one_pass_iterator_argument():
    with pytest.raises(UserError, match="one-pass iterator"):  # later calls saw it empty: "fullgraph fails"
        graph_breaks.explain(lambda it: sum(it), iter([torch.ones(2), torch.ones(2)]))


@pytest.mark.parametrize("variants,word", [([torch.ones(4)], "variants\\[0\\] is a Tensor"), (5, "variants is")])
def test_explain_refuses_variants_that_are_not_argument_tuples(variants, word):
    # a bare tensor was unpacked into 4 arguments and reported as a failed call; 5 raised TypeError
    with pytest.raises(UserError, match=word):
        graph_breaks.explain(lambda a: a * 2, torch.ones(3), variants=variants)


def test_explain_check_fullgraph_false_says_not_checked_and_a_non_bool_is_refused():
    exp = graph_breaks.explain(lambda a: a * 2, torch.ones(3), variants=[], check_fullgraph=False)
    assert exp.fullgraph_ok is None and "fullgraph=True not checked" in str(exp)  # said "compiles", unchecked
    assert graph_breaks.explain(lambda a: a * 2, torch.ones(3), variants=[]).fullgraph_ok is True
    with pytest.raises(UserError, match="check_fullgraph"):  # "no" was truthy: checked anyway
        graph_breaks.explain(lambda a: a * 2, torch.ones(3), check_fullgraph="no")


def test_explain_gives_back_the_users_torch_log_settings():
    from torch._logging import _internal

    torch._logging.set_logs(graph_breaks=True, dynamo=logging.ERROR)
    try:
        graph_breaks.explain(lambda a: a * 2, torch.ones(3), variants=[], check_fullgraph=False)
        state = _internal.log_state  # was reset to torch's defaults
        assert state.is_artifact_enabled("graph_breaks")
        assert state.log_qname_to_level.get("torch._dynamo") == logging.ERROR
    finally:
        torch._logging.set_logs()
