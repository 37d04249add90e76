"""`gpuspeed profile` as a user runs it: scripts (neighbour imports, line times, --json, sys.exit, run
count), --function inputs in the function's own array library, --out checked first, and no litter."""

import json
import sys
import textwrap
from pathlib import Path

import pytest

from gpuspeed.cli import main
from gpuspeed.errors import UserError
from gpuspeed.profiling import profile
from gpuspeed.profiling.backend import infer_backend


def _script(tmp_path, text, name="main.py"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def _json_out(capsys):
    out = capsys.readouterr().out
    return json.loads(out)  # the whole of stdout is one JSON document


@pytest.mark.parametrize("make_out", [lambda d: d / "a_file", lambda d: d / "a_file" / "sub"])
def test_out_not_a_writable_folder_fails_before_any_work(tmp_path, capsys, make_out):
    (tmp_path / "a_file").write_text("x")
    marker = tmp_path / "ran"
    script = _script(tmp_path, f"open({str(marker)!r}, 'w').write('ran')\n")
    assert main(["profile", "--device", "cpu", "--out", str(make_out(tmp_path)), str(script)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuspeed: error: --out") and err.count("\n") == 1
    assert not marker.exists()  # the script never ran


def test_script_imports_its_neighbour(tmp_path, capsys, monkeypatch):
    _script(tmp_path, "def scale(x):\n    return 2 * x\n", name="neighbour_of_profiled_script.py")
    script = _script(tmp_path, """\
        from neighbour_of_profiled_script import scale
        print(scale(21))
        """)
    monkeypatch.chdir(Path(__file__).parent)  # not the script's folder
    assert main(["profile", "--device", "cpu", "--no-hotspots", str(script)]) == 0, capsys.readouterr().err
    assert str(tmp_path) not in sys.path  # put back after the runs


def test_script_line_times_module_and_functions(tmp_path, capsys):
    script = _script(tmp_path, """\
        def hot(n):
            x = 1.0
            for i in range(n):
                x = x * 0.5 + 1
            return x

        acc = 0
        for k in range(20000):
            acc += k * 2
        hot(20000)
        """)
    assert main(["profile", "--device", "cpu", "--json", str(script)]) == 0
    doc = _json_out(capsys)
    fns = {f["function"]: f for f in doc["hotspots"]["lines"]["functions"]}
    assert {"<module>", "hot"} <= fns.keys()
    # the loop's body or its header: Python 3.12 charges each iteration's FOR_ITER to line 3 (seen on the device)
    assert fns["hot"]["hot_line"] in (3, 4) and fns["hot"]["lines"]
    assert {r["line"] for r in fns["<module>"]["lines"]} >= {8, 9, 10}
    loops = {(lp["line"], lp["kind"]) for lp in fns["<module>"]["loops"] + fns["hot"]["loops"]}
    assert loops == {(8, "reduction"), (3, "sequential-loop")}


def test_json_keeps_stdout_clean_and_exit_codes(tmp_path, capsys):
    script = _script(tmp_path, """\
        import sys
        import torch
        print("hello from the script")
        x = torch.randn(4)
        total = x[0].item()
        sys.exit(3)
        """)
    assert main(["profile", "--device", "cpu", "--no-hotspots", "--json", str(script)]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert "hello from the script" in captured.err
    assert any("sys.exit(3)" in n for n in doc["notes"])
    assert any("ran" in n and "2 times" in n for n in doc["notes"])
    assert [(g["kind"], g["line"]) for g in doc["findings"]["host_syncs"]["groups"]] == [(".item()", 5)]


def test_steps_zero_and_negative_warmup_rejected(tmp_path, capsys):
    script = _script(tmp_path, "x = 1\n")
    assert main(["profile", "--steps", "0", str(script)]) == 2
    assert "--steps 0" in capsys.readouterr().err
    assert main(["profile", "--warmup", "-1", str(script)]) == 2
    assert "--warmup -1" in capsys.readouterr().err


def test_help_says_how_often_the_script_runs(capsys):
    assert main(["profile", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "4 runs by default" in text and "2 with --no-hotspots" in text and "sys.exit" in text


def test_numpy_function_gets_numpy_inputs_and_no_false_sync(tmp_path, capsys):
    src = _script(tmp_path, """\
        import numpy as np

        def norm_rows(x):
            assert isinstance(x, np.ndarray), type(x)
            a = np.asarray(x)
            return a / np.linalg.norm(a, axis=1, keepdims=True)
        """, name="numpy_user_code.py")
    assert main(["profile", "--function", f"{src}:norm_rows", "--input", "x=float32[16,8]", "--device", "cpu",
                 "--no-hotspots", "--json"]) == 0, capsys.readouterr().err
    doc = _json_out(capsys)
    assert doc["params"]["backend"] == "numpy" and doc["findings"]["host_syncs"]["total"] == 0


def test_backend_override_and_bad_backend(tmp_path, capsys):
    src = _script(tmp_path, """\
        import numpy as np

        def kind(x):
            assert type(x).__module__ == "torch", type(x)
            return x * 2
        """, name="override_user_code.py")
    assert main(["profile", "--function", f"{src}:kind", "--input", "x=float32[4]", "--device", "cpu",
                 "--backend", "torch", "--no-hotspots", "--json"]) == 0, capsys.readouterr().err
    assert _json_out(capsys)["params"]["backend"] == "torch"
    assert main(["profile", "--function", f"{src}:kind", "--backend", "jax"]) == 2
    assert "unknown backend 'jax'" in capsys.readouterr().err


def test_infer_backend_from_module_globals():
    import numpy as np
    import torch

    def made(globs):
        exec("def f(x):\n    return x\n", globs)
        return globs["f"]

    class FromCupy:
        pass

    FromCupy.__module__ = "cupy._core.core"
    assert infer_backend(made({"np": np, "torch": torch}))[0] == "torch"
    assert infer_backend(made({"np": np}))[0] == "numpy"
    assert infer_backend(made({"asarray": np.asarray}))[0] == "numpy"
    assert infer_backend(made({"np": np, "ndarray": FromCupy}))[0] == "cupy"
    assert infer_backend(made({"math": __import__("math")}))[0] == "numpy"


def test_no_profiler_log_lines_on_stderr(capfd):
    import torch

    profile(lambda x: x * 2, torch.randn(4), steps=1, warmup=0, device="cpu", hotspots=False)
    assert "USDT" not in capfd.readouterr().err


def test_no_trace_folders_left_behind(tmp_path, monkeypatch, capsys):
    import tempfile

    import torch

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    res = profile(lambda x: x * 2, torch.randn(4), steps=1, warmup=0, device="cpu", hotspots=False)
    script = _script(tmp_path, "x = 1\n")
    assert main(["profile", "--device", "cpu", "--no-hotspots", str(script)]) == 0
    assert res.trace_path is None and list(scratch.iterdir()) == []


def test_function_error_is_one_line(tmp_path, capsys):
    src = _script(tmp_path, "def boom(x):\n    raise KeyError('missing')\n", name="boom_user_code.py")
    assert main(["profile", "--function", f"{src}:boom", "--input", "x=float32[4]", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "boom raised KeyError" in err


def test_everything_after_the_script_is_its_own_argv(tmp_path, capsys):
    """Options after the script's path are the script's, even where gpuspeed has one of that name (--steps, --json,
    --debug): as `python -m cProfile script.py ...` and nsys pass them on."""
    seen = tmp_path / "argv.txt"
    script = _script(tmp_path, f"""\
        import sys
        open({str(seen)!r}, "a").write(repr(sys.argv[1:]) + "\\n")
        """)
    assert main(["profile", "--device", "cpu", "--no-hotspots", str(script), "--steps", "3", "--json",
                 "--debug"]) == 0, capsys.readouterr().err
    runs = seen.read_text().splitlines()
    assert len(runs) == 2  # gpuspeed's default steps (1) and its placing run: --steps 3 was not taken as ours
    assert all(r == repr(["--steps", "3", "--json", "--debug"]) for r in runs), runs


def test_debug_written_after_the_command_is_gpuspeeds(capsys):
    # a mistake with --debug after the command still names the mistake (with its traceback), not "--debug"
    with pytest.raises(UserError, match="unknown device"):
        main(["bench", "--device", "gpu", "--debug"])
    assert main(["bench", "--device", "gpu"]) == 2
    assert "unknown device 'gpu'" in capsys.readouterr().err


def test_python_m_from_a_folder_with_a_profile_py(tmp_path):
    """`python -m gpuspeed` puts the current folder first on sys.path; a user's profile.py there must not
    replace the standard library's for gpuspeed (cProfile imports `profile`)."""
    import subprocess

    (tmp_path / "profile.py").write_text("raise SystemExit('the user profile.py was imported')\n")
    (tmp_path / "s.py").write_text("total = sum(range(1000))\n")
    proc = subprocess.run([sys.executable, "-m", "gpuspeed", "profile", "s.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ran s.py" in proc.stdout + proc.stderr


def test_a_script_calling_os_exit_ends_its_run_not_gpuspeed(tmp_path, capsys):
    script = tmp_path / "quits.py"
    script.write_text("import os\nprint('bye')\nos._exit(3)\n")
    assert main(["profile", "--json", str(script)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert any("sys.exit(3)" in n for n in doc["notes"]), doc["notes"]
