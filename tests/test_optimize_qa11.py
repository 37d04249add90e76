"""gpuspeed optimize and its optimized_<name>.py as a Python developer with slow NumPy/PyTorch code uses them (QA pass
11), CPU only: small real runs (--device cpu, a short bench budget, few backends) and the emitted script run or
imported from another folder."""

import textwrap

import numpy as np
import pytest


def _module(tmp_path, name, text):
    """The workload file, imported as a module of its own."""
    from gpuspeed.optimize.workload import import_workload

    p = tmp_path / f"{name}.py"
    p.write_text(textwrap.dedent(text))
    return import_workload(p, unique=True)


def test_a_numba_candidate_adds_no_lookups_of_numbas_lazy_names_per_call(tmp_path, monkeypatch):
    """numba.typed resolves Dict and List through a module __getattr__ that runs importlib.import_module on each access:
    the Numba candidate's fetch looked both up for every leaf of every call (~14 us a call: the emitted script timed a
    1 us function at 17 us, 0.10x the original, where the run had measured 1.45x)."""
    pytest.importorskip("numba")
    import numba.typed

    from gpuspeed.optimize.backends import numba_cpu

    module = _module(tmp_path, "tiny", """
        import numpy as np

        def original(x, s):
            return x.sum() * s, (np.abs(x) + s, x[:2])
        """)
    impl = numba_cpu.build(module)
    rng = np.random.default_rng(7)
    x, s = rng.standard_normal(16), float(rng.standard_normal())
    first = impl(x, s)  # compiles
    assert np.isclose(first[0], x.sum() * s)
    looked = []
    lazy = numba.typed.__getattr__

    def counting(name):
        looked.append(name)
        return lazy(name)

    monkeypatch.setattr(numba.typed, "__getattr__", counting)
    for _ in range(5):
        out = impl(x, s)
    assert looked == []
    assert np.allclose(out[1][0], np.abs(x) + s) and np.array_equal(out[1][1], x[:2])


TORCH_INPUTS = """
    import numpy as np

    def original(x, s, r):
        return np.cumsum(x) * s + r.sum(), s * 2.0

    def fast(x, s, r):  # takes torch tensors
        import torch

        return torch.cumsum(x, 0) * s + r.sum(), s * 2.0

    fast.gpuspeed_inputs = "torch"
    variants = {"fast": fast}
    """


def _odd_args(rng):
    """A reversed view, a 0-d array and a Fortran-ordered slice: arrays a user hands over as they are."""
    return (rng.standard_normal(40)[::-1], np.array(rng.standard_normal()),
            np.asfortranarray(rng.standard_normal((6, 5)))[:, 1:4])


def test_torch_inputs_keep_the_callers_shapes_and_take_reversed_views(tmp_path):
    """A variant taking torch inputs got a 0-d argument as a 1-element 1-d tensor (np.ascontiguousarray makes 0-d
    arrays 1-d), so its s * 2.0 came back shape (1,) and the variant was 'WRONG shape'; torch.compile's drop-in refused
    a reversed view (x[::-1]) with torch's 'At least one stride in the given numpy array is negative'."""
    pytest.importorskip("torch")
    from gpuspeed.optimize.backends import torch_compile, variant

    module = _module(tmp_path, "odd", TORCH_INPUTS)
    args = _odd_args(np.random.default_rng(11))
    want = module.original(*args)
    v = variant.build(module, variant="fast", device="cpu")
    assert [tuple(t.shape) for t in v.prepare(args)] == [a.shape for a in args]
    got = v(*args)
    assert got[1].shape == () and np.allclose(got[0], want[0]) and np.isclose(got[1], want[1])
    c = torch_compile.build(_module(tmp_path, "odd2", TORCH_INPUTS), device="cpu", compile_backend="eager")
    moved = c.prepare(args)
    assert [tuple(t.shape) for t in moved] == [a.shape for a in args]
    assert all(np.array_equal(t.numpy(), a) for t, a in zip(moved, args, strict=True))
    got = c(*args)
    assert np.allclose(got[0], want[0]) and np.isclose(got[1], want[1])
