"""QA round 5 on `gpuspeed kernel`, `gpuspeed profile` and `gpuspeed launch`: bad values refused in one line
before any work (never silently truncated, defaulted or recorded as null), and a failed run leaves nothing
in --out."""

import textwrap

import pytest

from gpuspeed.cli import main


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert err.startswith("gpuspeed: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("flag,value,says", [
    ("--ks", "1.5", "whole numbers, got 1.5"),  # ran as K=1
    ("--ns", "1e3,2.5", "whole numbers, got 2.5"),  # ran as N=2
    ("--ks", ",", "names no value"),  # ran the default Ks
    ("--ks", "", "names no value"),
    ("--ns", " , ", "names no value"),
    ("--variants", ",", "names no variant"),  # ran every variant
    ("--variants", "", "names no variant"),
    ("--ks", "4,4", "--ks names 4 more than once"),  # failed its fit only after the whole sweep
    ("--ns", "1e3,1000", "--ns names 1000 more than once"),  # measured the same N twice
    ("--variants", "eager,eager", "--variants names eager more than once"),
    ("--ks", "1,1e12", "go up to 65536 kernels"),  # ran for ever, showing nothing
    ("--tiny-k", "100000", "go up to 65536 kernels"),
    ("--chain-k", "5000", "--chain-k goes up to 1024 ops"),
])
def test_launch_lists_that_would_be_truncated_or_defaulted_are_refused(capsys, flag, value, says):
    assert main(["launch", "--device", "cpu", "--json", flag, value]) == 2
    assert says in _one_error_line(capsys)


@pytest.mark.parametrize("value", ["inf", "1e400"])
def test_kernel_flops_must_be_positive_and_finite(tmp_path, capsys, value):
    marker = tmp_path / "imported"
    f = tmp_path / "k.py"
    f.write_text(f"open({str(marker)!r}, 'w').write('x')\ndef launch():\n    return None\n")
    # inf was accepted and recorded as "flops": null in kernel_report.json
    assert main(["kernel", f"{f}:launch", "--device", "cpu", "--flops", value, "--out", str(tmp_path / "o")]) == 2
    assert "--flops must be a positive finite number" in _one_error_line(capsys)
    assert not marker.exists() and not (tmp_path / "o").exists()


def test_profile_a_folder_says_it_is_a_folder(tmp_path, capsys):
    assert main(["profile", "--device", "cpu", str(tmp_path)]) == 2
    err = _one_error_line(capsys)
    assert "is a folder, not a script" in err and "no such file" not in err


def test_profile_failing_after_the_trace_leaves_nothing_in_out(tmp_path, capsys):
    # the script's third run (the one that places source lines) fails: the trace of the profiled step was
    # already written into --out, and stayed there beside no profile.json
    count = tmp_path / "count"
    script = tmp_path / "late.py"
    script.write_text(textwrap.dedent(f"""\
        import os
        c = int(open({str(count)!r}).read()) if os.path.exists({str(count)!r}) else 0
        open({str(count)!r}, "w").write(str(c + 1))
        if c >= 1:
            raise RuntimeError("the second run fails")
        """))
    out = tmp_path / "out"
    assert main(["profile", "--device", "cpu", "--out", str(out), str(script)]) == 2
    err = capsys.readouterr().err  # the run that failed is named (core_qa20): its first run ended normally
    assert err.startswith("gpuspeed: error: late raised RuntimeError: the second run fails (at late.py:5 in <module>) "
                          "in run 2 of "), err
    assert ": run 1 ended normally" in err and err.count("\n") == 1, err
    assert not out.exists() or list(out.iterdir()) == []


