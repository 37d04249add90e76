"""CuPy drop-in: the module's `np` rebound to CuPy and its SciPy imports to cupyx.scipy; inputs moved once;
optionally the function traced by cupy.fuse into one kernel."""

import cupy as cp
import numpy as np

from gpuspeed.optimize.backends.common import Impl, NotApplicable, demote_dtype, demote_scalar, host_tree
from gpuspeed.optimize.backends.common import rebind, tree_map


def _fused(fn, name):
    """cupy.fuse(fn), whose first call (the trace) failing is NotApplicable with the reason: cupy.fuse takes
    elementwise operations and reductions on whole arrays, not indexing, slices, loops over array values or
    array constructors (the original ran on NumPy, so a failing trace is the tracer's limit)."""
    fused = cp.fuse(fn)
    traced = []

    def run(*args):
        if traced:
            return fused(*args)
        try:
            out = fused(*args)
        except Exception as exc:  # noqa: BLE001 - any trace failure means fuse does not apply
            text = str(exc).strip().splitlines()
            raise NotApplicable(f"cupy.fuse cannot trace {name}: {type(exc).__name__}: "
                                f"{text[0][:200] if text else ''}") from exc
        traced.append(True)
        return out
    return run


def build(module, func="original", precision="as-written", out_dtypes=None, fuse=False, **_):
    demote = precision == "float32"
    notes = rebind(module, cp, scipy_prefix="cupyx.scipy", demote=demote)
    fn = getattr(module, func)
    if fuse:  # cupy.fuse traces the function once per input signature into one elementwise(+reduction) kernel
        fn = _fused(fn, func)

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
