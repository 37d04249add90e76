"""Roofline arithmetic, FLOP and byte counting, placement numbers, and the CLI's JSON / Markdown / plots (CPU)."""

import json
import math

import numpy as np
import pytest
import torch

from gpuspeed.errors import UserError
from gpuspeed.roofline import model
from gpuspeed.roofline.ceilings import Ceiling, Ceilings
from gpuspeed.roofline.place import count_flops, default_unit, locate, min_bytes, place
from gpuspeed.roofline.sweep import flops_list, reference
from gpuspeed.roofline.workloads import sdpa_flops


def test_intensity_and_roof_hand_cases():
    assert model.intensity(1e9, 4e9) == 0.25  # fp32 add a+b: 1 FLOP per 12 bytes... here 1/4
    assert model.intensity(2 * 8192**3, 3 * 8192**2 * 2) == pytest.approx(8192 / 3)  # bf16 N^3 matmul
    assert model.intensity(5, 0) == math.inf
    # 4 TB/s, 800 TFLOP/s: ridge 200; at AI 10 the roof is 40 TFLOP/s, at 1000 it is the peak
    assert model.ridge(800e12, 4e12) == 200
    assert model.roof(10, 800e12, 4e12) == 40e12
    assert model.roof(1000, 800e12, 4e12) == 800e12
    assert model.bound(199.9, 800e12, 4e12) == "memory" and model.bound(200, 800e12, 4e12) == "compute"
    assert model.pct_of_roof(20e12, 10, 800e12, 4e12) == pytest.approx(50.0)
    with pytest.raises(ValueError):
        model.roof(1, 0, 1)


def test_ridge_from_curve():
    pts = [(0.25, 1e12, 4e12), (1, 3.9e12, 3.9e12), (16, 50e12, 3.1e12), (64, 60e12, 0.9e12)]
    r = model.ridge_from_curve(pts)
    assert r["bandwidth"] == 4e12 and r["peak_flops"] == 60e12 and r["ridge"] == 15.0 and r["knee"] == 64
    assert model.ridge_from_curve([])["ridge"] is None


def _ceil():
    return Ceilings("cuda", "test", [Ceiling("copy", "memory", 4000.0), Ceiling("read", "memory", 4500.0),
                                     Ceiling("l2", "memory", 20000.0), Ceiling("fp32", "compute", 60.0),
                                     Ceiling("bf16", "compute", 800.0)])


def test_locate_memory_and_compute_points():
    c = _ceil()
    assert c.mem_roof_GBps() == 4500.0  # L2 is not a device-memory roof
    # add of 2^28 fp32 in 1 ms: 3 GiB moved, AI 1/12
    n = 2**28
    d = locate("add", n, 12 * n, 1e-3, c, "fp32")
    assert d["ai"] == pytest.approx(1 / 12) and d["bound"] == "memory"
    assert d["GBps"] == pytest.approx(12 * n / 1e-3 / 1e9)
    assert d["roof_TFLOPs"] == pytest.approx(4500e9 / 12 / 1e12)
    assert d["pct_of_roof"] == pytest.approx(100 * d["GBps"] / 4500)
    # bf16 8192^3 in 1.6 ms: compute-bound against 800 TFLOP/s
    f = 2 * 8192**3
    d = locate("mm", f, 3 * 8192**2 * 2, 1.6e-3, c, "bf16")
    assert d["bound"] == "compute" and d["roof_TFLOPs"] == 800.0
    assert d["pct_of_roof"] == pytest.approx(100 * f / 1.6e-3 / 800e12)
    assert c.compute_TFLOPs("tf32") == ("fp32", 60.0)  # unmeasured unit falls back to fp32


def test_flop_and_byte_counting_of_known_ops():
    a, b = torch.randn(64, 32), torch.randn(32, 48)
    flops, out = count_flops(torch.mm, a, b)
    assert flops == 2 * 64 * 32 * 48
    assert min_bytes((a, b), out) == 4 * (64 * 32 + 32 * 48 + 64 * 48)
    x = torch.randn(1000)
    assert min_bytes((x, x), x + x) == 2 * 4000  # the same tensor twice is read once
    m = torch.randn(512, 512)
    assert min_bytes((m, m.T), m @ m.T) == 2 * m.numel() * 4  # a transposed view is the same memory
    assert min_bytes((x.expand(1000, 1000),), None) == 4000  # a broadcast view reads its 1000 floats
    g = np.random.default_rng(0).standard_normal((100, 100))
    assert min_bytes((g, g[:, ::2], g[::-1]), None) == g.nbytes  # NumPy views, negative strides too
    assert min_bytes((g[:, ::10],), None) == g[:, ::10].nbytes  # a sparse strided view: its elements only
    assert min_bytes((g[:50], g[50:]), None) == g.nbytes and min_bytes((g[:0],), None) == 0
    flops, _ = count_flops(torch.add, x, x)
    assert flops == 0  # elementwise: FlopCounterMode counts none, callers give them
    q = torch.randn(1, 2, 16, 8)
    assert sdpa_flops((q, q, q)) == 4 * 2 * 16 * 16 * 8
    assert default_unit((a.bfloat16(),), counted=True) == "bf16"
    assert default_unit((a,), counted=False) == "fp32"
    assert default_unit((a.double(),), counted=True) == "fp64"


