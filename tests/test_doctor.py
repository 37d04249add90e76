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
    assert doctor.report()["headline"] in out
    assert out.lower().count("no cuda gpu") == 1
