"""V5's Triton kernels against float64 torch: under TRITON_INTERPRET=1 on the CPU, compiled on a GPU."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the kernels' creation (at first use)

pytest.importorskip("triton")

from gpuspeed.decode.model import attention as sdpa  # noqa: E402
from gpuspeed.verify import check  # noqa: E402
from decode_cli_helpers import one_thread  # noqa: F401  (autouse: one torch thread for this module)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k", [(48, 96), (37, 1030), (130, 64)])
def test_gemv_matches_linear(n, k, dtype):
    from gpuspeed.decode.kernels.gemv import CONFIGS, gemv

    g = torch.Generator(device=DEV).manual_seed(n + k)
    w = torch.randn(n, k, device=DEV, generator=g).to(dtype)
    x = torch.randn(1, 1, k, device=DEV, generator=g).to(dtype)
    ref = torch.nn.functional.linear(x.double(), w.double())
    for cfg in CONFIGS:
        y = gemv(x, w, *cfg)
        assert y.shape == (1, 1, n) and y.dtype == dtype
        res = check(y, ref)
        assert res.passed, (cfg, res.summary)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_gemv_forms_match_float64(dtype):
    from gpuspeed.decode.kernels import check_fused
    from gpuspeed.decode.kernels.gemv import CONFIGS

    if dtype == torch.bfloat16 and DEV == "cpu":
        pytest.skip("Triton's interpreter rounds fp32 -> bf16 toward zero (the GPU rounds to nearest): "
                    "the fused bf16 forms are checked on the GPU")
    for cfg in CONFIGS:
        ok, why = check_fused(40, 1030, cfg, {"norm", "residual", "silu_residual"}, dtype, DEV)
        assert ok, (cfg, why)


def test_model_with_fused_gemvs_gives_the_same_logits_and_tokens():
    from gpuspeed.decode import model as M, variants as V
    from gpuspeed.decode.generate import generate
    from gpuspeed.decode.kernels import gemv_uses

    args = M.named_config("smollm2-135m", vocab_size=256, dim=64, n_layers=2, n_heads=6, n_kv_heads=2, ffn_dim=96)
    m = M.build(args, device=DEV, seed=4)
    table = {shape: (8, 64, 2, 4) for shape in gemv_uses(args)}
    fused = M.Options(fused_qkv=True, fused_gate_up=True, gemv=table)
    prompt = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(1)).to(DEV)
    m.setup_rope(64)
    tok = prompt[:, :1]
    pos = torch.zeros(1, dtype=torch.long, device=DEV)
    res = check(m(tok, pos, opts=fused), m(tok.cpu() if DEV == "cpu" else tok, pos).double())
    assert res.passed, res.summary
    e = V.make_engine("V2", m, 1, V.max_len_for(5, 6))
    e.opts = fused  # the V2 loop with V5's fused GEMVs: every decode step runs them
    ref = generate(V.make_engine("V2", m, 1, V.max_len_for(5, 6)), prompt, 6)
    assert torch.equal(generate(e, prompt, 6), ref)


@pytest.mark.parametrize("b,h,hkv,d,cap,pos,dtype", [
    (1, 4, 2, 16, 300, 270, torch.float32),  # GQA, two splits, a partial last tile
    (2, 9, 3, 32, 64, 5, torch.float32),  # SmolLM2's 3 query heads per KV head, batch 2
    (1, 8, 8, 16, 520, 519, torch.float32),  # MHA, the last position of the cache
    (1, 4, 1, 16, 300, 0, torch.float32),  # one key
    (1, 4, 2, 16, 300, 200, torch.bfloat16),
])
def test_flash_decoding_matches_sdpa(b, h, hkv, d, cap, pos, dtype):
    from gpuspeed.decode.kernels.attention import decode_attention

    g = torch.Generator(device=DEV).manual_seed(cap + pos)
    q = torch.randn(b, h, 1, d, device=DEV, generator=g).to(dtype)
    k = torch.randn(b, hkv, cap, d, device=DEV, generator=g).to(dtype)
    v = torch.randn(b, hkv, cap, d, device=DEV, generator=g).to(dtype)
    k[:, :, pos + 1:] = float("nan")  # past the length: never read into the result
    v[:, :, pos + 1:] = float("nan")
    ip = torch.tensor([pos], device=DEV)
    mask = torch.arange(cap, device=DEV)[None, :] <= ip[:, None]
    ref = sdpa(q.double(), k[:, :, :pos + 1].double(), v[:, :, :pos + 1].double(), None)
    res = check(decode_attention(q, k, v, mask, ip), ref)
    assert res.passed, res.summary


def _torch_stand_ins():
    """Pure-torch custom ops with the Triton ops' signatures (registered once per process)."""
    import functools

    @functools.cache
    def make():
        import torch.nn.functional as F

        from gpuspeed.decode.model import attention, rms_norm

        @torch.library.custom_op("gpuspeed_test::gemv", mutates_args=())
        def gemv_ref(x: torch.Tensor, w: torch.Tensor, nw: "torch.Tensor | None", res: "torch.Tensor | None",
                     eps: float, prologue: int, block_n: int, block_k: int, split: int, num_warps: int,
                     pdl: int) -> torch.Tensor:
            k = w.shape[1]
            h = rms_norm(x, nw, eps) if prologue == 1 else F.silu(x[:k]) * x[k:] if prologue == 2 else x
            y = F.linear(h, w)
            return y + res if res is not None else y

        @gemv_ref.register_fake
        def _(x, w, nw, res, eps, prologue, block_n, block_k, split, num_warps, pdl):
            return x.new_empty(w.shape[0])

        @torch.library.custom_op("gpuspeed_test::attention", mutates_args=())
        def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            n = int(pos[0]) + 1
            return attention(q, k[:, :, :n], v[:, :, :n], None)

        @attention_ref.register_fake
        def _(q, k, v, pos):
            return torch.empty_like(q)

        return gemv_ref, attention_ref

    return make()