def test_place_on_cpu_measures_and_refuses_uncounted():
    c = Ceilings("cpu", "cpu", [Ceiling("copy", "memory", 10.0), Ceiling("fp32", "compute", 0.1)])
    a, b = torch.randn(128, 128), torch.randn(128, 128)
    p = place(torch.mm, a, b, ceilings=c, budget_s=0.2, warmup_s=0.05, device="cpu")
    assert p.flops == 2 * 128**3 and p.bytes == 3 * 128 * 128 * 4 and p.time_s > 0
    assert p.TFLOPs == pytest.approx(p.flops / p.time_s / 1e12)
    assert p.bound == "compute"
    from gpuspeed.errors import UserError

    with pytest.raises(UserError):
        place(torch.add, a, b, ceilings=c)
    # given FLOPs keep the unit of what the call is: a bf16 matmul is held to bf16, float64 NumPy to fp64
    ab = a.bfloat16()
    kw = dict(ceilings=c, budget_s=0.05, warmup_s=0.01, device="cpu")
    assert place(torch.mm, ab, ab, flops=2 * 128**3, **kw).unit == "bf16"
    assert place(torch.mm, ab, ab, **kw).unit == "bf16"
    x = np.random.default_rng(0).standard_normal(1000)
    q = place(np.sin, x, flops=1000, **kw)
    assert q.unit == "fp64" and q.flops_source == "given"


def test_sweep_intensities():
    assert [f / 8 for f in flops_list(4)] == [0.25 * 2**i for i in range(11)]
    assert [f / 4 for f in flops_list(2)] == [0.25 * 2**i for i in range(11)]
    x = torch.rand(10).double().numpy()
    assert reference(x, 1, 0.5, 0.25) == pytest.approx(x + 0.25)
    assert reference(x, 4, 0.5, 0.25) == pytest.approx((x * 0.5 + 0.25) * 0.5 + 0.25)


def test_cli_quick_cpu_writes_json_md_and_plots(tmp_path, capsys, quick_cpu_roofline):
    from gpuspeed.cli import main

    assert main(["roofline", "--quick", "--device", "cpu", "--out", str(tmp_path), "--dtype", "fp32"]) == 0
    doc = json.loads((tmp_path / "roofline.json").read_text())
    s = doc["summary"]
    for key in ("copy_GBps", "read_GBps", "write_GBps", "bf16_mm_TFLOPs", "ridge_bf16_flop_per_byte",
                "elementwise_pct_of_copy_roof"):
        assert key in s
    assert s["copy_GBps"] > 0 and s["n_errors"] == 0
    placed = [r for r in doc["rows"] if r["section"] == "placement"]
    assert placed and all(r["dtype"] == "fp32" for r in placed)
    assert next(r for r in placed if r["name"] == "add fp32")["bound"] == "memory"
    assert (tmp_path / "roofline.png").stat().st_size > 10_000
    assert (tmp_path / "roofline.svg").read_text().lstrip().startswith("<?xml")
    assert "| copy |" in (tmp_path / "roofline.md").read_text()


def test_cli_bad_dtype_is_one_line_error(capsys):
    from gpuspeed.cli import main

    assert main(["roofline", "--quick", "--device", "cpu", "--dtype", "fp99"]) == 2
    assert "gpuspeed: error: unknown dtype 'fp99'" in capsys.readouterr().err


def test_best_run_keeps_the_fastest_of_its_runs():
    from types import SimpleNamespace

    from gpuspeed.roofline.ceilings import best_run

    medians = [3.0, 1.0, 2.0]
    runs = iter(SimpleNamespace(median=m) for m in medians)
    assert best_run(lambda: next(runs), runs=3, idle_s=0).median == 1.0
    with pytest.raises(StopIteration):  # exactly `runs` calls were made
        next(runs)


