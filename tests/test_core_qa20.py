"""QA round 20, core: format_time's rounding past a unit's end, roofline place()'s byte count, launch --explain's
first dynamic-shape recompile, and a demanding user's pass over `gpuspeed profile`."""

from __future__ import annotations

import json

import pytest

from gpuspeed.stats import format_time

# -- format_time: a value that rounds up to 1000 of a unit reads as 1 of the next -------------------------------


@pytest.mark.parametrize(("seconds", "text"), [
    (9.9996e-07, "1.000 us"), (9.99996e-4, "999.996 us"), (9.999996e-4, "1.000 ms"), (0.9999996, "1.000 s"),
    (9.9994e-07, "999.9 ns"), (1e-6, "1.000 us"), (5e-9, "5.0 ns"), (0.0, "0.0 ns"), (-2e-3, "-2.000 ms"),
    (-9.9996e-07, "-1.000 us"), (1234.5, "1234.500 s"),
])
def test_format_time_rolls_over_to_the_next_unit(seconds, text):
    assert format_time(seconds) == text


# -- roofline place(): bytes= is a whole byte count, never truncated ----------------------------------------------


def _cpu_ceilings():
    from gpuspeed.roofline.ceilings import Ceiling, Ceilings

    return Ceilings("cpu", "test", [Ceiling("copy", "memory", 20.0), Ceiling("fp32", "compute", 0.5)])


@pytest.mark.parametrize("nbytes", [1.5, 4096.25, 0.5])
def test_place_refuses_a_fractional_byte_count(nbytes):
    import torch

    from gpuspeed.errors import UserError
    from gpuspeed.roofline import place

    x = torch.randn(64)
    with pytest.raises(UserError, match=r"bytes must be .*a whole number of bytes per call, got " + repr(nbytes)):
        place(lambda t: t * 2, x, flops=64, bytes=nbytes, ceilings=_cpu_ceilings())


def test_place_takes_an_integral_float_byte_count_as_given():
    import numpy as np
    import torch

    from gpuspeed.roofline import place

    x = torch.randn(64)
    for nbytes in (512.0, np.int64(512)):
        p = place(lambda t: t * 2, x, flops=64, bytes=nbytes, ceilings=_cpu_ceilings(), budget_s=0.05,
                  min_samples=5, max_samples=20)
        assert p.bytes == 512 and type(p.bytes) is int


# -- launch --explain: the first dynamic-shape recompile is torch.compile's normal behaviour ----------------------


def _explain_cli(tmp_path, source: str):
    from typer.testing import CliRunner

    from gpuspeed.cli import app

    (tmp_path / "work.py").write_text(source)
    res = CliRunner().invoke(app, ["launch", "--explain", f"{tmp_path / 'work.py'}:f", "--out", str(tmp_path)],
                             env={"COLUMNS": "400"})  # one report line a line
    assert res.exit_code == 0, res.output
    return res.output, json.loads((tmp_path / "explain.json").read_text())


def test_explain_says_the_first_new_size_recompile_is_expected(tmp_path):
    src = "import torch\ndef f(x):\n    return torch.sin(x) * 2\ndef make_inputs():\n    return (torch.randn(4, 8),)\n"
    text, doc = _explain_cli(tmp_path, src)
    line = next(ln for ln in text.splitlines() if "recompiles over" in ln)
    assert text.startswith("f: 1 graph(s)") and "expected" in line and "dynamic" in line, text
    assert "size mismatch" in text and "(expected" in text, text
    assert doc["recompiles"] == 1 and doc["expected_recompiles"] == 1, doc


def test_explain_keeps_a_recompile_at_every_new_value_flagged(tmp_path):
    # range(n) specializes on n: every new n compiles again, past the first (expected) dynamic attempt
    src = ("import torch\ndef f(x, n):\n    for _ in range(n):\n        x = x + 1\n    return x\n"
           "def make_inputs():\n    return (torch.randn(4, 8), 3)\n")
    text, doc = _explain_cli(tmp_path, src)
    line = next(ln for ln in text.splitlines() if "recompiles over" in ln)
    assert "1 more" in line, text
    flagged = [ln for ln in text.splitlines() if ln.strip().startswith("- ") and "(expected" not in ln]
    assert any("n == 4" in ln for ln in flagged), text
    assert doc["recompiles"] == 2 and doc["expected_recompiles"] == 1, doc


