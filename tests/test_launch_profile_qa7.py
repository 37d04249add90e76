"""QA of `gpuspeed profile` and `gpuspeed launch` as a demanding user runs them (round 7): scripts, odd callables,
trace files given as scripts, boolean-mask syncs and where they are placed."""

import json
import textwrap

import pytest

from gpuspeed.cli import main
from gpuspeed.profiling import profile
from gpuspeed.profiling.script import ScriptRunner


def _write(tmp_path, text, name="main.py"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def _json_out(capsys):
    return json.loads(capsys.readouterr().out)


def _syncs(res):
    return {(g["line"], g["kind"]): g["count"] for g in res.findings["host_syncs"]["groups"]}


def test_a_scripts_python_profile_is_the_scripts_not_gpuspeeds_runner(tmp_path):
    """cProfile ran the ScriptRunner call: its own bookkeeping (pathlib, os.chdir, getcwd) was the top function of a
    short script, counted in python_total_s and made the verdict 'other'."""
    script = _write(tmp_path, "import sys\nx = [i * i for i in range(2000)]\nsys.exit(0)\n")
    res = profile(ScriptRunner(script), steps=1, warmup=0, device="cpu")
    cp = res.hotspots["cprofile"]
    files = {r["file"] for r in cp["top"] if r["file"]}
    assert all("gpuspeed" not in f and "pathlib" not in f for f in files), files
    assert not any("chdir" in r["function"] or "getcwd" in r["function"] for r in cp["top"])
    assert cp["verdict"] != "other" and cp["shares"]["other"] == 0.0


def test_a_mask_index_is_placed_at_its_own_line_not_at_the_busiest_index(tmp_path):
    """x[x > 0] (aten::index) was placed at the line of the loop's x[i] (every __getitem__ noted select, slice and
    index alike), and its kind read 'aten::index (aten::index)'."""
    src = _write(tmp_path, """\
        def f(x):
            m = x[x > 0]
            s = 0.0
            for i in range(4):
                s += float(x[i])
            return m, s
        """, name="mask_line_qa7.py")
    import importlib.util

    spec = importlib.util.spec_from_file_location("mask_line_qa7", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import torch

    res = profile(mod.f, torch.randn(64), steps=2, warmup=0, device="cpu", hotspots=False)
    syncs = _syncs(res)
    assert syncs.get((2, "boolean-mask indexing")) == 2, syncs
    assert syncs.get((5, "float(tensor)")) == 8, syncs
    assert set(syncs) == {(2, "boolean-mask indexing"), (5, "float(tensor)")}, syncs


def test_storing_a_python_scalar_through_a_mask_is_no_host_sync(tmp_path):
    """x[x < 0] = 0.0 reads its host-side scalar value (masked_fill_ path): on a GPU tensor nothing waits, yet the
    CPU run reported 'aten::index_put_' as a call that would block. A tensor value through a mask does sync."""
    src = _write(tmp_path, """\
        import torch

        def f(x):
            x[x < 0] = 0.0
            y = x.clone()
            y[y > 0.5] = torch.ones(int((y > 0.5).sum()))
            return y
        """, name="mask_store_qa7.py")
    import importlib.util

    spec = importlib.util.spec_from_file_location("mask_store_qa7", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import torch

    res = profile(mod.f, torch.randn(64), steps=1, warmup=0, device="cpu", hotspots=False)
    lines = {line for line, _ in _syncs(res)}
    assert 4 not in lines, _syncs(res)
    assert (6, "boolean-mask assignment") in _syncs(res), _syncs(res)


@pytest.mark.parametrize("name, body", [("trace.json", '{"traceEvents": [], "ok": false}\n'),
                                        ("main.trace.json.gz", None)])
def test_a_trace_file_given_as_the_script_is_one_line(tmp_path, capsys, name, body):
    """A JSON trace was run as Python ('o1 raised NameError: name false is not defined'); a gzipped one gave
    'main.trace.json.gz:None: syntax error'."""
    p = tmp_path / name
    if body is None:
        import gzip

        with gzip.open(p, "wt") as f:
            f.write('{"traceEvents": []}')
    else:
        p.write_text(body)
    assert main(["profile", "--device", "cpu", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuspeed: error: ") and err.count("\n") == 1
    assert "not a Python script" in err and "None" not in err


def test_a_script_with_a_null_byte_names_no_line_none(tmp_path, capsys):
    p = tmp_path / "nul.py"
    p.write_bytes(b"x = 1\n\x00\n")
    assert main(["profile", "--device", "cpu", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuspeed: error: ") and ":None" not in err and err.count("\n") == 1


@pytest.mark.parametrize("target", ["model", "obj", "part"])
def test_callables_without_a_name_profile_with_out(tmp_path, capsys, target):
    """--out named the trace after fn.__name__: an nn.Module, a callable object or a functools.partial crashed with
    an AttributeError traceback after the whole run; a failing one did too on its way to the one-line error."""
    src = _write(tmp_path, """\
        import functools
        import torch

        model = torch.nn.Linear(4, 4)

        class Doubler:
            def __call__(self, input):
                return input * 2

        obj = Doubler()

        def base(input, k):
            return input * k

        part = functools.partial(base, k=3)
        """, name="odd_callables_qa7.py")
    out = tmp_path / "out"
    argv = ["profile", "--device", "cpu", "--no-hotspots", "--out", str(out), "--function", f"{src}:{target}",
            "--input", "input=float32[2,4]"]
    assert main(argv) == 0, capsys.readouterr().err
    assert (out / "profile.json").exists() and list(out.glob("*.trace.json.gz"))
    capsys.readouterr()
    assert main(argv[:-2] + ["--input", "input=float32[2,4]", "--input", "zzz=int:1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuspeed: error: ") and err.count("\n") == 1
    assert "TypeError" in err if target == "model" else "has no argument zzz" in err, err


def test_auto_backend_of_a_partial_reads_its_functions_module(tmp_path, capsys):
    """--backend auto read functools.py for a functools.partial ('imports none of torch') and made NumPy inputs for
    a torch function, which then failed."""
    src = _write(tmp_path, """\
        import functools
        import torch

        def base(input, k):
            return torch.sin(input) * k

        part = functools.partial(base, k=3)
        """, name="partial_backend_qa7.py")
    assert main(["profile", "--device", "cpu", "--no-hotspots", "--json", "--function", f"{src}:part",
                 "--input", "input=float32[8]"]) == 0, capsys.readouterr().err
    doc = _json_out(capsys)
    assert doc["params"]["backend"] == "torch"
    assert any("partial_backend_qa7.py imports torch" in n for n in doc["notes"]), doc["notes"]


def test_the_backend_note_is_printed_once(tmp_path, capsys):
    src = _write(tmp_path, "import numpy as np\n\ndef f(x):\n    return x * 2\n", name="np_note_qa7.py")
    assert main(["profile", "--device", "cpu", "--no-hotspots", "--function", f"{src}:f",
                 "--input", "x=float64[8]"]) == 0
    out = capsys.readouterr().out
    assert out.count("inputs as numpy arrays") == 1, out


def test_a_sweep_of_one_k_says_why_it_has_no_per_launch_figure():
    """--ks 1 gave eager_us_per_launch null with no word of why (the fit needs two K values)."""
    from gpuspeed.launch.sweep import launch_sweep

    notes: list = []
    rows, fits = launch_sweep((1,), "cpu", 0.01, lambda what: None, notes)
    assert not fits and rows[0]["K"] == 1 and "time_s" in rows[0]
    assert any("eager-torch: no fit" in n and "two K values" in n for n in notes), notes


@pytest.mark.parametrize("line_backend", ["settrace", "auto"])
def test_a_function_calling_torch_compiled_code_profiles(tmp_path, line_backend):
    """The source-line pass looked code objects up in a dict: dynamo's code holds slice constants, which do not hash,
    so profiling anything that called a torch.compile'd function failed with 'TypeError: unhashable type: slice'."""
    src = _write(tmp_path, """\
        import torch

        @torch.compile(backend="eager")
        def g(x):
            y = x[1:] * 2
            y[0] = 3.0
            return y[y > 0]

        def f(x):
            s = 0
            for i in range(3):
                s = s + g(x).sum()
            return s
        """, name="compiled_user_qa7.py")
    import importlib.util

    spec = importlib.util.spec_from_file_location("compiled_user_qa7", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import torch

    res = profile(mod.f, torch.randn(64), steps=1, warmup=1, device="cpu", line_backend=line_backend)
    assert res.hotspots["lines"]["functions"], res.hotspots["lines"]
    assert any(f["function"] == "f" for f in res.hotspots["lines"]["functions"])


@pytest.mark.parametrize("args,says", [(["--ks", "0"], "--ks must be 1 or more, got 0"),
                                       (["--ns", "1,-3"], "--ns must be 1 or more, got -3"),
                                       (["--chain-k", "0"], "--chain-k must be 1 or more, got 0"),
                                       (["--tiny-k", "0"], "--tiny-k must be 1 or more, got 0")])
def test_launch_names_the_flag_that_is_not_positive(args, says, capsys):
    assert main(["launch", "--device", "cpu", *args]) == 2
    assert capsys.readouterr().err.strip() == f"gpuspeed: error: {says}"
