"""A PyTorch original on the GPU: tensors moved once, tensors the code creates made there too (default
device), eager or compiled."""

import torch

from gpuspeed.optimize.backends.common import Impl, demote_scalar, host_tree, importable, tree_map


def build(module, func="original", precision="as-written", out_dtypes=None, mode="eager", device="cuda", **_):
    demote = precision == "float32"
    # tensors the code creates (torch.zeros(n)) land on the GPU too; inputs are made under
    # `with torch.device("cpu")` by whoever makes them
    torch.set_default_device(device)
    if precision == "tf32":  # float32 matmuls on tensor cores with a 10-bit mantissa
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if mode != "eager":
        importable(module)  # dynamo imports the traced function's module by name
    fn = getattr(module, func)
    run = fn if mode == "eager" else torch.compile(fn, mode=None if mode == "default" else mode)

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
