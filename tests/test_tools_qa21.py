"""Round 21 QA of the tools area: doctor, launch --explain, profile."""

import sys

import pytest
import torch

from gpuspeed import device, doctor

OPTIONAL = ["triton", "cupy", "numba", "jax", "pynvml"]


def _blocked(monkeypatch, names):
    for name in names:  # `import name` now fails as for a package whose files are gone
        monkeypatch.setitem(sys.modules, name, None)


def test_doctor_never_says_not_installed_of_a_package_it_lists_with_a_version(monkeypatch):
    # a distribution installed without its module (files deleted, a half-done uninstall) was "not installed (pip
    # install numba)" beside "numba 0.68.1" in the versions table; pip calls it satisfied, so the advice did nothing
    _blocked(monkeypatch, OPTIONAL)
    rep = doctor.report()
    why = {b["name"]: b["why"] for b in rep["backends"]}
    for module, backend in [("triton", "triton"), ("cupy", "cupy"), ("numba", "numba.cuda"), ("jax", "jax"),
                            ("pynvml", "nvml")]:
        version = rep["versions"][module]
        if version is None:
            assert why[backend].startswith("not installed (pip install "), (backend, why[backend])
        else:
            assert "not installed" not in why[backend], (backend, why[backend])
            assert f"{version} is installed but `import {module}` finds no module" in why[backend]
            assert "pip install --force-reinstall " in why[backend]


def test_doctor_advises_a_cupy_wheel_not_a_source_build(monkeypatch):
    # "pip install cupy" compiles CuPy from source (a CUDA toolkit and minutes); the wheels are cupy-cuda12x/13x,
    # as the optimize report's emitted script already says
    if device.versions()["cupy"] is not None:
        pytest.skip("CuPy is installed here")  # CI has none: its dev extras leave CuPy out
    cupy = next(b for b in device.backends() if b.name == "cupy")
    assert not cupy.usable
    assert "pip install cupy-cuda12x" in cupy.why and "cupy-cuda13x" in cupy.why
    assert "pip install cupy)" not in cupy.why


@pytest.mark.gpu
def test_doctor_on_a_gpu_without_triton_says_torch_compile_cannot_build_gpu_kernels(monkeypatch):
    # on a GPU, doctor called torch.compile usable ("Triton on GPU") with triton missing, where inductor fails at the
    # first compile of a CUDA function
    _blocked(monkeypatch, ["triton"])
    compiled = next(b for b in device.backends() if b.name == "torch.compile")
    assert not compiled.usable and "triton" in compiled.why


def _relu_chain_then_sum(x, w):
    y = x
    for _ in range(3):
        y = torch.relu(y @ w)
    s = 0.0
    for i in range(4):
        s += float(y[i, 0])
    return y.sum() + s


