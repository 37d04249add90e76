"""Input specs: parse `NAME=DTYPE[SHAPE]`, `NAME=int:VALUE`, `NAME=float:VALUE` and make seeded inputs.

Shared by `gpuspeed profile --function` and the optimize pipeline; inputs come as torch tensors, NumPy
arrays or CuPy arrays, checked against free memory first. Floating arrays come from a standard normal,
integer arrays uniform in [0, 16), booleans fair coins, all from one seeded generator, so a spec list and
a seed name one exact set of inputs, whatever the backend. Never all zeros: zeros hide unwritten outputs.
"""

from __future__ import annotations

import keyword
import math
import numbers
import os
import re
from dataclasses import dataclass

from gpuspeed.errors import UserError

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8")
DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)
BACKENDS = ("torch", "numpy", "cupy")
_ALIASES = {"half": "float16", "fp16": "float16", "bf16": "bfloat16", "float": "float32", "fp32": "float32",
            "double": "float64", "fp64": "float64", "int": "int64", "long": "int64"}
INT_HIGH = 16  # integers drawn from [0, INT_HIGH): small enough to index with, large enough to be random
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ARRAY = re.compile(r"^([A-Za-z0-9_]+)\[([^\]]*)\]$")
_DIM = re.compile(r"^[0-9]+$")  # ASCII digits only: str.isdigit() also takes '³', which int() refuses
_MAX_BYTES = 2**63 - 1  # what numpy can address; a zero dimension does not let the others pass it


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
        return _numel(self.shape) * _itemsize(self.dtype)

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
    if keyword.iskeyword(name):
        raise UserError(f"bad input spec {text!r}: {name!r} is a Python keyword, which no parameter can be named")
    rhs = re.sub(r"\s+", "", rhs)  # tabs and newlines too, as a shell-quoted spec may hold
    if rhs.lower().startswith(("int:", "float:")):  # the dtype is case-blind: so is the scalar kind
        kind, _, val = rhs.partition(":")
        kind = kind.lower()
        try:
            value = int(val) if kind == "int" else float(val)
        except ValueError:
            raise UserError(f"bad input spec {text!r}: {val!r} is not a valid {kind}") from None
        if kind == "float" and not math.isfinite(value) and val.lower().lstrip("+-") not in ("inf", "infinity", "nan"):
            raise UserError(f"bad input spec {text!r}: {val} overflows a float (write inf if that is meant)")
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
        if not _DIM.match(d):
            raise UserError(f"bad input spec {text!r}: dimension {d!r} is not a non-negative integer")
        if int(d) >= 2**62:  # past what any array library can index (a zero elsewhere would hide it from the memory check)
            raise UserError(f"bad input spec {text!r}: dimension {d} is too large")
        shape.append(int(d))
    spec = InputSpec(name=name, kind="array", dtype=dtype, shape=tuple(shape))
    # numpy refuses a shape whose nonzero dimensions span more bytes than it can address, even with a zero
    # dimension beside them (an empty array the memory check sees as 0 bytes): say so here, in one line
    if _numel(d for d in shape if d) * _itemsize(_made_as(spec)) > _MAX_BYTES:
        raise UserError(f"bad input spec {text!r}: the dimensions multiply past what an array can hold")
    return spec


def parse_specs(texts) -> list[InputSpec]:
    """Parse a list of specs (one string is a list of one); names must be unique."""
    return _as_specs(texts)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _made_as(spec: InputSpec) -> str:
    """The dtype the generator draws in, before the conversion to the spec's dtype."""
    if spec.dtype in FLOAT_DTYPES:
        return "float64" if spec.dtype == "float64" else "float32"
    return "int64"  # Generator.integers draws int64


def memory_needed(specs, *, backend: str = "torch", device: str = "cpu") -> tuple[int, int]:
    """(bytes on the GPU, peak bytes on the host) that make_inputs takes for these specs.

    Each array is drawn on the host in float32/float64/int64 and converted (a second buffer when the
    dtype differs); arrays that stay on the host accumulate, ones moved to the GPU free their host
    buffers before the next is drawn.
    """
    on_gpu = backend == "cupy" or (backend == "torch" and device != "cpu")
    gpu = kept = host_peak = 0
    for s in specs:
        if s.kind != "array":
            continue
        n = _numel(s.shape)
        drawn = n * _itemsize(_made_as(s))
        converted = s.nbytes if _made_as(s) != s.dtype else 0
        host_peak = max(host_peak, kept + drawn + converted)
        if on_gpu:
            gpu += s.nbytes
        else:
            kept += s.nbytes
    return gpu, host_peak


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
        return int(text)
    except (OSError, ValueError):  # absent, or "max" (no limit)
        return None


def host_available_bytes() -> int | None:
    """Host memory this process can still take: MemAvailable, capped by a cgroup (container) limit."""
    free = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):  # not Linux-like
            return None
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, used = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and used is not None and limit < 2**60:  # v1 writes a huge number for no limit
            free = min(free, max(0, limit - used))
    return free


def gpu_available_bytes(device: str, backend: str = "torch") -> int | None:
    """Free memory on a CUDA device, counting what the backend's own pool holds unused; None if unknown."""
    try:
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        if backend == "cupy":
            import cupy

            with cupy.cuda.Device(_cuda_index(device)):
                return free + cupy.get_default_memory_pool().free_bytes()
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    except Exception:  # no CUDA here or no such device: making the inputs will say so
        return None


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**27 else f"{n / 2**20:.1f} MiB"


