"""`gpuspeed doctor`: what this machine is, what it can run, and the datasheet peaks it is held to."""

from __future__ import annotations

from dataclasses import asdict

from gpuspeed import device as _device


def report() -> dict:
    """Everything doctor shows, as plain data (the CLI only formats it)."""
    info = _device.get_device("auto")
    sheet = info.datasheet
    return {
        "device": info.to_dict() | {"slug": info.slug},
        "gpu": info.kind == "cuda",
        "versions": _device.versions(),
        "backends": [asdict(b) for b in _device.backends()],
        "datasheet": asdict(sheet) if sheet else None,
        "datasheet_note": None if sheet or info.kind != "cuda" else f"no datasheet entry for {info.name}",
        "datasheets": [asdict(s) for _, s in _device.DATASHEETS],
    }
