"""A user's hand-written variant from the workload's `variants` dict, called with the original's
arguments; its output is judged as returned (no cast back to the original's dtypes). A variant with
`fn.gpuspeed_inputs = "torch"` or `"cupy"` gets them moved to the GPU once (so its device-resident time
can be measured), else it gets the host arrays and returns what it likes."""

import numpy as np

from gpuspeed.optimize.backends.common import Impl, host_tree, tree_map


def build(module, func="original", precision="as-written", out_dtypes=None, variant="", device="cuda", **_):
    fn = module.variants[variant]
    where = getattr(fn, "gpuspeed_inputs", "numpy")
    sync = None
    if where == "torch":
        import torch

        def move(x):
            return torch.from_numpy(np.ascontiguousarray(x)).to(device) if isinstance(x, np.ndarray) else x

        def sync():
            if device == "cuda":
                torch.cuda.synchronize()
    elif where == "cupy":
        import cupy as cp

        def move(x):
            return cp.asarray(x) if isinstance(x, np.ndarray) else x

        def sync():
            cp.cuda.Device().synchronize()
    else:
        def move(x):
            return x
    return Impl(fn, lambda args: tree_map(move, args), host_tree,
                device=device if where in ("torch", "cupy") else "host", sync=sync,
                label=f"user variant {variant!r} ({where} inputs)")
