"""A PyTorch original on the GPU: tensors moved once, tensors the code creates made there too (default
device), eager or compiled. Models go with them: an nn.Module argument, the module-level models and weight tensors
the code reads, and an original that is a model or its bound forward run on copies moved to the device."""

import copy

import torch

from gpuspeed.optimize.backends.common import Impl, demote_scalar, host_tree, importable, torch_settings, tree_map


def build(module, func="original", precision="as-written", out_dtypes=None, mode="eager", device="cuda", **_):
    demote = precision == "float32"
    if mode != "eager":
        importable(module)  # dynamo imports the traced function's module by name

    def move_tensor(t):
        t = t.to(device)
        return t.float() if demote and t.dtype == torch.float64 else t

    moving = device != "cpu" or demote  # else the models and tensors are where they are run, as they are
    if moving:
        # `model = Net()` or `W = torch.randn(...)` at module level stayed on the CPU: every GPU call then failed with
        # "Expected all tensors to be on the same device". This module is the candidate's own copy of the workload's
        moved = {}  # one copy each: `model` and `original = model.forward` share it
        for name, value in list(vars(module).items()):
            if not name.startswith("__"):
                setattr(module, name, _moved(value, move_tensor, moved))
        fn = _on_its_model(getattr(module, func), move_tensor, moved)
    else:
        fn = getattr(module, func)
    run = fn if mode == "eager" else torch.compile(fn, mode=None if mode == "default" else mode)
    # in each call, tensors the code creates (torch.zeros(n)) land on the GPU too, and "tf32" runs float32 matmuls on
    # tensor cores with a 10-bit mantissa; the caller's own settings come back after it
    run = torch_settings(run, device=device, tf32=precision == "tf32")

    def prepare(args):
        moved_here = {}

        def move(x):
            if isinstance(x, torch.Tensor) or moving and isinstance(x, torch.nn.Module):
                return _moved(x, move_tensor, moved_here)  # a model passed in: a copy on the device, the caller's stays
            return demote_scalar(x) if demote else x
        return tree_map(move, args)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    impl = Impl(run, prepare, lambda out: host_tree(out, out_dtypes), device=device, sync=sync,
                label=f"PyTorch on {device} ({mode}, {precision})")
    # the module-level models and tensors moved above stay on the device for every call: the VRAM budget counts them
    impl.held_bytes = _device_bytes(moved.values()) if moving and device != "cpu" else 0
    return impl


def _moved(x, move_tensor, memo):
    """x on the device: a tensor moved, an nn.Module copied with its parameters and buffers moved (the caller's own
    stays where it is), a tuple, list or dict of them with each moved; anything else x itself. memo (id -> copy) keeps
    one copy of an object reached twice."""
    if id(x) in memo:
        return memo[id(x)]
    if isinstance(x, torch.Tensor):
        out = move_tensor(x)
    elif isinstance(x, torch.nn.Module):
        out = _moved_module(x, move_tensor, memo)
    elif isinstance(x, (tuple, list, dict)) and _holds_tensors(x):
        out = tree_map(lambda v: _moved(v, move_tensor, memo), x)
    else:
        return x
    memo[id(x)] = out
    return out


def _device_bytes(values) -> int:
    """Bytes of the tensors and models' parameters and buffers among values, each tensor once."""
    seen = {}

    def note(v):
        if isinstance(v, torch.Tensor):
            seen[id(v)] = v
        elif isinstance(v, torch.nn.Module):
            seen.update((id(t), t) for t in (*v.parameters(), *v.buffers()))
        return v
    for v in values:
        tree_map(note, v)
    return sum(t.element_size() * t.numel() for t in seen.values())


def _holds_tensors(tree) -> bool:
    found = []
    tree_map(lambda v: found.append(isinstance(v, (torch.Tensor, torch.nn.Module))), tree)
    return any(found)


def _moved_module(m, move_tensor, memo):
    """A copy of the model with its parameters, buffers and plain tensor attributes on the device (shared parameters
    stay shared); the parameters are copied straight to the device, not first on the host."""
    seen = {}
    for t in [*m.parameters(), *m.buffers()]:
        if id(t) not in seen:
            moved = move_tensor(t.detach())
            if isinstance(t, torch.nn.Parameter):
                moved = torch.nn.Parameter(moved, requires_grad=t.requires_grad)
            seen[id(t)] = moved
    out = copy.deepcopy(m, seen)
    for sub in out.modules():  # `self.mask = torch.tril(...)`, not registered as a buffer
        for name, value in list(vars(sub).items()):
            if isinstance(value, torch.Tensor) and not name.startswith("_"):
                setattr(sub, name, _moved(value, move_tensor, memo))
    return out


def _on_its_model(fn, move_tensor, memo):
    """The original, on the device: a model (`original = model`) is already its moved copy; a bound method of one
    (`original = model.forward`) is that method of the model's copy."""
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        return getattr(_moved(owner, move_tensor, memo), fn.__name__)
    return fn
