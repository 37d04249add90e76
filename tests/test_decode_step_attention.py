"""The fused decode-step attention (RoPE + cache write + attention) against the model's torch ops in float64:
under TRITON_INTERPRET=1 on the CPU, compiled on a GPU."""

import functools
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the kernel's creation (at first use)

pytest.importorskip("triton")

from gpuspeed.decode import model as M  # noqa: E402
from gpuspeed.decode.kernels.step_attention import CONFIGS, new_counter, reference, step_attention  # noqa: E402
from gpuspeed.verify import check  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _case(b, h, hkv, d, cap, pos, dtype, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    args = M.named_config("tiny", n_heads=h, n_kv_heads=hkv, dim=h * d, head_dim=d)
    cos, sin = M.rope_tables(args, cap, DEV, dtype)
    qkv = torch.randn(b, 1, (h + 2 * hkv) * d, device=DEV, generator=g).to(dtype)
    kc = torch.randn(b, hkv, cap, d, device=DEV, generator=g).to(dtype)
    vc = torch.randn(b, hkv, cap, d, device=DEV, generator=g).to(dtype)
    return qkv, cos, sin, torch.tensor([pos], device=DEV), kc, vc


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b,h,hkv,d,cap,pos", [(1, 9, 3, 64, 160, 37), (2, 2, 2, 64, 100, 99), (1, 4, 2, 32, 70, 0),
                                               (1, 6, 2, 64, 300, 129),
                                               (1, 16, 1, 32, 50, 20)])  # G = 16: fp32 takes the exact dots
def test_step_attention_matches_torch(b, h, hkv, d, cap, pos, dtype):
    if dtype == torch.bfloat16 and DEV == "cpu":
        pytest.skip("Triton's interpreter rounds fp32 -> bf16 toward zero (the GPU rounds to nearest): bf16 on the GPU")
    qkv, cos, sin, p, kc, vc = _case(b, h, hkv, d, cap, pos, dtype, seed=b * 100 + pos)
    kc_ref, vc_ref = kc.double(), vc.double()
    # the float64 reference sees the same (rounded) cos/sin and inputs
    want = reference(qkv.double(), cos.double(), sin.double(), p, kc_ref, vc_ref)
    sentinel = kc[:, :, pos + 1:].clone() if pos + 1 < cap else None
    tol = {} if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    counter = new_counter(b, hkv, DEV)  # one set of tickets for every config, as the static cache holds it
    for cfg in CONFIGS:  # every tile scale, warp count and split the decode may choose
        k_c, v_c = kc.clone(), vc.clone()
        got = step_attention(qkv, cos, sin, p, k_c, v_c, *cfg, counter=counter)
        assert not counter.any(), (cfg, counter)  # the merging program gave the tickets back
        assert got.shape == (b, 1, h * d) and got.dtype == dtype
        res = check(got, want, **tol)
        assert res.passed, (cfg, res.summary)
        # the new key and value landed at pos (rounded to the cache's dtype), nothing else was written
        assert check(k_c[:, :, pos], kc_ref[:, :, pos], **tol).passed
        assert torch.equal(v_c[:, :, pos], qkv[..., (h + hkv) * d:].reshape(b, hkv, d))
        if sentinel is not None:
            assert torch.equal(k_c[:, :, pos + 1:], sentinel)


def test_model_step_with_fused_attention_gives_the_same_logits():
    from gpuspeed.decode.cache import StaticCache

    args = M.named_config("smollm2-135m", vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96)
    m = M.build(args, device=DEV, seed=3)
    m.setup_rope(64)
    plain = M.Options(fused_qkv=True, fused_gate_up=True)
    # as choose() binds a config: one program per KV head, and the keys split over 4 programs a head (whose
    # tickets are the static cache's counter, used by both layers and every step)
    fused = M.Options(fused_qkv=True, fused_gate_up=True,
                      step_attention=functools.partial(step_attention, block_scale=2, num_warps=8))
    split = M.Options(fused_qkv=True, fused_gate_up=True,
                      step_attention=functools.partial(step_attention, block_scale=1, num_warps=4, splits=4))
    prompt = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(2)).to(DEV)
    outs = []
    for opts in (plain, fused, split):
        cache = StaticCache(args.n_layers, 1, args.n_kv_heads, 64, args.head_dim, device=DEV, dtype=torch.float32)
        m(prompt, torch.arange(6, device=DEV), cache, opts)  # prefill: S > 1 takes the torch path in both
        tok, logits = prompt[:, -1:], []
        for step in range(4):
            out = m(tok, torch.tensor([6 + step], device=DEV), cache, opts)
            logits.append(out)
            tok = out.argmax(-1)
        outs.append(torch.cat(logits, 1))
    assert check(outs[1], outs[0].double(), rtol=1e-4, atol=1e-5).passed
    assert check(outs[2], outs[0].double(), rtol=1e-4, atol=1e-5).passed


@pytest.mark.parametrize("splits", [2, 3, 8])
def test_split_keys_more_programs_than_keys_and_a_reused_counter(splits):
    # pos 0 (no cached key: every split empty), pos 5 with 8 splits (empty chunks beside full ones), and the
    # same counter across calls: a ticket left unreturned would make the next call merge early or never
    b, h, hkv, d, cap = 2, 4, 2, 32, 40
    counter = new_counter(b, hkv, DEV)
    for pos in (0, 5, 39):
        qkv, cos, sin, p, kc, vc = _case(b, h, hkv, d, cap, pos, torch.float32, seed=pos + splits)
        want = reference(qkv.double(), cos.double(), sin.double(), p, kc.double(), vc.double())
        got = step_attention(qkv, cos, sin, p, kc, vc, 1, 4, splits, counter=counter)
        res = check(got, want)
        assert res.passed, (pos, res.summary)
        assert not counter.any()


def test_split_config_poisoned_output_is_fully_written():
    # the merging program writes the output; a head whose merge never ran would leave the poison
    b, h, hkv, d, cap, pos = 1, 6, 3, 64, 64, 50
    qkv, cos, sin, p, kc, vc = _case(b, h, hkv, d, cap, pos, torch.float32, seed=11)
    want = reference(qkv.double(), cos.double(), sin.double(), p, kc.double(), vc.double())
    got = step_attention(qkv, cos, sin, p, kc, vc, 1, 4, 4)
    assert torch.isfinite(got).all() and check(got, want).passed