def test_profile_trace_keeps_its_name_when_the_run_succeeds(tmp_path, capsys):
    import json

    script = tmp_path / "fine.py"
    script.write_text("x = sum(range(10))\n")
    out = tmp_path / "out"
    assert main(["profile", "--device", "cpu", "--no-hotspots", "--json", "--out", str(out), str(script)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(p.name for p in out.iterdir()) == ["fine.trace.json.gz", "profile.json", "profile.md"]
    assert doc["trace"] == str(out / "fine.trace.json.gz")
    assert json.loads((out / "profile.json").read_text())["params"]["trace"] == str(out / "fine.trace.json.gz")


@pytest.mark.parametrize("header,says", [("async def f(x):", "is an async function"),
                                         ("def f(x):\n    yield x\n    if 0:", "is a generator function")])
def test_profile_refuses_a_function_whose_call_runs_none_of_its_body(tmp_path, capsys, header, says):
    # the report said "Python: 181 ns per call, interpreter-bound": the time to make a coroutine / generator
    f = tmp_path / "lazy.py"
    f.write_text(f"import numpy as np\n{header}\n        return np.sort(x)\n")
    assert main(["profile", "--device", "cpu", "--json", "-f", f"{f}:f", "-i", "x=float64[100]"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines()[-1].startswith("gpuspeed: error: f " + says)


def test_profile_library_refuses_async_functions():
    from gpuspeed.errors import UserError
    from gpuspeed.profiling import profile

    async def f():
        return 1

    with pytest.raises(UserError, match="async function"):
        profile(f, device="cpu", steps=1, warmup=0, hotspots=False)


@pytest.mark.parametrize("header,says", [("async def launch():", "is an async function"),
                                         ("def launch():\n    yield 1\n    if 0:", "is a generator function")])
def test_kernel_refuses_a_launcher_whose_call_runs_none_of_its_body(tmp_path, header, says):
    # the verdict said "no Triton or Numba CUDA kernel launch seen: make the launcher call a @triton.jit kernel"
    from gpuspeed.errors import UserError
    from gpuspeed.kernel.target import load_target

    f = tmp_path / "lazy_launcher.py"
    f.write_text(f"{header}\n        return None\n")
    with pytest.raises(UserError, match=says):
        load_target(f"{f}:launch")


def test_kernel_cli_refuses_an_async_launcher_in_one_line(tmp_path):
    import subprocess
    import sys

    f = tmp_path / "lazy launcher.py"
    f.write_text("async def launch():\n    return None\n")
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "kernel", f"{f}:launch", "--device", "cpu", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines()[-1].startswith("gpuspeed: error: ") and "is an async function" in r.stderr
    assert "Traceback" not in r.stderr and "never awaited" not in r.stderr


def test_launch_explain_refuses_an_async_function(tmp_path, capsys):
    # it reported "f: 1 graph(s), 0 graph break(s); fullgraph=True compiles" for a coroutine never awaited
    f = tmp_path / "lazy.py"
    f.write_text("import torch\nasync def f(x):\n    return x * 2\ndef make_inputs():\n    return torch.ones(4)\n")
    assert main(["launch", "--explain", f"{f}:f", "--json"]) == 2
    assert "is an async function" in _one_error_line(capsys)


def test_profile_script_that_changes_folder_runs_from_its_start_folder_each_time(tmp_path, capsys, monkeypatch):
    # the second run started inside the folder the first moved to: FileNotFoundError, and the relative --out
    # (made before the first run) was looked for in the wrong place
    (tmp_path / "sub").mkdir()
    (tmp_path / "cd.py").write_text("import os\nos.chdir('sub')\n")
    monkeypatch.chdir(tmp_path)
    assert main(["profile", "--device", "cpu", "--json", "--out", "o", "cd.py"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["cd.trace.json.gz", "profile.json", "profile.md"]
    assert list((tmp_path / "sub").iterdir()) == []


def test_cpu_profile_counts_x_cpu_numpy_as_one_host_copy(tmp_path):
    # on a GPU tensor x.cpu().numpy() is one copy to the host (.numpy() refuses a GPU tensor); the CPU-only
    # profile reported a .cpu() and a .numpy() sync on the line, each 1x per step
    import importlib.util

    pytest.importorskip("torch")
    from gpuspeed.profiling import profile

    f = tmp_path / "to_host.py"
    f.write_text("def f(x):\n    y = x.cpu().numpy()\n    z = (x * 2).numpy()\n    return y, z\n")
    spec = importlib.util.spec_from_file_location("qa5_to_host", f)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import torch

    res = profile(mod.f, torch.ones(8), steps=2, warmup=0, device="cpu", hotspots=False)
    groups = {(g["kind"], g["line"]): g["per_step"] for g in res.findings["host_syncs"]["groups"]}
    assert groups == {(".cpu()", 2): 1.0, (".numpy()", 3): 1.0}
    assert res.findings["host_syncs"]["total"] == 4


def test_profile_json_stays_strict_json_when_a_finding_is_not_finite(tmp_path, capsys, monkeypatch):
    # profile.json mapped NaN/inf to null, --json printed them as NaN / Infinity (not JSON)
    import json

    import gpuspeed.profiling as profiling

    real = profiling.profile

    def nan_finding(*args, **kwargs):
        res = real(*args, **kwargs)
        res.findings["made_up"] = {"rel_iqr": float("nan"), "ratio": float("inf")}
        return res

    monkeypatch.setattr(profiling, "profile", nan_finding)
    f = tmp_path / "plain.py"
    f.write_text("def f():\n    return sum(range(10))\n")
    assert main(["profile", "--device", "cpu", "--no-hotspots", "--json", "-f", f"{f}:f"]) == 0

    def refuse(c):
        raise ValueError(f"not JSON: {c}")

    doc = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert doc["findings"]["made_up"] == {"rel_iqr": None, "ratio": None}


def test_launch_json_stays_strict_json_when_a_figure_is_not_finite(capsys, monkeypatch):
    # launch.json mapped NaN/inf to null, --json printed them as NaN / Infinity (not JSON)
    import json

    import gpuspeed.launch as study

    monkeypatch.setattr(study, "run_launch", lambda **kw: {"study": "launch", "summary": {"x": float("nan")},
                                                            "rows": [{"round_spread": float("inf")}], "notes": []})
    assert main(["launch", "--device", "cpu", "--json", "--ks", "1,2", "--ns", "1000", "--variants", "eager"]) == 0

    def refuse(c):
        raise ValueError(f"not JSON: {c}")

    doc = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert doc["summary"] == {"x": None} and doc["rows"] == [{"round_spread": None}]


@pytest.mark.parametrize("flag,value", [("--backend", "cupy"), ("--seed", "7")])
def test_profile_refuses_function_only_options_with_a_script(tmp_path, capsys, flag, value):
    # both were silently ignored (params recorded "seed": 7 for a script that makes its own arrays)
    marker = tmp_path / "ran"
    script = tmp_path / "s.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    assert main(["profile", "--device", "cpu", flag, value, str(script)]) == 2
    assert f"{flag} goes with --function" in _one_error_line(capsys)
    assert not marker.exists()


def test_kernel_refuses_backend_without_input(tmp_path, capsys):
    # without --input the arrays come from the file's inputs(rng): --backend was silently ignored
    marker = tmp_path / "imported"
    f = tmp_path / "k.py"
    f.write_text(f"open({str(marker)!r}, 'w').write('x')\ndef launch():\n    return None\n")
    assert main(["kernel", f"{f}:launch", "--device", "cpu", "--backend", "numpy"]) == 2
    assert "--backend goes with --input" in _one_error_line(capsys)
    assert not marker.exists()


def test_no_gpu_verdict_blames_the_triton_interpreter_only_for_triton_launches():
    # a Numba-only launcher was told "the Triton interpreter does not check bounds"; Numba's simulator does
    from gpuspeed.kernel import verdict

    def said(backend):
        return verdict.judge({"gpu": False, "launches": [{"kernel": "k", "backend": backend}], "check": None})[1]

    assert "Triton interpreter" not in said("numba") and "nothing checked its output" in said("numba")
    # kernel_report now holds the Triton interpreter's loads and stores to the arrays (test_kernel_qa9)
    assert "does not check bounds" not in said("triton") and "inside its arrays" in said("triton")


_CLASSY = """\
import torch


class K:
    def method(self, x):
        return x * 2

    @staticmethod
    def static(x):
        return x * 2


k = K()


def make_inputs():
    return torch.ones(4)
"""


def test_kernel_refuses_an_unbound_method_and_takes_static_and_bound_ones(tmp_path):
    # file.py:K.method took the first input for self and failed with "missing 1 required positional argument: 'x'"
    from gpuspeed.errors import UserError
    from gpuspeed.kernel.target import load_target

    f = tmp_path / "classy.py"
    f.write_text(_CLASSY)
    with pytest.raises(UserError, match="is a method of class K: its first argument would be taken for self"):
        load_target(f"{f}:K.method")
    assert load_target(f"{f}:K.static")[2] == "K.static"
    assert load_target(f"{f}:k.method")[2] == "k.method"


def test_launch_explain_refuses_an_unbound_method(tmp_path, capsys):
    f = tmp_path / "classy.py"
    f.write_text(_CLASSY)
    assert main(["launch", "--explain", f"{f}:K.method", "--json"]) == 2
    assert "is a method of class K" in _one_error_line(capsys)
    assert main(["launch", "--explain", f"{f}:k.method", "--json"]) == 0
    assert '"graph_count": 1' in capsys.readouterr().out


def test_profile_refuses_an_unbound_method_and_profiles_a_bound_one(tmp_path, capsys):
    # profile -f file.py:K.method ran it and reported "missing 1 required positional argument: 'self'"
    f = tmp_path / "classy.py"
    f.write_text(_CLASSY)
    assert main(["profile", "-f", f"{f}:K.method", "--json"]) == 2
    assert "is a method of class K" in _one_error_line(capsys)
    assert main(["profile", "-f", f"{f}:k.method", "-i", "x=float32[8]", "--json"]) == 0
