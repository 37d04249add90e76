"""QA round 6 on `gpuspeed roofline` / `gpuspeed doctor` and the roofline library (CPU)."""

import importlib
import json

import numpy as np
import pytest
import torch

from gpuspeed.cli import main
from gpuspeed.errors import UserError
from gpuspeed.roofline import study as study_mod
from gpuspeed.roofline.ceilings import Ceiling, Ceilings, ceiling_steps, cpu_steps

place_mod = importlib.import_module("gpuspeed.roofline.place")  # the package's `place` is the function
CEIL = Ceilings("cpu", "test", [Ceiling("copy", "memory", 20.0), Ceiling("fp32", "compute", 0.5)])
FAST = dict(budget_s=0.05, warmup_s=0.01, device="cpu")


def _err(capsys) -> str:
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("gpuspeed: error: "), lines
    return lines[-1]


# --- place(): zero-flop kernels, bad arguments ----------------------------------------------------------


def test_zero_flop_copy_sits_on_the_memory_roof():
    # locate() documents 0 FLOPs as a copy's, but place() refused flops=0 and locate() left bound/% empty
    d = place_mod.locate("copy", 0, 8 * 10**6, 1e-3, CEIL, "fp32")
    assert d["bound"] == "memory" and d["roof_TFLOPs"] == 0.0
    assert d["pct_of_mem_roof"] == pytest.approx(100 * 8.0 / 20.0) and d["pct_of_roof"] == d["pct_of_mem_roof"]
    a = torch.randn(256, 256)
    p = place_mod.place(lambda x: x.clone(), a, flops=0, ceilings=CEIL, **FAST)
    assert p.flops == 0 and p.ai == 0 and p.bound == "memory" and p.bytes == 2 * a.nbytes
    assert p.pct_of_roof == pytest.approx(100 * p.GBps / 20.0) and p.pct_of_roof > 0
    with pytest.raises(UserError, match="finite and >= 0"):
        place_mod.place(lambda x: x.clone(), a, flops=-1, ceilings=CEIL, **FAST)


def test_numpy_matmul_says_flop_counter_counts_torch_ops_only():
    g = np.ones((16, 16), dtype=np.float32)
    with pytest.raises(UserError, match="torch's matmul") as exc:  # "it counts matmul" read wrong for np.matmul
        place_mod.place(np.matmul, g, g, ceilings=CEIL, **FAST)
    assert "0 for a copy" in str(exc.value)


@pytest.mark.parametrize("call, says", [
    (lambda a: place_mod.place(3, a, flops=1, ceilings=CEIL, **FAST), "needs a callable"),  # TypeError
    (lambda a: place_mod.place(torch.mm, a, kwargs=[a], ceilings=CEIL, **FAST), "kwargs= takes a dict"),
    # a results document (json.load of roofline.json) for ceilings: AttributeError 'dict' ... 'compute_TFLOPs'
    (lambda a: place_mod.place(torch.mm, a, a, ceilings={"rows": []}, **FAST), "ceilings= takes a Ceilings"),
])
def test_place_argument_mistakes_are_one_line(call, says):
    with pytest.raises(UserError, match=says):
        call(torch.randn(8, 8))


# --- ceilings(nbytes=...) -------------------------------------------------------------------------------


@pytest.mark.parametrize("nbytes", [-1, 0, 2.5, True, "1GiB"])
def test_ceilings_refuse_a_bad_buffer_size(nbytes):
    with pytest.raises(UserError, match="nbytes must be"):  # -1 ran at the default size; 0 too
        ceiling_steps("cpu", True, nbytes)


def test_cpu_ceilings_measure_the_buffer_size_asked_for():
    # nbytes was ignored on the CPU: every stream ran on 128 MiB buffers whatever was asked
    steps = dict(cpu_steps(True, 2**20))
    c = steps["copy"]()
    assert c.error is None and c.value > 0
    assert all("1.00 MiB" in cand["how"] for cand in c.candidates), c.candidates
    assert "128 MiB" in dict(cpu_steps(True))["copy"]().how  # the default is unchanged


# --- Study / --dtype ------------------------------------------------------------------------------------


def test_study_dtypes_parse_in_the_library():
    assert study_mod.parse_dtypes(None) == list(study_mod.DTYPES)
    assert study_mod.parse_dtypes("bf16") == ["bf16"]  # a string was split into letters: "unknown dtype 'b'"
    assert study_mod.parse_dtypes(["fp32,bf16", "fp32"]) == ["fp32", "bf16"]  # repeats once
    for bad in (",", "", [], [" , "]):
        with pytest.raises(UserError, match="no dtype named"):  # ran every dtype
            study_mod.parse_dtypes(bad)
    with pytest.raises(UserError, match="unknown dtype 'fp64'"):
        study_mod.parse_dtypes("fp64")
    assert study_mod.parse_dtypes("FP32") == ["fp32"]  # any case (qa12)


@pytest.mark.parametrize("args, says", [
    (["--dtype", ","], "no dtype named in ','"),  # ran every dtype
    (["--dtype", "tf32"], "no built-in workload runs in tf32 on the CPU"),  # ran, placed nothing, said nothing
    (["--dtype", "fp32", "--no-place"], "placements are off (--no-place)"),  # --dtype silently ignored
])
def test_cli_dtype_that_selects_nothing_is_refused_before_any_work(tmp_path, capsys, args, says):
    out = tmp_path / "o"
    assert main(["roofline", "--quick", "--device", "cpu", "--out", str(out), *args]) == 2
    assert says in _err(capsys)
    assert not out.exists()


