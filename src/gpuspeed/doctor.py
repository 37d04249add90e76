"""`gpuspeed doctor`: what this machine is, what it can run, and the datasheet peaks it is held to."""

from __future__ import annotations

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
               f"torch {torch.__version__} is a CUDA build, but sees no GPU: no driver or device visible")
    except ModuleNotFoundError as exc:
        why = ("torch is not installed" if exc.name == "torch" else
               f"torch cannot be imported: {str(exc).strip().splitlines()[0] if str(exc).strip() else 'no module'}")
    except ImportError as exc:  # installed but broken (a CUDA library missing): not to be reinstalled blindly
        text = str(exc).strip().splitlines()
        why = f"torch cannot be imported: {text[0] if text else type(exc).__name__}"
    return f"No CUDA GPU here ({why}): studies run on the CPU ({info.name}, {format_bytes(info.mem_bytes)} RAM)."


def report() -> dict:
    """Everything doctor shows, as plain data (the CLI only formats it)."""
    info = _device.get_device("auto")
    sheet = info.datasheet
    return {
        "headline": headline(info),
        "device": info.to_dict() | {"slug": info.slug},
        "gpu": info.kind == "cuda",
        "versions": _device.versions(),
        "backends": [asdict(b) for b in _device.backends()],
        "datasheet": asdict(sheet) if sheet else None,
        "datasheet_note": None if sheet or info.kind != "cuda" else f"no datasheet entry for {info.name}",
        "datasheets": [asdict(s) for _, s in _device.DATASHEETS],
    }
