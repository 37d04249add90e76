"""Which array library a user's function works in, so `profile --function` makes its inputs in that library.

Read from the function's module: the modules it imports and the names it imports from them. torch wins
over CuPy, CuPy over NumPy (code that uses torch or CuPy usually imports NumPy too); a module that imports
none of them gets NumPy arrays, the plainest thing to index from Python.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types

from gpuspeed.errors import UserError

BACKENDS = ("torch", "cupy", "numpy")  # in order of preference when a module imports several
_TOP = {"torch": "torch", "cupy": "cupy", "cupyx": "cupy", "numpy": "numpy"}


def _target(fn):
    """The function whose module says the library: a functools.partial's function (the partial's own module is
    functools), unwrapped."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    try:
        return inspect.unwrap(fn)
    except ValueError:  # a __wrapped__ cycle: read the outer object
        return fn


def libraries_used(fn) -> set[str]:
    """The array libraries (torch, cupy, numpy) that fn's module has imported, as modules or as names."""
    target = _target(fn)
    names = getattr(target, "__globals__", None)
    if names is None:
        module = sys.modules.get(getattr(target, "__module__", None) or "")
        names = vars(module) if module is not None else {}
    found = set()
    for value in list(names.values()):
        try:
            owner = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
        except Exception:  # a lazy module attribute can raise on access; it names no library then
            continue
        if isinstance(owner, str) and owner.split(".")[0] in _TOP:
            found.add(_TOP[owner.split(".")[0]])
    return found


def infer_backend(fn) -> tuple[str, str]:
    """(backend, why): the library fn's inputs should come from, and a few words saying how it was chosen."""
    used = libraries_used(fn)
    fn = _target(fn)
    where = getattr(inspect.getmodule(fn), "__file__", None) or getattr(fn, "__module__", "its module")
    for backend in BACKENDS:
        if backend in used:
            others = sorted(used - {backend})
            also = f" (also {', '.join(others)})" if others else ""
            return backend, f"{where} imports {backend}{also}"
    return "numpy", f"{where} imports none of torch, cupy, numpy"


def make_backend_inputs(specs, backend: str, *, seed: int, device: str) -> dict:
    """Inputs for the specs in `backend`: torch tensors on `device`, NumPy arrays, or CuPy arrays on the GPU."""
    from gpuspeed.inputs import make_inputs

    if backend not in BACKENDS:
        raise UserError(f"unknown backend {backend!r}: use {', '.join(BACKENDS)} or auto")
    if backend == "torch":
        return make_inputs(specs, seed=seed, backend="torch", device=device)
    host = make_inputs(specs, seed=seed, backend="numpy", device="cpu")
    if backend == "numpy":
        return host
    if device != "cuda":
        raise UserError("CuPy inputs need a CUDA GPU and there is none here: use --backend numpy or torch")
    try:
        import cupy
    except ImportError as exc:
        raise UserError(f"CuPy inputs need CuPy, which does not import here ({exc})") from exc
    import numpy as np

    return {k: cupy.asarray(v) if isinstance(v, np.ndarray) else v for k, v in host.items()}
