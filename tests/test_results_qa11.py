"""Results files record the command as it was given: `gpuspeed.cli.main([...])` called from Python (a notebook, a
script) records those arguments, not the host process's own sys.argv (a notebook kernel's launcher)."""

import json
import sys

from gpuspeed import cli


def test_cli_main_called_with_arguments_records_them_as_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/usr/lib/ipykernel_launcher.py", "-f", "kernel-123.json"])
    args = ["bench", "--device", "cpu", "--rows", "16", "--cols", "32", "--budget", "0.05", "--out", str(tmp_path)]
    assert cli.main(args) == 0
    doc = json.loads((tmp_path / "bench_demo.json").read_text())
    assert doc["command"] == ["gpuspeed", *args], doc["command"]
    assert sys.argv == ["/usr/lib/ipykernel_launcher.py", "-f", "kernel-123.json"]  # the host's own argv untouched
