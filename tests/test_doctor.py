"""doctor's report: one plain line on where studies run."""

from gpuspeed import device, doctor
from gpuspeed.cli import main


def test_headline_says_once_that_there_is_no_gpu_and_why():
    info = device.get_device("cpu")
    line = doctor.headline(info)
    if not device.cuda_available():
        assert line.startswith("No CUDA GPU here (torch ")
        assert line.lower().count("no cuda") == 1 and "CPU" in line and "RAM" in line
    assert "\n" not in line


def test_report_carries_the_headline():
    rep = doctor.report()
    assert rep["headline"] == doctor.headline(device.get_device("auto"))
    assert rep["headline"].startswith("CUDA GPU: " if rep["gpu"] else "No CUDA GPU here")


def test_cli_says_it_once(capsys):
    assert main(["doctor"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    rep = doctor.report()
    assert rep["headline"] in out  # on a GPU too: "CUDA GPU: <name> (<memory>)" above the device table
    assert out.lower().count("no cuda gpu") == (0 if rep["gpu"] else 1)


def test_torch_compile_on_the_cpu_needs_a_cpp_compiler(monkeypatch):
    # doctor said "usable" on a CPU machine without g++, where inductor fails at its first compile
    import shutil

    import torch

    from gpuspeed import device

    monkeypatch.setattr(shutil, "which", lambda name: None)
    b = device._torch_compile(torch, False, None)
    assert not b.usable and "no C++ compiler" in b.why
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    b = device._torch_compile(torch, False, None)
    assert b.usable and "C++ on CPU" in b.why


def test_a_backend_probe_failing_without_a_message_is_still_one_line(monkeypatch):
    # str(exc).splitlines()[0] raised IndexError on an empty message, and doctor crashed
    import importlib

    from gpuspeed import device

    real = importlib.import_module

    def broken(name, *a, **k):
        if name == "torch":
            raise ImportError()
        return real(name, *a, **k)

    monkeypatch.setattr(importlib, "import_module", broken)
    mod, why = device._probe("torch")
    assert mod is None and why == "import failed: ImportError"


def test_a_reason_with_brackets_prints_as_written(monkeypatch, capsys):
    # a library error quoted as a reason ("[/usr/lib]", "[/]") was read as rich markup: a MarkupError traceback
    real = device.backends

    def quoting():
        return [device.Backend("cupy", False, "import failed: cannot open [/usr/lib/libcuda.so] [/] [red]")] + real()

    monkeypatch.setattr(device, "backends", quoting)
    from rich.console import Console

    from gpuspeed import cli

    monkeypatch.setattr(cli, "console", Console(width=400))  # no wrapping inside the table's cells
    assert main(["doctor"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "[/usr/lib/libcuda.so] [/] [red]" in out
