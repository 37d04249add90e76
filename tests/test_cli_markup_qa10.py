"""The commands' human output prints dynamic text as it is: a path, a note or an error holding brackets went through
rich markup, which dropped "[enforce fail at x.cpp:1]" (torch's CPU out-of-memory message starts so) without a word
and stopped on "[/bad]" with a MarkupError traceback after the run had finished.

Each test drives the CLI in this process as a user does, with a folder or file whose path holds both, on the CPU at
tiny sizes. The '/' of "[/bad]" makes it two folders: "…/o[enforce fail at x.cpp:1]/[/bad]".
"""

import textwrap

import pytest

from gpuspeed.cli import main

BR = "[enforce fail at x.cpp:1]"
BAD = "[/bad]"


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # a long tmp path stays on one line


def _odd(tmp_path, name="o"):
    path = tmp_path / f"{name}{BR}" / "[" / "bad]"
    assert BR in str(path) and BAD in str(path)
    return path


def _cli(capsys, *args):
    capsys.readouterr()
    rc = main(list(args))
    return rc, capsys.readouterr()


def _source(folder, text, name="work.py"):
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_text(textwrap.dedent(text))
    return p


def test_bench_prints_an_out_path_with_brackets_as_it_is(tmp_path, capsys):
    out = _odd(tmp_path)
    rc, cap = _cli(capsys, "bench", "--device", "cpu", "--rows", "64", "--cols", "64", "--budget", "0.05",
                   "--out", str(out))
    assert rc == 0, cap.err
    assert f"wrote {out / 'bench_demo.json'}" in cap.out


def test_decode_prints_an_out_path_with_brackets_as_it_is(tmp_path, capsys):
    from decode_cli_helpers import TINY

    out = _odd(tmp_path)
    rc, cap = _cli(capsys, "decode", "--model", "tiny", *TINY, "--prompt-len", "4", "--out", str(out))
    assert rc == 0, cap.err
    assert f"wrote {out / 'decode.json'}" in cap.out


def test_launch_prints_an_out_path_with_brackets_as_it_is(tmp_path, capsys):
    out = _odd(tmp_path)
    rc, cap = _cli(capsys, "launch", "--device", "cpu", "--ks", "1", "--ns", "1e3", "--variants", "eager",
                   "--budget", "0.05", "--out", str(out))
    assert rc == 0, cap.err
    assert f"wrote {out / 'launch.json'}" in cap.out


def test_launch_explain_prints_an_out_path_with_brackets_as_it_is(tmp_path, capsys):
    src = _source(tmp_path, """
        import torch
        def step(x):
            return torch.sin(x) * 2
        def make_inputs():
            return torch.randn(8)
        """)
    out = _odd(tmp_path)
    rc, cap = _cli(capsys, "launch", "--explain", f"{src}:step", "--out", str(out))
    assert rc == 0, cap.err
    assert f"wrote {out / 'explain.json'}" in cap.out


def test_kernel_prints_an_out_path_with_brackets_as_it_is(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("gpuspeed.kernel.target.use_interpreters", lambda: None)  # no launch: keep env as it is
    src = _source(tmp_path, "def launch():\n    return None\n")
    out = _odd(tmp_path)
    rc, cap = _cli(capsys, "kernel", f"{src}:launch", "--device", "cpu", "--out", str(out))
    assert rc == 0, cap.err
    assert f"wrote {out / 'kernel_report.json'}" in cap.out


def test_profile_prints_an_out_path_with_brackets_as_it_is(tmp_path, capsys):
    src = _source(tmp_path, "def f(x):\n    return x * 2\n")
    out = _odd(tmp_path)
    rc, cap = _cli(capsys, "profile", "--function", f"{src}:f", "--input", "x=float32[16]", "--device", "cpu",
                   "--steps", "1", "--no-hotspots", "--out", str(out))
    assert rc == 0, cap.err
    assert f"wrote {out / 'profile.json'}, {out / 'profile.md'}" in cap.out


def test_profile_json_notes_print_a_file_path_with_brackets_as_it_is(tmp_path, capsys):
    # with --json the notes go to stderr before the run: the backend's note names the function's file
    src = _source(_odd(tmp_path, "src"), "import numpy as np\ndef f(x):\n    return np.sin(x)\n")
    rc, cap = _cli(capsys, "profile", "--function", f"{src}:f", "--input", "x=float32[16]", "--device", "cpu",
                   "--steps", "1", "--no-hotspots", "--json")
    assert rc == 0, cap.err
    assert f"inputs as numpy arrays: {src} imports numpy" in cap.err


def test_roofline_prints_an_out_path_with_brackets_as_it_is(tmp_path, capsys, quick_cpu_roofline):
    out = _odd(tmp_path)
    rc, cap = _cli(capsys, "roofline", "--device", "cpu", "--quick", "--no-sweep", "--no-place", "--out", str(out))
    assert rc == 0, cap.err
    assert f"wrote {out / 'roofline.json'}, {out / 'roofline.md'}" in cap.out


def _bracketed_variant(tmp_path, name):
    """A workload whose one variant is called `name` (a name holding brackets)."""
    return _source(tmp_path, f"""
        import numpy as np
        def original(x):
            return np.tanh(x) * 2.0
        def plain(x):
            return np.tanh(x) + np.tanh(x)
        variants = {{{name!r}: plain}}
        def inputs(rng):
            return (rng.standard_normal(3000),)
        """)


def test_the_progress_bar_prints_a_step_naming_the_users_candidate_as_it_is(tmp_path, capsys, monkeypatch):
    # on a terminal the bar names each candidate; a variant called so stopped the bar's thread with a MarkupError
    # traceback in mid-run (the other commands' steps hold no user text: this is the one a user can reach)
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich draws the bar as on a terminal
    name = f"f{BR}{BAD}"
    src = _bracketed_variant(tmp_path, name)
    rc, cap = _cli(capsys, "optimize", str(src), "--device", "cpu", "--backends", "variant", "--time-budget", "30",
                   "--bench-budget", "0.05", "--out", str(tmp_path / "o"), "--json")
    assert rc == 0, cap.err
    assert "MarkupError" not in cap.err and f"candidate variant:{name}" in cap.err


def test_optimize_prints_a_candidate_and_paths_with_brackets_as_they_are(tmp_path, capsys):
    # the table's candidate cell, the primary line and the report/script paths went through markup: a variant named
    # so ended the finished run with a MarkupError traceback (exit 1)
    name = f"f{BR}{BAD}"
    src = _bracketed_variant(tmp_path, name)
    out = _odd(tmp_path)
    rc, cap = _cli(capsys, "optimize", str(src), "--device", "cpu", "--backends", "variant", "--time-budget", "30",
                   "--bench-budget", "0.05", "--out", str(out))
    assert rc == 0, cap.err
    assert "MarkupError" not in cap.out + cap.err
    assert f"variant:{name}" in cap.out and f"report: {out}" in cap.out and f"script: {out}" in cap.out
