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