def test_point_above_the_roof_is_labelled_not_shown_as_a_percentage():
    from gpuspeed.roofline.place import ABOVE_ROOF
    from gpuspeed.roofline.report import markdown, pct_text

    c = _ceil()
    n = 2**20  # an add whose 12 MiB sat in L2: 1.4x the device-memory roof
    d = locate("add cached", n, 12 * n, 12 * n / (1.4 * 4500e9), c, "fp32")
    assert d["bound"] == "memory" and d["pct_of_roof"] == pytest.approx(140.0) and d["above_roof"] is True
    assert pct_text(d) == ">100 (above roof: cache-resident data)" and "cache-resident" in ABOVE_ROOF["memory"]
    below = locate("add", n, 12 * n, 12 * n / (0.9 * 4500e9), c, "fp32")
    assert below["above_roof"] is False and pct_text(below) == "90.0"
    doc = {"created": "now", "git": "x", "params": {"device": "cuda"}, "device": {"name": "t"}, "summary": {},
           "rows": [{"section": "placement", **d, "group": "elementwise"}], "notes": []}
    text = markdown(doc)
    assert "above roof: cache-resident data" in text and "140.0" not in text


def _text_boxes(fig):
    from matplotlib.text import Text

    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    out = []
    for t in ax.texts:
        if hasattr(t, "update_positions"):
            t.update_positions(renderer)
        out.append((t.get_text(), Text.get_window_extent(t, renderer)))
    return out, ax.get_legend().get_window_extent(renderer)


@pytest.mark.parametrize("gpu", ["nvidia-h200", "cpu"])
def test_committed_roofline_plot_has_no_overlapping_text_and_fits_the_data(gpu):
    from pathlib import Path

    import matplotlib.pyplot as plt

    from gpuspeed.roofline.plot import draw

    path = Path(__file__).resolve().parents[1] / "results" / gpu / "roofline.json"
    doc = json.loads(path.read_text())
    fig = draw(doc)
    try:
        boxes, legend = _text_boxes(fig)
        placed = [r for r in doc["rows"] if r.get("section") == "placement" and r.get("ai")]
        names = [b[0] for b in boxes]
        assert all(any(n.startswith(r["name"]) for n in names) for r in placed)  # every point labelled
        clashes = [(a[0], b[0]) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a[1].overlaps(b[1])]
        assert not clashes, clashes
        assert not [n for n, b in boxes if b.overlaps(legend)]
        ais = [r["ai"] for r in doc["rows"] if r.get("section") in ("placement", "sweep") and r.get("ai")]
        lo, hi = fig.axes[0].get_xlim()
        assert lo <= min(ais) and hi >= max(ais)  # the data is inside
        assert lo >= min(ais) / 4 and hi <= max(ais) * 8  # and the axis does not run far past it
    finally:
        plt.close(fig)


def test_checked_rate_never_times_a_wrong_kernel_and_rates_a_right_one():
    from gpuspeed.roofline.ceilings import checked_rate
    from gpuspeed.verify import check

    calls = []
    x = torch.ones(1000)

    def double(t):
        calls.append(1)
        return t * 2

    options = dict(device="cpu", budget_s=0.05, warmup_s=0.01)
    wrong = check(torch.zeros(4), torch.ones(4))
    with pytest.raises(AssertionError, match="wrong result"):
        checked_rate(wrong, 8000, 1e9, double, x, name="double", options=options)
    assert not calls  # refused before bench() ran it once
    right = check(torch.ones(4), torch.ones(4))
    rate, m = checked_rate(right, 8000, 1e9, double, x, name="double", options=options)
    assert calls and m.n >= 3 and rate == pytest.approx(8000 / m.median / 1e9)
    fastest, m = checked_rate(right, 8000, 1e9, double, x, name="double", options=options, stat="min")
    assert fastest == pytest.approx(8000 / m.min / 1e9)


def test_plot_labels_a_point_above_its_roof_and_keeps_labels_apart():
    from pathlib import Path

    import matplotlib.pyplot as plt

    from gpuspeed.roofline.plot import draw

    doc = json.loads((Path(__file__).resolve().parents[1] / "results" / "nvidia-h200" / "roofline.json").read_text())
    rows = [r for r in doc["rows"] if r.get("section") == "placement" and r.get("bound") == "memory"]
    rows[0]["TFLOPs"] *= 1.4  # now 1.3x past the roof, as a cache-resident input would be
    rows[0]["pct_of_roof"] = 140.0
    fig = draw(doc)
    try:
        boxes, legend = _text_boxes(fig)
        assert f"{rows[0]['name']} (above roof: cache-resident)" in [n for n, _ in boxes]
        assert not [(a[0], b[0]) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a[1].overlaps(b[1])]
        assert "hollow: above its roof (labelled why)" in [t.get_text() for t in fig.axes[0].get_legend().texts]
    finally:
        plt.close(fig)


