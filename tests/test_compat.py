"""The backend shims: each restores only what is missing."""

import importlib.util

import numpy as np

from gpuspeed import compat


def test_row_stack_alias_restored_only_when_numpy_lacks_it_and_numba_cuda_is_installed(monkeypatch):
    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "numba_cuda" else real_find(name, *a))
    if hasattr(np, "row_stack"):
        assert compat.numpy_aliases_for_numba() is False  # present: left alone
        monkeypatch.delattr(np, "row_stack")
    assert compat.numpy_aliases_for_numba() is True  # NumPy 2.5, as on the H200 machine
    assert np.row_stack is np.vstack
    monkeypatch.delattr(np, "row_stack")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "numba_cuda" else real_find(name, *a))
    assert compat.numpy_aliases_for_numba() is False  # no numba-cuda: NumPy untouched
    assert not hasattr(np, "row_stack")
