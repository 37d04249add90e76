"""Round 27 (lead): a named config reshaped by dim / n_heads derives its head size again."""

import pytest

torch = pytest.importorskip("torch")

from gpuspeed.decode import model as M  # noqa: E402


def test_a_reshaped_named_config_derives_its_head_size_again():
    # tiny's head size 64 was kept for dim 256 over 4 heads: q rows 256 but RoPE and the cache of 4 x 64 disagreed
    args = M.named_config("tiny", dim=96, n_heads=4, n_kv_heads=2, n_layers=1, vocab_size=64, ffn_dim=64)
    assert args.head_dim == 24
    model = M.build(args, seed=0)
    model.setup_rope(8)
    logits = model(torch.tensor([[1, 2, 3]]), torch.arange(3))
    assert logits.shape == (1, 3, 64) and torch.isfinite(logits).all()


def test_an_explicit_head_size_is_kept():
    assert M.named_config("tiny", dim=256, n_heads=2, n_kv_heads=2, head_dim=64).head_dim == 64
    assert M.named_config("tiny", n_layers=2).head_dim == 64