def _verdict_cells(text: str) -> list[str]:
    """The verdict column of the printed 'Hot loop nests' table, one string per row (its wrapped lines joined)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "Hot loop nests" in line)
    rows: list[str] = []
    for line in lines[start:]:
        if line.startswith("└"):
            break
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells[0]:  # a new row: its `where` cell is filled on its first line only
            rows.append(cells[-1])
        else:
            rows[-1] += " " + cells[-1]
    return rows


def test_profile_report_cuts_a_long_loop_verdict_at_a_word_and_says_so():
    # the verdict was cut at 90 characters mid-word: "... (`y = torch.relu(y @ w)`, line 5), s" read as a second
    # variable s the loop needed, "(torc" as a word
    import gpuspeed

    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(3))
    w = torch.randn(16, 16, generator=torch.Generator().manual_seed(4)) / 4
    res = gpuspeed.profile(_relu_chain_then_sum, x, w, steps=1)
    full = [loop["verdict"] for loop in res.hotspots["hot_loops"]]
    shown = _verdict_cells(str(res))
    assert len(shown) == len(full) and any(len(v) > 90 for v in full)
    for cell, verdict in zip(shown, full, strict=True):
        if cell == verdict:
            continue
        assert cell.endswith("…"), cell
        head = cell[:-1]
        assert verdict.startswith(head) and verdict[len(head)] in " ,;:(", (cell, verdict)


def _break_with_input_live_after(x):
    y = x.sin()
    torch._dynamo.graph_break()
    return y + x


def test_explain_counts_the_resumed_codes_first_size_change_as_expected():
    # x is live past the break, so the resumed code guards on its size too and recompiles once at x's first new size,
    # as the function does; that was flagged "1 more (each one a new compile)" because the first frame had used up x
    from gpuspeed.graph_breaks import explain

    x = torch.randn(32, generator=torch.Generator().manual_seed(5))
    rep = explain(_break_with_input_live_after, x)
    assert rep.break_count == 1 and rep.recompiles == 2, rep.recompile_reasons
    assert rep.expected_recompiles == rep.recompiles, str(rep)
    assert "1 more" not in str(rep)


def test_explain_of_a_function_that_fails_without_compile_says_its_own_error(tmp_path, capsys):
    # a reshape the inputs cannot take was "raised TorchRuntimeError: RuntimeError when making fake tensor call":
    # dynamo's wrapper, not what was wrong
    from gpuspeed.cli import main

    (tmp_path / "work.py").write_text("import torch\n\n\ndef make_inputs():\n    return (torch.randn(8),)\n\n\n"
                                      "def f(x):\n    return x.reshape(3, 5)\n")
    assert main(["launch", "--explain", f"{tmp_path / 'work.py'}:f"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("gpuspeed: error: ")
    assert "RuntimeError: shape '[3, 5]' is invalid for input of size 8" in err and "work.py:9" in err, err


@pytest.mark.parametrize("name, mem_GBps", [("NVIDIA GH200 480GB", 4000), ("NVIDIA GH200 144G HBM3e", 4900),
                                             ("NVIDIA H200", 4800), ("NVIDIA H100 80GB HBM3", 3350)])
def test_a_grace_hopper_is_held_to_its_own_memory_not_an_h200s(name, mem_GBps):
    # "GH200" matched the H200's pattern: a GH200 480GB (96 GB HBM3 at 4 TB/s) was held to 4.8 TB/s, so every
    # memory-bound % of datasheet on it read 17 % low
    sheet = device.datasheet_for(name)
    assert sheet is not None and sheet.mem_GBps == mem_GBps
    assert sheet.fp32_TFLOPs == device.datasheet_for("NVIDIA H100 80GB HBM3").fp32_TFLOPs
    assert device.pct_of_datasheet(mem_GBps / 2, name, "mem") == pytest.approx(50.0)


def _breaks_inside(y):
    z = y * 2
    torch._dynamo.graph_break()
    return z + 1


def _breaks_too(y):
    y = y.cos()
    torch._dynamo.graph_break()
    return y


def _calls_two_breaking_helpers(x):
    a = x.sin()
    b = _breaks_inside(a)
    c = _breaks_too(b)
    return c.sum()


def test_explain_tells_a_break_that_splits_the_caller_from_the_same_break_in_the_callee():
    # the break inside _breaks_inside split the caller's graph at its call and the callee's own: two identical lines
    # "break 1 at f.py:N" and "break 2 at f.py:N"; the header's 4 breaks beside 3 listed, and 6 recompiles beside 4,
    # said nothing of the rest
    from gpuspeed.graph_breaks import explain

    x = torch.randn(16, generator=torch.Generator().manual_seed(6))
    rep = explain(_calls_two_breaking_helpers, x)
    text = str(rep)
    places = [ln.split(" at ", 1)[1] for ln in text.splitlines() if ln.startswith("  break ")]
    assert len(set(places)) == len(places), text  # each break told apart by where it is, not only by its number
    call_line = _calls_two_breaking_helpers.__code__.co_firstlineno + 2
    assert any(b.called_at == f"test_tools_qa21.py:{call_line}" for b in rep.breaks), rep.breaks
    assert f"reached from the call at test_tools_qa21.py:{call_line}" in text
    if rep.break_count > len(rep.breaks):
        assert f"({rep.break_count - len(rep.breaks)} more break(s) that torch counted" in text
    listed = [ln for ln in text.splitlines() if ln.startswith("    - ")]
    if len(rep.recompile_reasons) > 4:
        assert listed[-1].startswith(f"    - and {len(rep.recompile_reasons) - 4} more"), text


@pytest.mark.parametrize("value", ["no", 0, None])
def test_profile_refuses_a_hotspots_that_is_not_true_or_false(value):
    # hotspots="no" was truthy: cProfile and the line timer ran (and the function was called twice more) unasked
    import gpuspeed
    from gpuspeed.errors import UserError

    x = torch.randn(8, generator=torch.Generator().manual_seed(7))
    with pytest.raises(UserError, match="hotspots takes True or False"):
        gpuspeed.profile(torch.sum, x, steps=1, hotspots=value)


def test_explain_says_a_list_from_make_inputs_is_one_argument(tmp_path, capsys):
    # make_inputs() returning [x, w] for f(x, w) ended in "f() missing 1 required positional argument: 'w'", with
    # nothing on why: a list is one argument, a tuple is the arguments
    from gpuspeed.cli import main

    (tmp_path / "work.py").write_text("import torch\n\n\ndef make_inputs():\n    return [torch.randn(4), torch.randn(4)]"
                                      "\n\n\ndef f(x, w):\n    return x * w\n")
    assert main(["launch", "--explain", f"{tmp_path / 'work.py'}:f"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "missing 1 required positional argument" in err
    assert "make_inputs() returned a list, passed as the one argument: return a tuple" in err, err


def _transposes(x):
    y = x @ x
    a = y.T
    b = y.mT
    return a + b


def test_profile_places_a_property_op_at_its_own_line():
    # x.T reaches the op recorder as `__get__`, so aten::numpy_T had no recorded line and fell back to the function's
    # first line (a script's line 1, `import torch`)
    import gpuspeed

    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(8))
    res = gpuspeed.profile(_transposes, x, steps=1, hotspots=False)
    first = _transposes.__code__.co_firstlineno
    lines = {o["name"]: o["line"] for o in res.findings["top_ops"]}
    assert lines.get("aten::numpy_T") == first + 2, res.findings["top_ops"]
    assert lines.get("aten::mT") == first + 3, res.findings["top_ops"]


def _reads_back(x):
    total = 0.0
    for i in range(3):
        total += (x[i] * 2).sum().item()
    return total


def test_profile_on_the_cpu_shows_no_sync_wait_it_did_not_measure():
    # a CPU run's host syncs each showed "wait 0.0 ns": a number never measured (nothing runs on a GPU), which read
    # as a sync costing nothing
    import gpuspeed

    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(9))
    res = gpuspeed.profile(_reads_back, x, steps=1, hotspots=False)
    if res.findings["gpu"]:
        pytest.skip("a GPU run measures the wait")
    text = str(res)
    row = next(ln for ln in text.splitlines() if ".item()" in ln and "│" in ln)
    assert [c.strip() for c in row.split("│")][5] == "-", row
    assert "0.0 ns" not in text
    md = next(ln for ln in res.markdown().splitlines() if ln.startswith("| .item()"))
    assert md.rstrip().endswith("| - |"), md
