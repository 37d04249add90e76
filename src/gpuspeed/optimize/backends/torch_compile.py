"""torch.compile over the NumPy code: torch.compiler.wrap_numpy traces the NumPy calls into torch ops
on CUDA tensors, and Inductor fuses them (modes: default, max-autotune-no-cudagraphs, reduce-overhead)."""

import types

import numpy as np
import torch

from gpuspeed.optimize.backends.common import Impl, demote_scalar, host_tree, importable, rebind, tree_map
from gpuspeed.optimize.backends.common import torch_settings


def build(module, func="original", precision="as-written", out_dtypes=None, mode="default", device="cuda",
          compile_backend=None, **_):
    demote = precision == "float32"
    importable(module)  # dynamo imports the traced function's module by name
    notes = rebind(module, _single_numpy(), demote=False) if demote else []  # np.float64 in the code -> float32
    fn = getattr(module, func)
    kw = {"backend": compile_backend} if compile_backend else {}  # "eager": tracing without Inductor (CPU tests)
    compiled = torch.compile(torch.compiler.wrap_numpy(fn), mode=None if mode == "default" else mode, **kw)
    # in each call (the caller's settings come back after it): arrays the code creates itself (np.zeros(n)) follow
    # numpy_default_float, and "tf32" runs float32 matmuls on tensor cores with a 10-bit mantissa
    compiled = torch_settings(compiled, tf32=precision == "tf32",
                              dynamo_config={"numpy_default_float": "float32" if demote else "float64"})

    def prepare(args):
        def move(x):
            if isinstance(x, (np.ndarray, torch.Tensor)):  # device tensors too: the chunked pipeline moves them
                if isinstance(x, np.ndarray) and any(s < 0 for s in x.strides):
                    x = x.copy()  # a reversed view (x[::-1]): torch tensors take no negative strides
                t = torch.as_tensor(x).to(device)
                return t.float() if demote and t.dtype == torch.float64 else t
            return demote_scalar(x) if demote else x
        return tree_map(move, args)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    return Impl(compiled, prepare, lambda out: host_tree(out, out_dtypes), device=device, sync=sync,
                label=f"torch.compile on the NumPy code ({mode}, {precision})", notes=notes)


def _single_numpy():
    """NumPy's own namespace (a module, the same function objects, so dynamo still traces them) whose
    float64 and complex128 names are the single-precision types: `np.array(x, dtype=np.float64)` in the
    user's code would otherwise keep a demoted candidate computing in float64. Constructors' default
    float follows torch._dynamo.config.numpy_default_float."""
    single = types.ModuleType("numpy")
    single.__dict__.update({k: v for k, v in vars(np).items() if k not in ("__name__", "__spec__", "__loader__")})
    for name in ("float64", "double", "float_"):
        single.__dict__[name] = np.float32
    for name in ("complex128", "cdouble", "complex_"):
        single.__dict__[name] = np.complex64
    return single
