"""The results schema: stamp, atomic write, read-back and validation."""

import json
import math
import os
import stat

import numpy as np
import pytest

from gpuspeed.errors import UserError
from gpuspeed.results import REQUIRED, make_results, read_results, write_results


def test_round_trip(tmp_path):
    doc = make_results("demo", params={"n": 3}, summary={"x": 1.5, "ok": True, "nan": math.nan},
                       rows=[{"a": np.float32(2.0), "b": np.arange(3)}], notes=["hi"], device="cpu")
    for key in REQUIRED:
        assert key in doc
    assert doc["schema"] == 1 and doc["study"] == "demo"
    assert doc["summary"]["nan"] is None  # NaN is not JSON
    assert doc["rows"][0] == {"a": 2.0, "b": [0, 1, 2]}
    assert doc["device"]["slug"] == "cpu" and doc["versions"]["python"]
    assert isinstance(doc["command"], list)
    path = write_results(doc, tmp_path / "out")
    assert path == tmp_path / "out" / "demo.json"
    assert read_results(path) == json.loads(json.dumps(doc))
    assert not list((tmp_path / "out").glob(".*tmp"))  # no temp file left behind


def test_write_to_explicit_json_path(tmp_path):
    doc = make_results("demo", device="cpu")
    assert write_results(doc, tmp_path / "x.json") == tmp_path / "x.json"


def test_git_commit_from_env(monkeypatch):
    monkeypatch.setenv("GPUSPEED_GIT", "abc123")
    assert make_results("demo", device="cpu")["git"] == "abc123"


def test_validation_errors(tmp_path):
    with pytest.raises(UserError):
        make_results("bad name!")
    with pytest.raises(UserError):
        write_results({"study": "x"}, tmp_path)
    doc = make_results("demo", device="cpu")
    doc["summary"] = {"k": [1, 2]}
    with pytest.raises(UserError):
        write_results(doc, tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(UserError):
        read_results(bad)
    with pytest.raises(UserError):
        read_results(tmp_path / "missing.json")


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_results_file_mode_follows_the_umask(tmp_path, mask):
    # mkstemp creates 0600; a results file must get the mode any other file the process writes gets
    old = os.umask(mask)
    try:
        path = write_results(make_results("demo", device="cpu"), tmp_path)
        other = tmp_path / "other.md"
        other.write_text("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask
    assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE(other.stat().st_mode)


def test_an_out_folder_named_like_a_json_file_is_written_into(tmp_path, capsys):
    """`--out res.json` is made a folder before the work (check_out_dir); the results then go inside it."""
    from gpuspeed.cli import main

    assert main(["bench", "--rows", "8", "--cols", "8", "--budget", "0.05", "--device", "cpu",
                 "--out", str(tmp_path / "res.json")]) == 0
    assert (tmp_path / "res.json" / "bench_demo.json").is_file()
