"""V5's Triton kernels against float64 torch: under TRITON_INTERPRET=1 on the CPU, compiled on a GPU."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the kernels' creation (at first use)

pytest.importorskip("triton")

from gpuspeed.decode.model import attention as sdpa  # noqa: E402
from gpuspeed.verify import check  # noqa: E402

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


def test_make_linear_uses_gemv_for_one_row_only():
    from gpuspeed.decode.kernels import make_linear

    w = torch.randn(24, 40, device=DEV)
    lin = make_linear({(24, 40): (8, 512, 2, 4)})
    one, many = torch.randn(1, 1, 40, device=DEV), torch.randn(2, 3, 40, device=DEV)
    assert check(lin(one, w), torch.nn.functional.linear(one.double(), w.double())).passed
    assert torch.equal(lin(many, w), torch.nn.functional.linear(many, w))  # batched rows: cuBLAS itself


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
