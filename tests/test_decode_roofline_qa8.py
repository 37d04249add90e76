"""QA round 8 of gpuspeed decode (generation, study) and gpuspeed roofline / doctor: each test failed before its fix."""

import json
from pathlib import Path

import pytest
import torch

from gpuspeed.decode import model as M, study
from gpuspeed.decode.generate import Sampling

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


# --- decode study ------------------------------------------------------------------------------------------------------


def _prompt(m, b=2, p=5, seed=2):
    return torch.randint(0, m.args.vocab_size, (b, p), generator=torch.Generator().manual_seed(seed))


def test_transformers_rows_sample_as_the_rungs_do_under_sampling():
    """With --temperature > 0 the rungs sample, but the transformers rows ran greedy generate(do_sample=False): the
    summary's best_over_hf_static set sampled decoding against greedy. (transformers' own sampling default adds a
    top-k of 50, so the rows must also turn that off to time the rungs' work.)"""
    pytest.importorskip("transformers", reason="transformers not installed")
    from gpuspeed.decode import checkpoints as C

    m = micro()
    prompt = _prompt(m)
    hf = C.to_hf(m)
    real, seen = hf.generate, []

    def spy(*a, **kw):  # transformers' generate itself, its arguments and tokens kept
        out = real(*a, **kw)
        seen.append((kw, out[:, prompt.shape[1]:]))
        return out

    hf.generate = spy
    greedy = real(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False,
                  pad_token_id=0)[:, prompt.shape[1]:]
    spec = study.Spec(model="tiny", new_tokens=8, bench_budget_s=0.02, device="cpu",
                      sampling=Sampling(temperature=50.0, seed=1))
    row = study.hf_row(hf, "HF dynamic", m, spec, prompt, "cpu", None)
    kw, toks = seen[0]
    assert kw["do_sample"] is True and kw["temperature"] == 50.0 and kw.get("top_k") == 0, kw
    assert not torch.equal(toks, greedy)  # sampled at a high temperature: not the greedy tokens
    assert "sampled (temperature 50" in row["what"]
    seen.clear()
    spec.sampling = Sampling()
    study.hf_row(hf, "HF dynamic", m, spec, prompt, "cpu", None)
    assert seen[0][0]["do_sample"] is False and torch.equal(seen[0][1], greedy)


def test_a_text_prompt_on_a_random_weight_model_is_refused_before_any_work(capsys):
    """--prompt on a named model (random weights, no tokenizer) was refused by make_prompt, after the model's weights
    were made (the 8B's 32 GB of fp32 on a GPU) and after the run's banner: check_spec refuses it up front."""
    from gpuspeed.cli import main

    with pytest.raises(Exception, match="--prompt needs a checkpoint"):
        study.check_spec(study.Spec(model="tiny", prompt="hello", device="cpu"))
    rc = main(["decode", "--model", "llama-3-8b", "--prompt", "hello", "--device", "cpu", "--no-hf"])
    cap = capsys.readouterr()
    assert rc == 2 and cap.out == "", cap.out
    assert cap.err.startswith("gpuspeed: error: --prompt needs a checkpoint") and cap.err.count("\n") == 1


def test_skipped_batch_and_long_prompt_rows_are_named_in_the_table():
    """A --batches or --long-prompt row skipped by --time-cap (or failed with no rung to run) has no variant: the
    table showed it as '?'. A batch size given twice was measured twice."""
    spec = study.Spec(model="tiny", new_tokens=4, batches=[3, 3, 1], long_prompt=12, time_cap_s=1e-9, hf=False,
                      device="cpu", bench_budget_s=0.02, max_layers=1, variants=["V2"], read_roof_GBps=10.0)
    doc = study.run(spec)
    names = [cells[0] for cells in study.table_rows(doc)]
    assert "?" not in names and {"batch 3", "prompt 12"} <= set(names), names
    # --batches 3,3 is one batch-3 row (it was measured twice), and the run's own batch is the ladder's
    assert sorted(r.get("batch") for r in doc["rows"] if r.get("study") == "batch") == [3], doc["rows"]


def test_longer_rope_tables_leave_the_old_ones_alive_for_graphs_captured_on_them():
    # a --long-prompt row re-made the tables after V4/V5 had captured graphs reading the old ones: freed memory
    m = M.build(M.named_config("tiny", vocab_size=64, dim=64, n_layers=1, n_heads=4, n_kv_heads=4, ffn_dim=96), seed=0)
    m.setup_rope(32)
    cos, sin = m.rope_cos, m.rope_sin
    m.setup_rope(16)  # shorter: the same tables
    assert m.rope_cos is cos and m.retired_rope == []
    m.setup_rope(256)
    assert m.rope_cos.shape[0] == 256 and m.retired_rope[0][0] is cos and m.retired_rope[0][1] is sin
    assert torch.equal(m.rope_cos[:32], cos)  # the first positions are the same values