@pytest.mark.parametrize("flops, nbytes, time_s", [(float("nan"), 100, 1e-3), (float("inf"), 100, 1e-3), (-1.0, 100, 1e-3),
                                                    (1e6, 100, 0.0), (1e6, 100, -1e-3), (1e6, 100, float("nan")),
                                                    (1e6, 0, 1e-3)])
def test_locate_refuses_values_that_are_not_positive_and_finite(flops, nbytes, time_s):
    c = Ceilings("cpu", "x", [Ceiling(name="read", kind="memory", value=30.0),
                              Ceiling(name="fp32", kind="compute", value=0.16)])
    with pytest.raises(UserError, match="must be"):
        locate("k", flops, nbytes, time_s, c, "fp32")


def test_report_numbers_keep_their_digits_and_a_failed_plot_leaves_nothing_half_written(tmp_path):
    from pathlib import Path

    from gpuspeed.roofline.plot import plot
    from gpuspeed.roofline.report import _f

    assert _f(0.0412) == "0.0412" and _f(4125.75) == "4,125.8" and _f(None) == "-"  # a CPU's 0.04 TFLOP/s
    doc = json.loads((Path(__file__).parents[1] / "results" / "nvidia-h200" / "roofline.json").read_text())
    (tmp_path / "roofline.png").mkdir()  # something in the way of the PNG
    with pytest.raises(OSError):
        plot(doc, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["roofline.png"]  # no SVG, no temporary file
    paths = plot(doc, tmp_path / "ok")
    assert all(p.stat().st_size > 1000 for p in paths)


def test_a_cpu_point_above_its_memory_roof_is_not_explained_as_cache_alone():
    """A shared CI host placed a sum over 128 MiB (4x its L3) at 157 % of its read ceiling: its ceilings were
    measured while other work used the memory bus. The note and the table said 'cache-resident data', which a
    working set four times the cache cannot be; on a CPU both explanations are named."""
    import torch

    from gpuspeed.roofline.place import place
    from gpuspeed.roofline.report import pct_text
    from gpuspeed.timing import bench

    x = torch.rand(4096) + 0.5
    # a roof a third of what the call reaches here: above it, but not past any cache's speed (IMPLAUSIBLE_OVER_ROOF)
    roof = x.nbytes / bench(torch.sum, x, device="cpu", budget_s=0.05).median / 1e9 / 3
    cpu = Ceilings("cpu", "test cpu", [Ceiling("read", "memory", roof), Ceiling("fp32", "compute", 1.0)])
    p = place(torch.sum, x, flops=4096, ceilings=cpu, name="sum", budget_s=0.05, warmup_s=0.01)
    assert p.above_roof and p.bound == "memory"
    note = [n for n in p.notes if n.startswith("above roof")]
    assert len(note) == 1 and "shared CPU" in note[0] and "cache" in note[0], p.notes
    assert pct_text(p.to_dict(), cpu=True) == ">100 (above the measured ceiling)"
    assert pct_text(p.to_dict()) == ">100 (above roof: cache-resident data)"  # a GPU's table keeps its reason
    gpu = Ceilings("cuda", "test", [Ceiling("read", "memory", roof), Ceiling("fp32", "compute", 1.0)])
    g = place(torch.sum, x, flops=4096, ceilings=gpu, name="sum", budget_s=0.05, warmup_s=0.01, device="cpu")
    assert [n for n in g.notes if n.startswith("above roof")] == [
        "above roof: cache-resident data (the working set sat in cache, faster than device memory)"]


def test_the_cpu_study_relocation_keeps_one_cpu_note():
    """Study._relocate strips the old above-roof note and adds the CPU's own (not the GPU's cache reason)."""
    from gpuspeed.roofline import study as study_mod

    s = study_mod.Study(device="cpu", quick=True, workloads=False, sweep=False)
    s.ceil.rows += [Ceiling("read", "memory", 1.0), Ceiling("fp32", "compute", 1.0)]
    n = 2**20
    row = {"name": "sum", "unit": "fp32", "notes": ["above roof: cache-resident data (the working set sat in cache, "
                                                    "faster than device memory)"]}
    row |= locate("sum", n, 4 * n, 4 * n / 2e9, s.ceil, "fp32")
    s.placements.append(row)
    s._relocate()
    notes = [x for x in row["notes"] if x.startswith("above roof")]
    assert len(notes) == 1 and "shared CPU" in notes[0]
