"""Shims for optional backends whose released versions disagree with each other; applied once, at import.

Each shim restores only what is missing and says which combination needed it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import warnings


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


def triton_interpreter_index() -> bool:
    """Triton 3.6's interpreter (TRITON_INTERPRET=1) turns a scalar argument into a Python int with `int(data)` on
    its one-element array, as `range(0, n_cols, BLOCK)` over a runtime `n_cols` does; NumPy 2.4 refuses that
    ("only 0-dimensional arrays can be converted to Python scalars"), so on the H200 machine (triton 3.6, NumPy
    2.5.2) every interpreted kernel with such a loop failed. Later triton squeezes the array first; this does the
    same, only where NumPy refuses and triton's own code still calls int() on the array. Called where kernels are
    interpreted (importing triton at gpuspeed's import would cost a second). True when applied."""
    import numpy as np

    try:
        int(np.ones(1))
        return False  # NumPy still converts a one-element array
    except TypeError:
        pass
    try:
        from triton.runtime import interpreter

        original = interpreter._patch_lang_tensor
        if getattr(original, "gpuspeed_shim", False):  # applied already (this runs at every interpreted launch)
            return False
        unfixed = "int(self.handle.data))" in inspect.getsource(original)
    except Exception:  # noqa: BLE001 - no triton, or an interpreter laid out otherwise: nothing to mend
        return False
    if not unfixed:
        return False

    def index(self):
        return int(np.asarray(self.handle.data).squeeze())

    def patch_lang_tensor(tensor, *rest, **kw):
        original(tensor, *rest, **kw)
        scope = rest[0] if rest else kw.get("scope")
        if hasattr(scope, "set_attr"):  # restored with the rest when the launch ends
            scope.set_attr(tensor, "__index__", index)
        else:
            tensor.__index__ = index

    patch_lang_tensor.gpuspeed_shim = True
    interpreter._patch_lang_tensor = patch_lang_tensor
    return True


RESTORED = {"numpy.row_stack (for numba-cuda)": numpy_aliases_for_numba()}


PROFILER_CLEARS_WARNING = "Warning: Profiler clears events at the end of each cycle"


@contextlib.contextmanager
def quiet_profiler_start():
    """torch 2.10 and 2.11 warn "Profiler clears events at the end of each cycle" at every profiler start
    (pytorch#180348, fixed by #180387): our sessions start once each, so no events are cleared and the warning tells
    the user nothing about their code. Hides that one message around a start; other warnings pass."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PROFILER_CLEARS_WARNING, category=UserWarning)
        yield
