"""QA round 8 of gpuspeed decode (generation, study) and gpuspeed roofline / doctor: each test failed before its fix."""

import json
from pathlib import Path

import pytest

from gpuspeed.decode import model as M

ROOT = Path(__file__).resolve().parents[1]
MICRO = dict(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96)


def micro(seed=2):
    return M.build(M.named_config("tiny", **MICRO), seed=seed)


# --- roofline ---------------------------------------------------------------------------------------------------------


def _text_boxes(fig):
    from matplotlib.text import Text

    renderer = fig.canvas.get_renderer()
    out = []
    for t in fig.axes[0].texts:
        if hasattr(t, "update_positions"):
            t.update_positions(renderer)
        out.append((t.get_text(), Text.get_window_extent(t, renderer)))
    return out


@pytest.mark.parametrize("gpu", ["cpu", "nvidia-h200"])
def test_a_zero_flop_placement_is_shown_on_the_plot_not_dropped(gpu):
    """place(..., flops=0) puts a copy on the memory roof (pct_of_roof = % of the bandwidth), but the plot kept only
    rows with a non-zero intensity: the copy vanished from the figure without a word."""
    import matplotlib.pyplot as plt

    from gpuspeed.roofline.place import locate
    from gpuspeed.roofline.plot import draw
    from gpuspeed.roofline.study import ceilings_from_results

    doc = json.loads((ROOT / "results" / gpu / "roofline.json").read_text())
    ceil = ceilings_from_results(doc)
    bw = ceil.mem_roof_GBps()
    n = 2**28
    copy = locate("my copy", 0, 2 * n, 2 * n / (0.8 * bw * 1e9), ceil, "fp32")
    assert copy["bound"] == "memory" and copy["pct_of_roof"] == pytest.approx(80.0)
    doc["rows"].append({"section": "placement", "group": "elementwise", **copy})
    fig = draw(doc)
    try:
        boxes = _text_boxes(fig)
        mine = [name for name, _ in boxes if "my copy" in name]
        assert mine and "80.0 %" in mine[0] and "GB/s" in mine[0], [name for name, _ in boxes]
        clashes = [(a[0], b[0]) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a[1].overlaps(b[1])]
        assert not clashes, clashes
    finally:
        plt.close(fig)
