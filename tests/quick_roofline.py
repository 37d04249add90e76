"""A CPU roofline that takes seconds, for tests of what it writes or says, not of what it measures: 3 samples a timing
(place() and the ceilings) and 16 MiB bandwidth buffers instead of 128 MiB. Applied by conftest's quick_cpu_roofline
fixture, and by tests/test_notebooks.py in the roofline notebook's kernel."""

import importlib


def patch(set_attr=setattr) -> None:
    """set_attr: monkeypatch.setattr (undone after the test), or setattr in a notebook's own kernel process."""
    for name in ("ceilings", "place"):
        mod = importlib.import_module(f"gpuspeed.roofline.{name}")
        set_attr(mod, "bench", lambda *a, _real=mod.bench, **k: _real(
            *a, **(k | {"budget_s": 0.01, "warmup_s": 0.0, "min_samples": 3})))
    ceilings = importlib.import_module("gpuspeed.roofline.ceilings")
    set_attr(ceilings, "cpu_steps", lambda quick, nbytes=None, _real=ceilings.cpu_steps: _real(quick, 2**24))
