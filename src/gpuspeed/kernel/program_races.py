"""Data races between the programs of one interpreted Triton launch.

A GPU runs the programs of a launch in any order and at once, with nothing ordering one program's memory accesses
against another's; the Triton interpreter runs them one after another, so a program that reads what another wrote
(`acc = tl.load(out); tl.store(out, acc + tl.sum(x))` from every program) gets the sum a GPU would lose. While a
Capture is open each interpreted launch's loads and stores are noted (live lanes only) and, when it ends, an element
that one program writes and another reads, or that two programs write with different values, is a ProgramRace
naming the kernel, the argument and the two programs. A launch that uses atomics (tl.atomic_*) orders its programs
itself (locks, counters, the last-program idiom) and is not judged, as the CUDA simulator's blocks are not.
"""

from __future__ import annotations

import numpy as np


MAX_LANES = 1 << 23  # accesses noted per launch; past them (hundreds of MB) the launch is not judged


class ProgramAccesses:
    """The loads and stores of one interpreted launch: addresses, programs, stored values."""

    def __init__(self, kernel: str, names: list):
        self.kernel = kernel
        self.names = names  # [(start, end, name, itemsize)] of its tensor arguments
        self.atomic = False
        self.lanes = 0
        self._reads: list = []  # (addresses, program)
        self._writes: list = []  # (addresses, program, values)

    def note(self, op: str, builder, ptrs, mask, value=None) -> None:
        """One tl.load / tl.store of the launch: its live lanes' addresses, and the stored values."""
        data = getattr(ptrs, "data", None)
        dims = tuple(getattr(builder, "grid_dim", None) or ())
        if (self.atomic or self.lanes > MAX_LANES or not isinstance(data, np.ndarray) or data.dtype.kind not in "iu"
                or np.prod(dims) <= 1):
            return  # a launch of one program has no other to race with
        addrs = data.astype(np.uint64)
        live = None
        if mask is not None and getattr(mask, "data", None) is not None:
            live = np.broadcast_to(np.asarray(mask.data, dtype=bool), addrs.shape)
        x, y, z = (tuple(builder.grid_idx) + (0, 0, 0))[:3]
        program = x + dims[0] * (y + dims[1] * z)
        pick = (lambda a: a[live]) if live is not None else (lambda a: a.reshape(-1))
        self.lanes += addrs.size
        if self.lanes > MAX_LANES:  # too many to hold: not judged, as a launch with atomics is not
            self._reads, self._writes = [], []
            return
        if op == "store":
            values = np.broadcast_to(np.asarray(getattr(value, "data", value)), addrs.shape)
            self._writes.append((pick(addrs), program, pick(values).astype(np.float64, copy=False)))
        else:
            self._reads.append((pick(addrs), program))

    def race(self, grid_dim) -> str | None:
        """The first race of the launch, in words; None when none (or it uses atomics)."""
        if self.atomic or self.lanes > MAX_LANES or not self._writes:
            return None
        w_addr = np.concatenate([a for a, _, _ in self._writes])
        w_prog = np.concatenate([np.full(a.size, p, dtype=np.int64) for a, p, _ in self._writes])
        w_val = np.concatenate([v for _, _, v in self._writes])
        if not w_addr.size:
            return None
        order = np.lexsort((w_prog, w_addr))
        w_addr, w_prog, w_val = w_addr[order], w_prog[order], w_val[order]
        addrs, first = np.unique(w_addr, return_index=True)
        last = np.r_[first[1:], w_addr.size] - 1
        lo, hi = w_prog[first], w_prog[last]  # the lowest and highest program writing each element
        # two programs writing one element with different values (one flag value stored by many is no race)
        low_val, high_val = np.minimum.reduceat(w_val, first), np.maximum.reduceat(w_val, first)
        nans = np.add.reduceat(np.isnan(w_val).astype(np.int64), first)  # all NaN is one value; NaN and 1.0 are two
        alike = (low_val == high_val) | (nans == np.r_[first[1:], w_addr.size] - first)
        clash = np.flatnonzero((lo != hi) & ~alike)
        if clash.size:
            i = clash[0]
            return self._say(int(addrs[i]), int(lo[i]), "writes", int(hi[i]), "writes", grid_dim)
        for a, p in self._reads:
            if not a.size:
                continue
            at = np.minimum(np.searchsorted(addrs, a), addrs.size - 1)
            hit = addrs[at] == a
            other = hit & ~((lo[at] == p) & (hi[at] == p))  # written by a program other than the reader
            if other.any():
                j = int(np.flatnonzero(other)[0])
                writer = int(lo[at[j]]) if int(lo[at[j]]) != p else int(hi[at[j]])
                return self._say(int(a[j]), writer, "writes", p, "reads", grid_dim)
        return None

    def _say(self, addr: int, one: int, one_does: str, other: int, other_does: str, grid_dim) -> str:
        where = next(((name, (addr - start) // max(1, size)) for start, end, name, size in self.names
                      if start <= addr < end), ("an array argument", None))
        element = where[0] if where[1] is None else f"{where[0]}[{where[1]}]"
        return (f"{self.kernel}: a data race between programs on {element}: program_id {_program(one, grid_dim)} "
                f"{one_does} it and program_id {_program(other, grid_dim)} {other_does} it in the same launch, with "
                "nothing ordering them: on a GPU a launch's programs run at once and in any order (the interpreter "
                "runs them one after another, which hides it); use tl.atomic_add where programs update one element, "
                "or write into an array the kernel does not read")


def _program(linear: int, grid_dim) -> tuple:
    gx, gy = (tuple(grid_dim) + (1, 1))[:2]
    return (linear % gx, linear // gx % gy, linear // (gx * gy))


def tensor_names(fn, args_hst, kwargs_hst) -> list:
    """[(start, end, name, itemsize)] of the torch tensors among an interpreted launch's host arguments."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    named = [(params[i] if i < len(params) else f"argument {i}", a) for i, a in enumerate(args_hst)]
    named += list((kwargs_hst or {}).items())
    out = []
    for name, a in named:
        if hasattr(a, "data_ptr") and hasattr(a, "element_size") and hasattr(a, "untyped_storage"):
            st = a.untyped_storage()
            out.append((int(a.data_ptr()), int(st.data_ptr()) + int(st.nbytes()), name, int(a.element_size())))
    return out
