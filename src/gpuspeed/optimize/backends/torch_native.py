"""A PyTorch original on the GPU: tensors moved once, tensors the code creates made there too (default
device), eager or compiled."""

import torch

from gpuspeed.optimize.backends.common import Impl, demote_scalar, host_tree, importable, torch_settings, tree_map


def build(module, func="original", precision="as-written", out_dtypes=None, mode="eager", device="cuda", **_):
    demote = precision == "float32"
    if mode != "eager":
        importable(module)  # dynamo imports the traced function's module by name
    fn = getattr(module, func)
    run = fn if mode == "eager" else torch.compile(fn, mode=None if mode == "default" else mode)
    # in each call, tensors the code creates (torch.zeros(n)) land on the GPU too, and "tf32" runs float32 matmuls on
    # tensor cores with a 10-bit mantissa; the caller's own settings come back after it
    run = torch_settings(run, device=device, tf32=precision == "tf32")

    def prepare(args):
        def move(x):
            if isinstance(x, torch.Tensor):
                t = x.to(device)
                return t.float() if demote and t.dtype == torch.float64 else t
            return demote_scalar(x) if demote else x
        return tree_map(move, args)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    return Impl(run, prepare, lambda out: host_tree(out, out_dtypes), device=device, sync=sync,
                label=f"PyTorch on {device} ({mode}, {precision})")
