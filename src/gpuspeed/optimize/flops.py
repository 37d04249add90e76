"""Arithmetic intensity of the original, for its place on the roofline and the target-card projection.

NumPy code: the arguments are viewed as an ndarray subclass whose __array_ufunc__ counts every ufunc call
(operators included): one FLOP per output element, per input element for a reduction, 2*M*N*K for
matmul. Values produced outside ufuncs are not followed, so the count is a lower bound. PyTorch code:
torch's FlopCounterMode (matmul, conv, attention). Counted once at a small scale; intensity (FLOPs per
byte of least traffic) is what carries over to the full size.
"""

from __future__ import annotations

import numpy as np

from gpuspeed.optimize.backends.common import kind_of
from gpuspeed.trees import leaves, nbytes


class _Counted(np.ndarray):
    flops = 0

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        plain = [x.view(np.ndarray) if isinstance(x, _Counted) else x for x in inputs]
        if out is not None:
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, _Counted) else o for o in out)
        res = getattr(ufunc, method)(*plain, **kwargs)
        if method == "__call__" and ufunc is np.matmul:
            _Counted.flops += 2 * np.shape(plain[0])[-1] * np.size(res)
        elif method in ("reduce", "accumulate", "reduceat"):
            _Counted.flops += np.size(plain[0])
        else:
            _Counted.flops += max((np.size(r) for r in (res if isinstance(res, tuple) else (res,))), default=0)
        if isinstance(res, tuple):
            return tuple(r.view(_Counted) if type(r) is np.ndarray else r for r in res)
        return res.view(_Counted) if type(res) is np.ndarray else res


class _CountingNumPy:
    """NumPy whose functions return counted arrays, so values made inside the code (np.array(x), np.zeros)
    are followed too. Bound as the module's `np` for the count."""

    __name__ = "numpy"

    def __getattr__(self, name):
        attr = getattr(np, name)
        if isinstance(attr, type) or not callable(attr):
            return attr

        def call(*a, **k):
            res = attr(*a, **k)
            if type(res) is np.ndarray:
                return res.view(_Counted)
            if isinstance(res, tuple):
                return tuple(r.view(_Counted) if type(r) is np.ndarray else r for r in res)
            return res

        return call


def _twin(module, fn):
    """fn's own counterpart in the private copy of its module (a top-level function of the same qualified name), else
    fn itself: a partial has no name, and a function made inside another is not the module's one of its name."""
    qualname = getattr(fn, "__qualname__", None)
    twin = getattr(module, qualname, None) if isinstance(qualname, str) and qualname.isidentifier() else None
    return twin if callable(twin) and getattr(twin, "__qualname__", None) == qualname else fn


def intensity(fn, args, module=None) -> dict:
    """{"flops", "bytes", "ai", "source"} for one call of fn(*args); ai None when nothing was counted.
    module: a private copy of fn's module whose NumPy names may be rebound for the count."""
    if module is not None and not any(kind_of(x) == "torch" for x in leaves(args)):
        from gpuspeed.optimize.backends.common import rebind

        rebind(module, _CountingNumPy())
        fn = _twin(module, fn)
    if any(kind_of(x) == "torch" for x in leaves(args)):
        from gpuspeed.roofline.place import count_flops

        flops, out = count_flops(fn, *args)
        source = "torch FlopCounterMode (matmul, conv, attention)"
    else:
        _Counted.flops = 0
        wrapped = tuple(a.view(_Counted) if type(a) is np.ndarray else a for a in args)
        out = fn(*wrapped)
        flops = _Counted.flops
        out = tuple(o.view(np.ndarray) if isinstance(o, _Counted) else o for o in leaves(out))
        source = "NumPy ufunc calls counted (1 FLOP per element, 2MNK per matmul; a lower bound)"
    n_bytes = nbytes(args) + nbytes(out)
    ai = flops / n_bytes if flops and n_bytes else None
    return {"flops": int(flops), "bytes": int(n_bytes), "ai": ai, "source": source}