def test_cpu_notes_do_not_claim_cublas_or_checks_that_did_not_run():
    doc = study_mod.Study(device="cpu", quick=True, workloads=False).document()
    notes = " ".join(doc["notes"])
    assert "cuBLAS" not in notes and "every candidate was checked" not in notes
    assert "torch.mm (CPU)" in notes and "sum and fill_ are timed as they are" in notes


# --- the CLI's files -------------------------------------------------------------------------------------


@pytest.fixture
def one_ceiling(monkeypatch):
    """The study measures one made-up ceiling: the CLI runs in well under a second."""
    steps = [("copy", lambda: Ceiling("copy", "memory", 10.0, how="fake")),
             ("fp32", lambda: Ceiling("fp32", "compute", 0.1, how="fake"))]
    monkeypatch.setattr(study_mod, "ceiling_steps", lambda kind, quick: steps)


def test_markdown_that_cannot_be_written_leaves_no_temporary_file(tmp_path, capsys, one_ceiling):
    (tmp_path / "roofline.md").mkdir()  # something in the way: roofline.md.tmp was left behind
    assert main(["roofline", "--quick", "--device", "cpu", "--no-place", "--out", str(tmp_path)]) == 2
    _err(capsys)
    assert not [p.name for p in tmp_path.iterdir() if "tmp" in p.name]
    assert (tmp_path / "roofline.md").is_dir() and (tmp_path / "roofline.json").is_file()


def test_a_plot_failure_without_a_message_is_a_note_not_a_traceback(tmp_path, capsys, monkeypatch, one_ceiling):
    import gpuspeed.roofline.plot as plot_mod

    def fail(doc, out, stem="roofline"):
        raise MemoryError()  # str() is empty: the note's splitlines()[0] raised IndexError

    monkeypatch.setattr(plot_mod, "plot", fail)
    assert main(["roofline", "--quick", "--device", "cpu", "--no-place", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "roofline.json").read_text())
    assert [n for n in doc["notes"] if n.startswith("plot failed: MemoryError")]
    assert "plot failed: MemoryError" in capsys.readouterr().out


# --- the plot ---------------------------------------------------------------------------------------------


def test_memory_roof_lines_bend_at_their_ridge():
    import matplotlib.pyplot as plt

    from gpuspeed.roofline.plot import draw

    # 12 GB/s and 0.1 TFLOP/s: the copy line meets the top at 100/12 = 8.33 FLOP/byte, between 2^3 and 2^4;
    # drawn only at powers of two it cut the corner, passing under the roof and missing the ridge line
    doc = {"params": {"device": "cpu"}, "device": {"name": "t"}, "rows": [
        {"section": "ceiling", "name": "copy", "kind": "memory", "value": 12.0},
        {"section": "ceiling", "name": "fp32", "kind": "compute", "value": 0.1}]}
    fig = draw(doc)
    try:
        line = next(ln for ln in fig.axes[0].get_lines() if ln.get_label().startswith("copy"))
        pts = dict(zip(line.get_xdata(), line.get_ydata(), strict=True))
        corner = next(x for x in pts if x == pytest.approx(100 / 12))
        assert pts[corner] == pytest.approx(100.0)  # GFLOP/s: the fp32 ceiling, reached at the ridge
    finally:
        plt.close(fig)


def test_place_holds_host_data_to_the_cpu_roof_without_being_told(monkeypatch):
    # device left at "auto": a NumPy or CPU-tensor call (timed on the host clock) was held to the GPU's ceilings
    seen = []
    monkeypatch.setattr(place_mod, "cached_ceilings", lambda device="auto": seen.append(device) or CEIL)
    a = torch.randn(16, 16)
    place_mod.place(torch.mm, a, a, budget_s=0.05, warmup_s=0.01)
    place_mod.place(np.sin, a.numpy(), flops=256, budget_s=0.05, warmup_s=0.01)
    assert seen == ["cpu", "cpu"]


@pytest.mark.gpu
def test_place_on_a_gpu_machine_keeps_host_and_device_roofs_apart(monkeypatch):
    seen = []
    monkeypatch.setattr(place_mod, "cached_ceilings", lambda device="auto": seen.append(device) or CEIL)
    a = torch.randn(64, 64)
    host = place_mod.place(torch.mm, a, a, budget_s=0.05, warmup_s=0.01)
    gpu = place_mod.place(torch.mm, a.cuda(), a.cuda(), budget_s=0.05, warmup_s=0.01)
    assert seen == ["cpu", "auto"]
    assert any("placed on the CPU's roofline" in n for n in host.notes)  # says so, and how to ask for the GPU's
    assert not any("CPU's roofline" in n for n in gpu.notes)


@pytest.mark.gpu
def test_gpu_study_says_why_a_tf32_only_run_has_no_sweep():
    study = study_mod.Study(device="cuda", quick=True, dtypes=["tf32"])
    labels = [label for label, _ in study.steps()]
    assert not [x for x in labels if x.startswith("AI sweep")] and [x for x in labels if "mm tf32" in x]
    assert any(n.startswith("no AI sweep: it runs fp32 and bf16 only") for n in study.notes)
