"""A user's hand-written variant from the workload's `variants` dict, called with the original's
arguments; its output is judged as returned (no cast back to the original's dtypes). A variant with
`fn.gpuspeed_inputs = "torch"` or `"cupy"` gets them moved to the GPU once (so its device-resident time
can be measured), else it gets the host arrays and returns what it likes.

A variant declaring `fn.precision = "float32"` runs on the recipe's float32 path, as the float32-demoted
candidates do: its float64 inputs are cast to float32 when moved (before the timing), its outputs cast back
to the original's dtypes, and it is judged under the workload's tolerance."""

import numpy as np

from gpuspeed.optimize.backends.common import Impl, demote_dtype, demote_scalar, host_tree, tree_map


def build(module, func="original", precision="as-written", out_dtypes=None, variant="", device="cuda", **_):
    fn = module.variants[variant]
    where = getattr(fn, "gpuspeed_inputs", "numpy")
    demote = precision == "float32"
    sync = None

    def cast(x):
        """A float64 array as float32 (and a NumPy float64 scalar as a Python float) on the float32 path."""
        if not demote:
            return x
        if isinstance(x, np.ndarray):
            return x.astype(demote_dtype(x.dtype))
        return demote_scalar(x)

    if where == "torch":
        import torch

        def move(x):
            x = cast(x)
            # in C order with its shape kept (np.ascontiguousarray makes a 0-d array 1-d); a reversed view copied
            return torch.from_numpy(np.asarray(x, order="C")).to(device) if isinstance(x, np.ndarray) else x

        def sync():
            if device == "cuda":
                torch.cuda.synchronize()
    elif where == "cupy":
        import cupy as cp

        def move(x):
            x = cast(x)
            return cp.asarray(x) if isinstance(x, np.ndarray) else x

        def sync():
            cp.cuda.Device().synchronize()
    else:
        move = cast
    dtypes = out_dtypes if demote else None
    given = where if where in ("torch", "cupy") else "the original's"  # a torch workload's host inputs are tensors
    return Impl(fn, lambda args: tree_map(move, args), lambda out: host_tree(out, dtypes),
                device=device if where in ("torch", "cupy") else "host", sync=sync,
                label=f"user variant {variant!r} ({given} inputs" +
                (", float32: inputs cast from float64 once, outputs cast back)" if demote else ")"))
