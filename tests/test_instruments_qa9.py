"""QA round 9 on the instruments: capture(), explain(), profile(), roofline, launch, doctor (CPU unless marked gpu)."""

import warnings

import pytest
import torch

from gpuspeed import graphs
from gpuspeed.errors import UserError


def _scaled(x, *, scale=2.0, bias=None):
    y = x * scale
    return y if bias is None else y + bias


def _eager(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return graphs.capture(fn, *args, device="cpu", **kw)


def test_capture_takes_keyword_arguments_eagerly():
    x, b = torch.randn(5), torch.randn(5)
    g = _eager(_scaled, x, kwargs={"scale": 3.0, "bias": b})
    torch.testing.assert_close(g(x, scale=3.0, bias=b), x * 3.0 + b)
    torch.testing.assert_close(g(x, bias=b, scale=0.5), x * 0.5 + b)
    with pytest.raises(UserError, match="kwargs"):
        _eager(_scaled, x, kwargs=[("scale", 3.0)])


def test_signature_keys_keyword_arguments():
    x, b = torch.randn(4), torch.randn(4)
    s = graphs.signature
    assert s((x,), {"scale": 2.0}) != s((x,), {"scale": 3.0})  # a changed keyword value re-captures
    assert s((x,), {"scale": 2.0}) != s((x,))
    assert s((x,), {"bias": b, "scale": 2.0}) == s((x,), {"scale": 2.0, "bias": b})  # order does not matter
    assert s((x,), {"bias": b}) != s((x,), {"bias": torch.randn(8)})
    assert s((x,), {}) == s((x,))


@pytest.mark.gpu
def test_capture_replays_keyword_tensors_and_recaptures_keyword_values():
    x, b = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    g = graphs.capture(_scaled, x, kwargs={"scale": 3.0, "bias": b}, clone=True)
    for _ in range(3):
        x2, b2 = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
        torch.testing.assert_close(g(x2, scale=3.0, bias=b2), x2 * 3.0 + b2)
    assert g.captures == 1
    x3, b3 = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    torch.testing.assert_close(g(x3, scale=0.5, bias=b3), x3 * 0.5 + b3)  # another value: a new graph
    assert g.captures == 2 and g.static_kwargs["scale"] == 0.5


def test_profile_refuses_a_one_pass_iterator_argument():
    from gpuspeed.profiling import profile

    def total(xs):
        return sum(float(x.sum()) for x in xs)

    with pytest.raises(UserError, match="one-pass iterator.*list or a tuple"):
        profile(total, (torch.randn(10) for _ in range(3)), steps=2, hotspots=False, device="cpu")
    with pytest.raises(UserError, match="keyword argument 'xs'"):
        profile(total, kwargs={"xs": iter([torch.randn(4)])}, steps=1, hotspots=False, device="cpu")
    r = profile(total, [torch.randn(10) for _ in range(3)], steps=1, hotspots=False, device="cpu")  # a list is fine
    assert r.params["calls"] == 3
