"""QA round 12 on the instruments: explain(), launch, roofline, profile (CPU unless marked gpu)."""

import torch

from gpuspeed.graph_breaks import _default_calls, explain


# -- explain(): the changed-input calls change the batch, not a broadcast bias or a weight ----------------------


def _biased(x, *, bias):
    return x * 2 + bias


def _affine(x, w, b):
    return x @ w + b


def test_explain_changes_the_batch_of_its_inputs_not_a_broadcast_bias_or_a_weight():
    # every tensor's first dim was doubled, a `bias=` of shape (8,) beside x (4, 8) too: calls 2 and 3 failed
    # ('The size of tensor a (8) must match ...') and the recompiles of a new batch size were never counted
    exp = explain(_biased, torch.randn(4, 8), bias=torch.randn(8), check_fullgraph=False)
    assert exp.calls == 4 and not exp.notes, exp
    assert exp.recompiles >= 1 and any("size" in r for r in exp.recompile_reasons), exp
    # positionally the same: a weight (8, 3) and a bias (3,) beside x (4, 8) keep their shapes
    calls = _default_calls((torch.randn(4, 8), torch.randn(8, 3), torch.randn(3)), {})
    assert [[t.shape for t in a] for a, _ in calls][1:] == [[(8, 8), (8, 3), (3,)], [(12, 8), (8, 3), (3,)]]
    assert all(_affine(*a).shape == (a[0].shape[0], 3) for a, _ in calls)
    # inputs sharing the batch (a mask passed by keyword, a second positional batch) still change with it
    x, mask = torch.randn(5, 3), torch.rand(5) > 0.5
    calls = _default_calls((x, torch.randn(3)), {"mask": mask})
    assert [a[0].shape[0] for a, _ in calls] == [5, 10, 15] and [k["mask"].shape[0] for _, k in calls] == [5, 10, 15]
    assert all(a[1].shape == (3,) for a, _ in calls) and not torch.equal(calls[0][0][1], torch.zeros(3))
    # all by keyword: the tensor with the most dimensions is the batch, whatever order the keywords come in
    calls = _default_calls((), {"bias": torch.randn(8), "x": torch.randn(4, 8)})
    assert [(k["x"].shape[0], k["bias"].shape[0]) for _, k in calls] == [(4, 8), (8, 8), (12, 8)]