# -- profile: time blocked in sleep, a pipe or a child process is waiting, not interpreter time --------------------


def _wait_on_a_pipe(n):
    import os
    import threading
    import time

    import numpy as np

    x = np.random.default_rng(n).random(n)
    time.sleep(0.02)
    r, w = os.pipe()  # a thread writes once it has slept: the read blocks
    writer = threading.Thread(target=lambda: (time.sleep(0.03), os.write(w, b"x")))
    writer.start()
    os.read(r, 1)
    writer.join()
    os.close(r)
    os.close(w)
    return float(x.sum())


def test_profile_books_blocking_waits_as_waiting_not_interpreter():
    import gpuspeed

    res = gpuspeed.profile(_wait_on_a_pipe, 64, steps=1, warmup=0, device="cpu")
    cp = res.hotspots["cprofile"]
    assert cp["shares"]["waiting"] > 0.5 and cp["shares"]["interpreter"] < 0.2, cp["shares"]
    assert cp["verdict"].startswith("waiting"), cp["verdict"]
    waits = [r for r in cp["top"] if r["name"] in ("<built-in method time.sleep>", "<built-in method posix.read>")]
    assert waits and all(r["category"] == "waiting" for r in waits), cp["top"]
    # starting the writer thread is the OS's work: not interpreter time either
    start = [r for r in cp["top"] if r["name"] in ("<built-in method _thread.start_new_thread>",
                                                   "<built-in method _thread.start_joinable_thread>")]  # 3.13
    assert start and start[0]["category"] == "other", cp["top"]
    assert "waiting" in res.markdown() and res.summary()["waiting_share"] > 0.5


# -- profile: a script that fails on a later run (it is not re-runnable) is told apart from one that fails ------------


def test_profile_says_which_run_of_a_script_failed(tmp_path, monkeypatch, capsys):
    from gpuspeed.cli import main

    script = tmp_path / "makes_a_folder.py"
    script.write_text("import os\nimport numpy as np\nos.mkdir('outdir')\n"
                      "np.save('outdir/x.npy', np.random.default_rng(0).random(8))\n")
    monkeypatch.chdir(tmp_path)
    assert main(["profile", "--no-hotspots", "--device", "cpu", str(script)]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("gpuspeed: error: ") and "FileExistsError" in line and "makes_a_folder.py:3" in line, line
    assert "run 2 of 2" in line and "run 1 ended normally" in line, line
    assert (tmp_path / "outdir" / "x.npy").is_file()  # the first run's work, done as `python script.py` does it

    (tmp_path / "fails.py").write_text("raise ValueError('bad config')\n")
    assert main(["profile", "--no-hotspots", "--device", "cpu", str(tmp_path / "fails.py")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "bad config" in line and "run 1" not in line, line


def test_printing_a_profile_result_prints_its_report():
    import numpy as np

    import gpuspeed

    def scale(x):
        return x * 2.0

    res = gpuspeed.profile(scale, np.random.default_rng(1).random(16), steps=1, warmup=0, device="cpu",
                           hotspots=False)
    text = str(res)
    assert text.startswith("Profile of scale on cpu, 1 step.") and "ProfileResult(" not in text, text[:300]
    assert all(n[:60] in text for n in res.notes), text


def test_profile_imports_the_scripts_own_neighbour_named_like_a_loaded_module(tmp_path, capsys):
    import cProfile  # noqa: F401  (loads the standard library's `profile`, as gpuspeed's hotspot pass does)

    from gpuspeed.cli import main

    # `python main.py` imports the folder's own profile.py: its folder comes first on sys.path
    (tmp_path / "profile.py").write_text("def helper(n):\n    return n * 3\n")
    (tmp_path / "main.py").write_text("from profile import helper\nimport numpy as np\n"
                                      "print('neighbour says', helper(int(np.random.default_rng(2).integers(1, 9))))\n")
    assert main(["profile", "--no-hotspots", "--device", "cpu", str(tmp_path / "main.py")]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert out.count("neighbour says") == 2, out
    import profile

    assert hasattr(profile, "Profile") and not hasattr(profile, "helper")  # the standard library's, back after the runs
