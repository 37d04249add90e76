"""Argument trees: flatten/unflatten, and clones that keep strides, memory order and aliasing (issue 14 item 4)."""

from collections import OrderedDict, namedtuple

import numpy as np
import pytest
import torch

from gpuspeed import trees
from gpuspeed.timing import clone_tree

Pair = namedtuple("Pair", "a b")


def test_flatten_unflatten_round_trip_keeps_container_types():
    tree = {"x": Pair(1, [2, (3, 4)]), "y": OrderedDict(z=5)}
    values, spec = trees.flatten(tree)
    assert values == [1, 2, 3, 4, 5]
    back = trees.unflatten(spec, values)
    assert back == tree
    assert type(back["x"]) is Pair and type(back["y"]) is OrderedDict and type(back["x"].b[1]) is tuple
    assert list(trees.leaves([1, {"a": (2, 3)}])) == [1, 2, 3]


def test_torch_view_keeps_strides_and_offset():
    base = torch.arange(64, dtype=torch.float32)
    view = base.as_strided((4, 4), (8, 2), 3)
    c = clone_tree(view)
    assert c.stride() == (8, 2) and torch.equal(c, view)
    assert c.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    c[0, 0] = -1.0
    assert base[3] == 3.0  # a copy, not the original
    t = torch.randn(5, 7).t()  # column-major
    assert clone_tree(t).stride() == t.stride()
    e = torch.ones(3, 1).expand(3, 5)  # stride 0
    assert clone_tree(e).stride() == (1, 0)


def test_torch_aliasing_arguments_still_alias_in_the_clone():
    base = torch.arange(100, dtype=torch.float32)
    a, b = base[10:30], base[20:40]  # overlap on 20..29
    ca, cb, ca_again = clone_tree((a, b, a))
    assert ca is ca_again  # one tensor passed twice stays one tensor
    assert ca.untyped_storage().data_ptr() == cb.untyped_storage().data_ptr()
    ca[15] = -5.0  # element 25 of the base
    assert cb[5] == -5.0
    assert torch.equal(cb[6:], base[26:40])


def test_torch_clone_copies_the_span_used_not_the_whole_buffer():
    big = torch.zeros(1 << 20)
    view = big[1000:1010]
    c = clone_tree(view)
    assert c.untyped_storage().nbytes() < 64 * 1024
    assert torch.equal(c, view)
    # alignment within the copy matches the original, modulo the allocator's alignment
    assert (c.data_ptr() - c.untyped_storage().data_ptr()) % 256 == (view.data_ptr() - big.data_ptr()) % 256


def test_torch_requires_grad_and_parameters_kept():
    p = torch.nn.Parameter(torch.randn(3))
    r = torch.randn(3, requires_grad=True)
    cp, cr = clone_tree([p, r])
    assert isinstance(cp, torch.nn.Parameter) and cp.requires_grad
    assert cr.requires_grad and cr.is_leaf and torch.equal(cr, r)


def test_numpy_keeps_order_strides_and_aliasing():
    f = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    rev = np.arange(100.0)[::-3]  # negative stride
    base = np.arange(1000, dtype=np.int32)
    p, q = base[10:20], base[15:30].view(np.int16)  # overlapping, different dtypes
    cf, crev, cp, cq = clone_tree([f, rev, p, q])
    assert cf.flags.f_contiguous and cf.strides == f.strides and np.array_equal(cf, f)
    assert crev.strides == rev.strides and np.array_equal(crev, rev)
    assert np.shares_memory(cp, cq) and not np.shares_memory(cp, base)
    assert np.array_equal(cp, p) and np.array_equal(cq, q)
    cp[5] = -7  # base[15], the first int32 of q's view
    assert cq[0] == -7 and q[0] == 15
    addr = lambda x: x.__array_interface__["data"][0]  # noqa: E731
    assert addr(crev) % 256 == addr(rev) % 256


def test_scalars_and_unknown_leaves_kept():
    tree = {"n": 3, "s": "x", "none": None, "arr": np.ones(2)}
    c = clone_tree(tree)
    assert c["n"] == 3 and c["s"] == "x" and c["none"] is None
    assert c["arr"] is not tree["arr"] and np.array_equal(c["arr"], tree["arr"])
    assert clone_tree(torch.empty(0)).shape == (0,)


@pytest.mark.gpu
def test_torch_cuda_clone_keeps_strides_and_aliasing():
    base = torch.arange(256, dtype=torch.float16, device="cuda")
    a, b = base.as_strided((8, 4), (16, 2)), base[8:40]
    ca, cb = clone_tree((a, b))
    assert ca.is_cuda and ca.stride() == (16, 2) and torch.equal(ca, a)
    assert ca.untyped_storage().data_ptr() == cb.untyped_storage().data_ptr()
    ca[1, 0] = -1  # base element 16, which b sees at index 8
    assert cb[8].item() == -1


@pytest.mark.gpu
def test_cupy_clone_keeps_strides_and_aliasing():
    cupy = pytest.importorskip("cupy")
    base = cupy.arange(200, dtype=cupy.float32)
    a, b = base[10:50:2], base[20:60]
    ca, cb = clone_tree((a, b))
    assert ca.strides == a.strides and bool((ca == a).all()) and bool((cb == b).all())
    ca[5] = -3  # base element 20, the first of b
    assert float(cb[0]) == -3 and float(b[0]) == 20
