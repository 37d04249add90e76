"""CuPy drop-in: the module's `np` rebound to CuPy and its SciPy imports to cupyx.scipy; inputs moved once;
optionally the function traced by cupy.fuse into one kernel."""

import cupy as cp
import numpy as np

from gpuspeed.optimize.backends.common import Impl, demote_dtype, demote_scalar, host_tree, rebind, tree_map


def build(module, func="original", precision="as-written", out_dtypes=None, fuse=False, **_):
    demote = precision == "float32"
    notes = rebind(module, cp, scipy_prefix="cupyx.scipy", demote=demote)
    fn = getattr(module, func)
    if fuse:  # cupy.fuse traces the function once per input signature into one elementwise(+reduction) kernel
        fn = cp.fuse(fn)

    def prepare(args):
        def move(x):
            if isinstance(x, (np.ndarray, cp.ndarray)):  # device arrays too: the chunked pipeline moves them itself
                d = cp.asarray(x)
                return d.astype(demote_dtype(d.dtype), copy=False) if demote else d
            return demote_scalar(x) if demote else x
        return tree_map(move, args)

    def sync():
        cp.cuda.get_current_stream().synchronize()

    return Impl(fn, prepare, lambda out: host_tree(out, out_dtypes), device="cuda", sync=sync,
                label=f"CuPy drop-in ({precision}{', cupy.fuse' if fuse else ''})", notes=notes)
