"""Which array arguments a call both reads and writes: the traffic a launcher that returns no array hides.

A launcher that returns nothing writes its results into its arguments: `out=` buffers it only writes, or buffers it
updates in place (`x *= 2`, `out += x`, an optimizer step's parameters and moments), which move twice, read and
written. Counting each argument once (inputs read once + outputs written once, with no output) holds an in-place
kernel at full bandwidth to half of its roof. Which is which is measured, not guessed: one call on copies of the
arguments shows which it wrote; one more, on copies whose written arrays start from other values, shows which of
those it also read (what it wrote depends on what they held). Torch, NumPy and CuPy arrays; others count once.
"""

from __future__ import annotations

from typing import Any, Callable


def _differs(a, b):
    """Where two arrays of one kind hold different values (NaN equal to NaN), element by element: a torch bool tensor
    on their device, else a NumPy bool array; None where their shapes differ."""
    import numpy as np

    if hasattr(a, "untyped_storage"):  # torch: compared where it lives, no host copy of a large tensor
        import torch

        if a.shape != b.shape:
            return None
        if a.is_floating_point() or a.is_complex():
            return (a != b) & ~(torch.isnan(a) & torch.isnan(b))
        return a != b
    if hasattr(a, "__cuda_array_interface__"):  # CuPy (get), Numba device arrays (copy_to_host): to the host
        a, b = ((x.get() if hasattr(x, "get") else x.copy_to_host()) for x in (a, b))
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return None
    if a.dtype.kind in "fc":
        return (a != b) & ~(np.isnan(a) & np.isnan(b))
    return a != b


def _shift(x) -> bool:
    """Change the values of an array in place, keeping them sane: floats + 1, bools flipped, integers (maybe indices)
    rotated by one element so that every value stays one the array held (+ 1 where all are alike: no index table);
    False for a kind it cannot change."""
    from gpuspeed.trees import module_of

    if module_of(x) == "torch" and hasattr(x, "untyped_storage"):
        import torch

        if x.dtype == torch.bool:
            x.logical_not_()
        elif x.is_floating_point() or x.is_complex() or x.numel() < 2 or bool((x == x.reshape(-1)[0]).all()):
            x.add_(1)
        else:
            x.copy_(x.reshape(-1).roll(1).reshape(x.shape))
        return True
    if module_of(x) not in ("numpy", "cupy") or getattr(getattr(x, "dtype", None), "kind", "") not in "biufc":
        return False  # a Numba device array, or not an array: nothing here changes it in place
    if x.dtype.kind == "b":
        x ^= True
    elif x.dtype.kind in "fc" or x.size < 2 or bool((x == x.reshape(-1)[0]).all()):
        x += 1
    else:
        import importlib

        xp, flat = importlib.import_module(module_of(x)), x.reshape(-1)
        x[...] = xp.concatenate((flat[-1:], flat[:-1])).reshape(x.shape)
    return True


def read_and_written(fn: Callable, args: tuple, kwargs: dict, sync: Callable[[], Any] = lambda: None) -> list:
    """The array arguments (leaves of (args, kwargs), as given) that one call of fn both reads and writes, measured
    on copies of them (fn is called twice more; the arguments themselves are left as they are). `sync` waits for
    the device after a call."""
    from gpuspeed import trees

    first = trees.clone_tree((args, kwargs))  # the arguments themselves stay as they were: no third copy
    fn(*first[0], **first[1])
    sync()
    given, after = list(trees.leaves((args, kwargs))), list(trees.leaves(first))
    changed = {}  # leaf -> the elements the call wrote (changed): only those tell whether it read them first
    for i, (b, a) in enumerate(zip(given, after, strict=True)):
        if hasattr(b, "shape") and hasattr(b, "dtype") and b is not a:
            where = _differs(b, a)
            if where is None or bool(where.any()):
                changed[i] = where
    written = list(changed)
    if not written:
        return []
    other = trees.clone_tree((args, kwargs))
    moved = list(trees.leaves(other))
    shifted = set()
    for i in written:  # one array passed twice is one clone: changed once
        if id(moved[i]) not in shifted and _shift(moved[i]):
            shifted.add(id(moved[i]))
    if not shifted:
        return []
    fn(*other[0], **other[1])
    sync()
    # what it wrote changed with what the array held before: it read it too (elements it never wrote are not asked)
    read = []
    for i in written:
        if id(moved[i]) not in shifted:
            continue
        apart = _differs(after[i], moved[i])
        if apart is None or changed[i] is None or bool((apart & changed[i]).any()):
            read.append(given[i])
    return read


def read_and_written_bytes(fn: Callable, args: tuple, kwargs: dict, sync: Callable[[], Any] = lambda: None) -> int:
    """Bytes of the memory of the arguments one call reads and writes (views of one buffer counted once)."""
    from gpuspeed.roofline.place import _distinct_bytes

    return _distinct_bytes(read_and_written(fn, args, kwargs, sync))
