"""QA round 23, core: the versions a results file records."""
from __future__ import annotations

import types


def test_a_module_two_distributions_install_is_recorded_at_the_version_that_ran(monkeypatch):
    # triton and pytorch-triton both installed (torch's nightly wheel beside a plain `pip install triton`): the file
    # on disk is whichever was installed last, and versions() read the `triton` distribution's number whatever ran
    from importlib import metadata

    from gpuspeed import device

    installed = {"triton": "3.1.0", "pytorch-triton": "3.6.0+git1234"}

    def version(dist):
        if dist in installed:
            return installed[dist]
        raise metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.setitem(__import__("sys").modules, "triton", types.SimpleNamespace(__version__="3.6.0"))
    assert device.versions()["triton"] == "3.6.0"
    # one distribution: its number, as before (torch's own __version__ carries a local suffix the files never had)
    del installed["pytorch-triton"]
    assert device.versions()["triton"] == "3.1.0"
