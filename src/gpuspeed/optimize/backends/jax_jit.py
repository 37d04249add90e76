"""JAX jit: the module's `np` rebound to jax.numpy (SciPy to jax.scipy), compiled by XLA."""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX would otherwise take 75 % of the GPU

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from gpuspeed.optimize.backends.common import Impl, demote_scalar, host_tree, rebind, static_positions, tree_map  # noqa: E402,E501


def build(module, func="original", precision="as-written", out_dtypes=None, device="cuda", **_):
    demote = precision == "float32"
    jax.config.update("jax_enable_x64", not demote)  # float64 code stays float64 unless demoted
    notes = rebind(module, jnp, scipy_prefix="jax.scipy")
    fn = getattr(module, func)
    by_static = {}  # one jit per set of constant positions (integer arguments such as a step count)

    def jitted(*args):
        static = static_positions(args)
        if static not in by_static:
            by_static[static] = jax.jit(fn, static_argnums=static)
        return by_static[static](*args)

    target = jax.devices("gpu")[0] if device == "cuda" else jax.devices("cpu")[0]

    def prepare(args):
        def move(x):
            if isinstance(x, np.ndarray):
                return jax.device_put(x.astype(np.float32) if demote and x.dtype == np.float64 else x, target)
            return demote_scalar(x) if demote else x
        return tree_map(move, args)

    def sync():
        pass  # bench and fetch block on JAX arrays themselves

    return Impl(jitted, prepare, lambda out: host_tree(out, out_dtypes), device=device, sync=sync,
                label=f"JAX jit ({precision})", notes=notes)
