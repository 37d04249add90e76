"""Input specs: parse `NAME=DTYPE[SHAPE]`, `NAME=int:VALUE`, `NAME=float:VALUE` and make seeded inputs.

Shared by `gpuspeed profile --function` and the optimize pipeline. Floating arrays come from a standard
normal, integer arrays uniform in [0, 16), booleans fair coins, all from one seeded generator, so a
spec list and a seed name one exact set of inputs. Never zeros: zeros hide unwritten outputs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuspeed.errors import UserError

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8")
DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)
_ALIASES = {"half": "float16", "fp16": "float16", "bf16": "bfloat16", "float": "float32", "fp32": "float32",
            "double": "float64", "fp64": "float64", "int": "int64", "long": "int64"}
INT_HIGH = 16  # integers drawn from [0, INT_HIGH): small enough to index with, large enough to be random
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ARRAY = re.compile(r"^([A-Za-z0-9_]+)\[([^\]]*)\]$")


@dataclass(frozen=True)
class InputSpec:
    """One named input: an array (dtype + shape) or a scalar (kind 'int'/'float' + value)."""

    name: str
    kind: str  # "array", "int" or "float"
    dtype: str | None = None
    shape: tuple[int, ...] = ()
    value: int | float | None = None

    @property
    def nbytes(self) -> int:
        if self.kind != "array":
            return 0
        n = 1
        for s in self.shape:
            n *= s
        return n * _itemsize(self.dtype)

    def __str__(self) -> str:
        if self.kind == "array":
            return f"{self.name}={self.dtype}[{','.join(map(str, self.shape))}]"
        return f"{self.name}={self.kind}:{self.value}"


def _itemsize(dtype: str) -> int:
    return {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "int16": 2, "int32": 4,
            "int64": 8, "uint8": 1, "bool": 1}[dtype]


def parse_spec(text: str) -> InputSpec:
    """Parse one spec; a malformed one raises UserError saying what is wrong and what is expected."""
    hint = "expected NAME=DTYPE[SHAPE] (e.g. x=float32[4096,1024]) or NAME=int:VALUE / NAME=float:VALUE"
    if not isinstance(text, str) or "=" not in text:
        raise UserError(f"bad input spec {text!r}: {hint}")
    name, _, rhs = (part.strip() for part in text.partition("="))
    if not _NAME.match(name):
        raise UserError(f"bad input spec {text!r}: {name!r} is not a Python identifier")
    rhs = rhs.replace(" ", "")
    if rhs.startswith(("int:", "float:")):
        kind, _, val = rhs.partition(":")
        try:
            value = int(val) if kind == "int" else float(val)
        except ValueError:
            raise UserError(f"bad input spec {text!r}: {val!r} is not a valid {kind}") from None
        return InputSpec(name=name, kind=kind, value=value)
    m = _ARRAY.match(rhs)
    if not m:
        raise UserError(f"bad input spec {text!r}: {hint}")
    dtype = _ALIASES.get(m.group(1).lower(), m.group(1).lower())
    if dtype not in DTYPES:
        raise UserError(f"bad input spec {text!r}: unknown dtype {m.group(1)!r} (use one of {', '.join(DTYPES)})")
    dims = [d for d in m.group(2).split(",")] if m.group(2) else []
    shape = []
    for d in dims:
        if not d.isdigit():
            raise UserError(f"bad input spec {text!r}: dimension {d!r} is not a non-negative integer")
        shape.append(int(d))
    return InputSpec(name=name, kind="array", dtype=dtype, shape=tuple(shape))


def parse_specs(texts) -> list[InputSpec]:
    """Parse a list of specs; names must be unique."""
    specs = [parse_spec(t) for t in texts or []]
    seen = set()
    for s in specs:
        if s.name in seen:
            raise UserError(f"input {s.name!r} is given twice")
        seen.add(s.name)
    return specs


def make_inputs(specs, *, seed: int = 0, backend: str = "torch", device: str = "cpu") -> dict:
    """A dict name -> value for the specs: torch tensors on `device`, or NumPy arrays (backend='numpy')."""
    import numpy as np

    if backend not in ("torch", "numpy"):
        raise UserError(f"unknown input backend {backend!r}: use torch or numpy")
    specs = [parse_spec(s) if isinstance(s, str) else s for s in specs]
    rng = np.random.default_rng(seed)
    out = {}
    for s in specs:
        if s.kind != "array":
            out[s.name] = s.value
            continue
        if s.dtype in FLOAT_DTYPES:
            host = rng.standard_normal(s.shape, dtype=np.float32 if s.dtype != "float64" else np.float64)
        elif s.dtype == "bool":
            host = rng.integers(0, 2, s.shape).astype(bool)
        else:
            host = rng.integers(0, INT_HIGH, s.shape).astype(s.dtype)
        if backend == "numpy":
            if s.dtype == "bfloat16":
                raise UserError(f"input {s.name}: NumPy has no bfloat16; use --backend torch")
            out[s.name] = np.ascontiguousarray(host.astype(s.dtype))
        else:
            import torch

            t = torch.from_numpy(np.ascontiguousarray(host)).to(getattr(torch, s.dtype))
            out[s.name] = t.to(device) if device != "cpu" else t
    return out
