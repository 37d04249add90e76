"""Numba njit(parallel=True) on the CPU for loop-bound code: the original and the module's own helper
functions compiled; with prange=True the outermost loops become prange (checked like any candidate)."""

import ast
import inspect
import textwrap
import types

import numba
import numpy as np

from gpuspeed.optimize.backends.common import Impl, demote_dtype, demote_scalar, host_tree, tree_map


def _with_prange(fn, module):
    """fn recompiled from its source with each outermost `for ... in range(...)` as numba.prange."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    fdef = tree.body[0]
    fdef.decorator_list = []
    for node in fdef.body:
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and \
                isinstance(node.iter.func, ast.Name) and node.iter.func.id == "range":
            node.iter.func = ast.Attribute(value=ast.Name(id="__numba", ctx=ast.Load()), attr="prange",
                                           ctx=ast.Load())
    ns = vars(module)
    ns["__numba"] = numba
    exec(compile(ast.fix_missing_locations(tree), inspect.getsourcefile(fn) or "<prange>", "exec"), ns)
    return ns[fn.__name__]


def build(module, func="original", precision="as-written", out_dtypes=None, prange=False, **_):
    demote = precision == "float32"
    for key, val in list(vars(module).items()):  # helpers the original calls must be compiled too
        if isinstance(val, types.FunctionType) and val.__module__ == module.__name__ and key != func and \
                not key.startswith("inputs") and key != "variants":
            setattr(module, key, numba.njit(val))
    fn = getattr(module, func)
    if prange:
        fn = _with_prange(fn, module)
    jitted = numba.njit(parallel=True)(fn)

    def prepare(args):
        def move(x):
            if isinstance(x, np.ndarray) and demote:
                return x.astype(demote_dtype(x.dtype))
            return demote_scalar(x) if demote else x
        return tree_map(move, args)

    return Impl(jitted, prepare, lambda out: host_tree(out, out_dtypes), device="cpu",
                label=f"Numba njit(parallel=True{', prange' if prange else ''}) on the CPU ({precision})")
