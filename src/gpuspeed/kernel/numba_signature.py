"""A simulated `@cuda.jit("void(float32[:], ...)")` launch whose arguments match none of the kernel's declared
signatures: on a GPU Numba raises "No matching definition for argument type(s) ..." (eager signatures turn
compilation off), while the CUDA simulator drops the signatures and runs the kernel on anything. The signatures are
read back from the decorator in the kernel's source, as the simulator keeps no record of them."""

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


def mismatch(fn, args: tuple) -> str | None:
    """One line when `args` (host NumPy arrays, the simulator's device arrays, scalars) fit none of fn's declared
    signatures by Numba's own conversion rules; None when they fit one, or when nothing can be said."""
    signatures = declared_signatures(fn)
    if not signatures:
        return None
    try:
        import numba
        from numba.core import sigutils
        from numba.core.registry import cpu_target

        given = [numba.typeof(getattr(a, "_ary", a)) for a in args]  # FakeCUDAArray wraps its NumPy array
        declared = [sigutils.normalize_signature(s)[0] for s in signatures]
    except Exception:  # a type Numba cannot name, or a signature it cannot parse: the simulator's run stands
        return None
    context = cpu_target.typing_context
    for params in declared:
        if len(params) == len(given) and all(context.can_convert(g, p) for g, p in zip(given, params, strict=True)):
            return None
    name = getattr(fn, "__name__", "kernel")
    return (f"{name}: launched with ({', '.join(map(str, given))}), which matches none of its declared signatures "
            f"({'; '.join(signatures)}): on a GPU Numba raises 'No matching definition for argument type(s)' (the "
            "CUDA simulator ignores signatures); pass arguments of the declared types, or drop the signature")