def test_fused_decode_step_compiles_whole(monkeypatch):
    """fullgraph=True through the fused GEMV wrappers and flash-decoding's, with torch stand-ins for the two
    Triton ops (the interpreter's kernels cannot run under fake tensors; on a GPU the real ops are used)."""
    from gpuspeed.decode import model as M
    from gpuspeed.decode.cache import StaticCache
    from gpuspeed.decode.kernels import attention as A, gemv as G, gemv_uses

    gemv_ref, attention_ref = _torch_stand_ins()
    monkeypatch.setattr(G, "GEMV_OP", gemv_ref)
    monkeypatch.setattr(A, "ATTENTION_OP", attention_ref)
    args = M.named_config("smollm2-135m", vocab_size=256, dim=64, n_layers=2, n_heads=6, n_kv_heads=2, ffn_dim=96)
    m = M.build(args, seed=4)
    m.setup_rope(64)
    fused = M.Options(fused_qkv=True, fused_gate_up=True, gemv={s: (8, 64, 2, 4) for s in gemv_uses(args)},
                      attention=A.decode_attention)
    caches = [StaticCache(2, 1, 2, 64, args.head_dim, device="cpu", dtype=torch.float32) for _ in range(2)]
    prompt = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(2))
    for c in caches:
        m(prompt, torch.arange(5), c)  # the prefill (torch path) fills both caches alike
    torch._dynamo.reset()
    step = torch.compile(lambda tok, pos: m(tok, pos, caches[0], fused), fullgraph=True, backend="eager")
    tok = prompt[:, -1:]
    for p in range(5, 8):
        pos = torch.tensor([p])
        got, ref = step(tok, pos), m(tok, pos, caches[1])
        res = check(got, ref.double())
        assert res.passed, (p, res.summary)
        tok = ref[:, -1:].argmax(-1)
    torch._dynamo.reset()
