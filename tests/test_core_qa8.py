"""QA round 8 on the measurement core's public API (CPU): compare(), bench(), explain(), peak_memory, budgets."""

from __future__ import annotations

import math

import pytest
import torch

from gpuspeed.stats import compare, summarize


def _m(samples, name="x"):
    return summarize(samples, name=name, device="cpu", mode="cpu")


# --- compare() ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("a, b", [([2.0], [1.0]), ([2.0, 2.0], [1.0, 1.0]), ([2.0, 2.1, 1.9], [1.0])])
def test_compare_with_one_or_two_samples_is_no_certain_verdict(a, b):
    # one sample a side resampled is that sample: the interval was [2.000, 2.000] and the verdict "faster"
    c = compare(_m(a), _m(b))
    assert c.speedup == pytest.approx(2.0)
    assert c.verdict == "same" and c.ci_low == 0.0 and c.ci_high == math.inf
    assert "too few samples" in str(c)
    assert compare(_m(b), _m(a)).verdict == "same"


def test_compare_with_three_samples_still_bootstraps():
    c = compare(_m([2.0, 2.1, 1.9]), _m([1.0, 1.05, 0.95]))
    assert c.verdict == "faster" and 1 < c.ci_low < c.ci_high < math.inf and "too few" not in str(c)


# --- explain() ---------------------------------------------------------------------------------------------


def _scaled_sin(x, *, scale):
    return torch.sin(x) * scale


def test_explain_varies_tensors_passed_by_keyword_and_keeps_keyword_options():
    from gpuspeed.graph_breaks import explain

    # a tensor passed by keyword went unchanged into every call: "recompiles over 4 calls with changing inputs: 0"
    by_name = explain(_scaled_sin, scale=2, x=torch.randn(8), check_fullgraph=False)
    assert by_name.calls == 4 and by_name.recompiles >= 1, by_name
    assert any("size" in r for r in by_name.recompile_reasons), by_name
    assert not by_name.notes  # the int option `scale` was not bumped into calls the function refuses
    # the same function with the tensor passed positionally reads the same
    positional = explain(_scaled_sin, torch.randn(8), scale=2, check_fullgraph=False)
    assert positional.recompiles == by_name.recompiles
