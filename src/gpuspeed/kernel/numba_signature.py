"""A Numba launch whose arguments match none of the kernel's declared signatures (`@cuda.jit("void(float32[:], ...)")`).
On a GPU, Numba checks the arguments only of a kernel declared with a list of signatures ("No matching definition for
argument type(s) ..."); a kernel of one declared signature is launched unchecked, and it reads the arguments' bytes as
the declared types (float64 data read as float32: wrong results, no error; seen on an H100 with numba-cuda). The CUDA
simulator drops the signatures and runs the kernel on anything. The signatures are read back from the decorator in the
kernel's source, as the simulator keeps no record of them."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap


@functools.lru_cache(maxsize=256)  # a launcher may launch one kernel thousands of times
def declared_signatures(fn) -> tuple[str, ...]:
    """The signature strings of fn's `@cuda.jit("...")` / `@jit(["...", ...])` decorator; () when it has none
    written as strings (lazy kernels, signatures built from numba.types objects, source not found)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return ()
    node = tree.body[0] if tree.body else None
    for dec in getattr(node, "decorator_list", []):
        if not (isinstance(dec, ast.Call) and dec.args):
            continue
        named = dec.func.attr if isinstance(dec.func, ast.Attribute) else getattr(dec.func, "id", None)
        first = dec.args[0]
        items = first.elts if isinstance(first, (ast.List, ast.Tuple)) else [first]
        if named == "jit" and items and all(isinstance(i, ast.Constant) and isinstance(i.value, str) for i in items):
            return tuple(i.value for i in items)
    return ()


def _numba_type(a):
    """Numba's type of a launch argument: the simulator's FakeCUDAArray through the NumPy array it wraps, a torch CUDA
    tensor (which numba.typeof does not name) through its __cuda_array_interface__."""
    import numba

    a = getattr(a, "_ary", a)
    try:
        return numba.typeof(a)
    except (ValueError, TypeError):
        if not hasattr(a, "__cuda_array_interface__"):
            raise
        from numba import cuda

        return numba.typeof(cuda.as_cuda_array(a))


def mismatch(fn, args: tuple, simulated: bool = True) -> str | None:
    """One line when `args` (host NumPy arrays, device arrays, the simulator's device arrays, scalars) fit none of fn's
    declared signatures by Numba's own conversion rules; None when they fit one, or when nothing can be said."""
    signatures = declared_signatures(fn)
    if not signatures:
        return None
    try:
        from numba.core import sigutils
        from numba.core.registry import cpu_target

        given = [_numba_type(a) for a in args]
        declared = [sigutils.normalize_signature(s)[0] for s in signatures]
    except Exception:  # a type Numba cannot name, or a signature it cannot parse: the launch stands as it is
        return None
    context = cpu_target.typing_context

    def fits(g, p) -> bool:
        if len(signatures) > 1:  # Numba's own dispatch rules, as a list of signatures is dispatched on a GPU
            return bool(context.can_convert(g, p))
        # one signature, launched unchecked: only what makes the kernel read other bytes (element type, dimensions)
        # is wrong; layout, read-only arrays and scalar casts Numba's argument preparation handles itself
        g_dtype, p_dtype = getattr(g, "dtype", None), getattr(p, "dtype", None)
        if g_dtype is None or p_dtype is None or not hasattr(g, "ndim") or not hasattr(p, "ndim"):
            return True
        return g_dtype == p_dtype and g.ndim == p.ndim

    for params in declared:
        if len(params) == len(given) and all(fits(g, p) for g, p in zip(given, params, strict=True)):
            return None
    name = getattr(fn, "__name__", "kernel")
    if len(signatures) == 1:  # numba-cuda launches a kernel of one signature without checking what it is given
        gpu = ("on a GPU Numba launches a kernel of one declared signature without checking its arguments, and the "
               "kernel reads their bytes as the declared types: wrong results, no error")
    else:
        gpu = "on a GPU Numba raises 'No matching definition for argument type(s)'"
    where = " (the CUDA simulator ignores signatures)" if simulated else ""
    return (f"{name}: launched with ({', '.join(map(str, given))}), which matches none of its declared signatures "
            f"({'; '.join(signatures)}): {gpu}{where}; pass arguments of the declared types, or drop the signature")