def _as_specs(specs) -> list[InputSpec]:
    """Specs as InputSpecs (one spec string counts as a list of one); a name given twice is refused, as
    parse_specs refuses it, rather than the later one silently replacing the earlier."""
    if isinstance(specs, (str, InputSpec)):
        specs = [specs]
    out = [s if isinstance(s, InputSpec) else parse_spec(s) for s in specs or []]
    seen: set = set()
    for s in out:
        if s.name in seen:
            raise UserError(f"input {s.name!r} is given twice")
        seen.add(s.name)
    return out


def _check_torch_device(device) -> None:
    """A one-line UserError, before anything is made, for a device torch cannot put the inputs on here."""
    if device == "cpu":
        return
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise UserError(f"unknown device {device!r} for the inputs: use cpu or cuda[:N]") from None
    if dev.type == "cpu" or dev.type == "meta":
        return
    if dev.type != "cuda":
        raise UserError(f"unknown device {device!r} for the inputs: use cpu or cuda[:N]")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise UserError(f"inputs on {device!r} need a CUDA GPU and there is none here (see `gpuspeed doctor`)")
    if dev.index is not None and dev.index >= count:
        raise UserError(f"inputs on {device!r}: there is no such GPU here ({count} visible: cuda:0"
                        f"{f'..cuda:{count - 1}' if count > 1 else ''})")


def check_memory(specs, *, backend: str = "torch", device: str = "cpu") -> None:
    """Raise UserError, before anything is allocated, when the inputs cannot fit in free memory."""
    specs = _as_specs(specs)
    gpu, host = memory_needed(specs, backend=backend, device=device)
    arrays = sorted((s for s in specs if s.kind == "array"), key=lambda s: s.nbytes, reverse=True)
    largest = f" (largest {arrays[0]}: {_gib(arrays[0].nbytes)})" if len(arrays) > 1 else ""
    if gpu:
        free = gpu_available_bytes(device, backend)
        if free is not None and gpu > free:
            raise UserError(f"the inputs need {_gib(gpu)} on {device}{largest} but only {_gib(free)} is free there; "
                            f"use smaller shapes")
    free = host_available_bytes()
    if free is not None and host > free:
        where = "to make them on the host" if gpu else "of host memory"
        raise UserError(f"the inputs need {_gib(host)} {where}{largest} but only {_gib(free)} is available; "
                        f"use smaller shapes")


def _host_array(rng, s: InputSpec):
    import numpy as np

    if s.dtype in FLOAT_DTYPES:
        return rng.standard_normal(s.shape, dtype=np.dtype(_made_as(s)))
    drawn = rng.integers(0, 2 if s.dtype == "bool" else INT_HIGH, s.shape)
    return drawn.astype(s.dtype, copy=False)


def _make_array(rng, s: InputSpec, backend: str, device: str):

    if backend == "numpy":
        return _c_order(_host_array(rng, s).astype(s.dtype, copy=False))
    if backend == "cupy":
        import cupy

        with cupy.cuda.Device(_cuda_index(device)):
            return cupy.asarray(_c_order(_host_array(rng, s).astype(s.dtype, copy=False)))
    import torch

    t = torch.from_numpy(_c_order(_host_array(rng, s))).to(getattr(torch, s.dtype))
    return t.to(device) if device != "cpu" else t


def _c_order(a):
    """The array in C order, its shape kept: np.ascontiguousarray makes a 0-d array (`x=float64[]`) 1-d."""
    import numpy as np

    return np.asarray(a, order="C")


def _cuda_index(device: str) -> int | None:
    """'cuda:1' -> 1; 'cuda' -> None (the current device)."""
    _, _, index = device.partition(":")
    return int(index) if index.isdigit() else None


def make_inputs(specs, *, seed: int = 0, backend: str = "torch", device: str = "cpu") -> dict:
    """A dict name -> value for the specs: torch tensors on `device` (backend='torch'), NumPy arrays on the
    host (backend='numpy', `device` unused) or CuPy arrays on a CUDA `device` (backend='cupy').

    The same specs and seed give the same values whatever the backend. Inputs that cannot fit in free
    memory raise UserError saying how much they need, before any is made.
    """
    import numpy as np

    if backend not in BACKENDS:
        raise UserError(f"unknown input backend {backend!r}: use {', '.join(BACKENDS)}")
    specs = _as_specs(specs)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise UserError(f"the input seed is a whole number >= 0, got {seed!r}")
    if backend == "torch":
        _check_torch_device(device)
    if backend != "torch":
        for s in specs:
            if s.dtype == "bfloat16":
                raise UserError(f"input {s.name}: {backend} arrays have no bfloat16 (torch tensors do)")
    out_of_memory: tuple = (MemoryError,)
    if backend == "cupy":
        if not device.startswith("cuda"):
            raise UserError(f"CuPy inputs live on a CUDA GPU, not on {device!r}")
        try:
            import cupy
        except ImportError:
            raise UserError("--backend cupy needs CuPy: pip install 'gpuspeed[cupy]'") from None
        out_of_memory += (cupy.cuda.memory.OutOfMemoryError,)
    if backend == "torch":
        import torch

        out_of_memory += (getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError),)
    check_memory(specs, backend=backend, device=device)
    rng = np.random.default_rng(seed)
    out = {}
    for s in specs:
        if s.kind != "array":
            out[s.name] = s.value
            continue
        try:
            out[s.name] = _make_array(rng, s, backend, device)
        except out_of_memory as exc:  # the check above cannot see what others allocate meanwhile
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UserError(f"out of memory making input {s} ({_gib(s.nbytes)}): {first}") from None
    return out
