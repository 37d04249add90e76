"""Shims for optional backends whose released versions disagree with each other; applied once, at import.

Each shim restores only what is missing and says which combination needed it.
"""

from __future__ import annotations

import importlib.util


def numpy_aliases_for_numba() -> bool:
    """numba-cuda 0.68 registers an overload of `np.row_stack` when it first compiles a kernel; NumPy 2.5 removed
    that alias of `np.vstack`, so on the H200 machine (numba-cuda 0.68, NumPy 2.5.2) every `@cuda.jit` kernel
    failed with "module 'numpy' has no attribute 'row_stack'". The alias comes back only where NumPy lacks it
    and numba-cuda is installed. True when it was restored."""
    import numpy as np

    if hasattr(np, "row_stack") or importlib.util.find_spec("numba_cuda") is None:
        return False
    np.row_stack = np.vstack
    return True


RESTORED = {"numpy.row_stack (for numba-cuda)": numpy_aliases_for_numba()}
