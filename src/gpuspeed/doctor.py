"""`gpuspeed doctor`: what this machine is, what it can run, and the datasheet peaks it is held to."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import asdict

from gpuspeed import device as _device
from gpuspeed.memory import format_bytes


def headline(info: _device.DeviceInfo) -> str:
    """One plain line: the GPU doctor found, or why there is none and where studies run instead."""
    if info.kind == "cuda":
        return f"CUDA GPU: {info.name} ({format_bytes(info.mem_bytes)})"
    try:
        import torch

        why = ("torch is a CPU-only build" if torch.version.cuda is None else
               f"torch {torch.__version__} is a CUDA build, but sees no GPU: {_device.why_no_device()}")
    except ModuleNotFoundError as exc:
        why = ("torch is not installed" if exc.name == "torch" else
               f"torch cannot be imported: {str(exc).strip().splitlines()[0] if str(exc).strip() else 'no module'}")
    except Exception as exc:  # installed but broken (a CUDA library missing: torch's loader raises OSError, ValueError)
        text = str(exc).strip().splitlines()
        why = f"torch cannot be imported: {text[0] if text else type(exc).__name__}"
    return f"No CUDA GPU here ({why}): studies run on the CPU ({info.name}, {format_bytes(info.mem_bytes)} RAM)."


def _torch_breaks_beyond_import_error() -> bool:
    """Whether `import torch` raises something other than ImportError: torch's loader raises OSError for a CUDA library
    it cannot open and ValueError for a pip CUDA library that is missing, which the device checks do not expect."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    except Exception:
        return True
    return False


@contextmanager
def _torch_unimportable(hide: bool):
    """While `hide`, `import torch` raises ImportError (None in sys.modules): the device checks read the broken install
    as no GPU, as they read a torch that cannot be imported, instead of ending doctor in its traceback."""
    if not hide:
        yield
        return
    sys.modules["torch"] = None
    try:
        yield
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]


def report() -> dict:
    """Everything doctor shows, as plain data (the CLI only formats it)."""
    with _torch_unimportable(_torch_breaks_beyond_import_error()):
        info = _device.get_device("auto")
        versions = _device.versions()
    sheet = info.datasheet
    return {
        "headline": headline(info),  # headline and backends import torch themselves, to say why it fails
        "device": info.to_dict() | {"slug": info.slug},
        "gpu": info.kind == "cuda",
        "versions": versions,
        "backends": [asdict(b) for b in _device.backends()],
        "datasheet": asdict(sheet) if sheet else None,
        "datasheet_note": None if sheet or info.kind != "cuda" else f"no datasheet entry for {info.name}",
        "datasheets": [asdict(s) for _, s in _device.DATASHEETS],
    }
