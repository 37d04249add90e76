"""NumPy on the CPU in float32: the original's own code with float64 demoted (a precision candidate)."""

import numpy as np

from gpuspeed.optimize.backends.common import Impl, demote_dtype, demote_scalar, host_tree, rebind, tree_map


def build(module, func="original", precision="float32", out_dtypes=None, **_):
    notes = rebind(module, np, demote=precision == "float32")
    fn = getattr(module, func)

    def prepare(args):
        def move(x):
            if isinstance(x, np.ndarray) and precision == "float32":
                return x.astype(demote_dtype(x.dtype), copy=False)
            return demote_scalar(x) if precision == "float32" else x
        return tree_map(move, args)

    return Impl(fn, prepare, lambda out: host_tree(out, out_dtypes), device="cpu",
                label=f"NumPy ({precision}) on the CPU", notes=notes)
