"""The roofline's Triton kernels against float64 references: under TRITON_INTERPRET=1 on the CPU, compiled on a GPU."""

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the kernels' import (at first use)

pytest.importorskip("triton")

from gpuspeed.verify import check, count_poisoned, poison  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def K():
    from gpuspeed.roofline import kernels

    return kernels


@pytest.mark.parametrize("seed,evict", [(0, ""), (1, "evict_first"), (2, "evict_last")])
@pytest.mark.parametrize("block,warps", [(4096, 4), (8192, 8)])
def test_streams(K, seed, evict, block, warps):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(4 * block, device=DEV, generator=g)
    part = poison(torch.empty(4, device=DEV))
    assert check(K.launch_read(x, part, block=block, num_warps=warps, evict=evict),
                 x.double().view(4, -1).sum(1), rtol=1e-5)
    part = poison(torch.empty(2, device=DEV))
    ref = x.double().view(-1, 2, block).sum((0, 2))  # program p owns tiles p, p+2
    assert check(K.launch_read_persistent(x, part, block=block, num_warps=warps), ref, rtol=1e-5)
    y = poison(torch.empty_like(x))
    assert check(K.launch_copy(x, y, block=block, num_warps=warps, evict=evict), x, rtol=0, atol=0)
    poison(y)
    assert check(K.launch_copy(x, y, block=block, num_warps=warps, stream_store=True), x, rtol=0, atol=0)
    poison(y)
    v = float(torch.rand(1, generator=g, device=DEV)) + 0.5
    K.launch_write(y, v, block=block, num_warps=warps)
    assert count_poisoned(y) == 0 and check(y, torch.full_like(y, v), rtol=0, atol=0)


def test_stream_rejects_ragged_size_and_unknown_hint(K):
    with pytest.raises(ValueError):
        K.launch_copy(torch.randn(5000, device=DEV), torch.empty(5000, device=DEV), block=4096, num_warps=4)
    with pytest.raises(ValueError, match="eviction policy"):
        K.launch_copy(torch.randn(4096, device=DEV), torch.empty(4096, device=DEV), block=4096, num_warps=4,
                      evict="evict_sometimes")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fma_chains(K, dtype):
    out = poison(torch.empty(2048, device=DEV, dtype=dtype))
    a, b = 0.75, 0.125  # converges to 0.5 within the chain: a wrong count shows
    K.launch_fma(out, a, b, 3, block=1024, num_warps=4, unroll=4)
    x = np.arange(2048, dtype=np.float64)
    x = (x.astype(np.float32) * np.float32(1e-9)).astype(np.float64) if dtype == torch.float32 else x * 1e-9
    for _ in range(12):
        x = x * a + b
    assert check(out, x, rtol=1e-5 if dtype == torch.float32 else 1e-12)


@pytest.mark.parametrize("flops", [1, 2, 8, 96])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sweep_kernel(K, flops, dtype):
    from gpuspeed.roofline.sweep import reference

    x = torch.randn(2 * 4096, device=DEV).to(dtype)
    y = poison(torch.empty_like(x))
    K.launch_sweep(x, y, flops, 0.75, 0.125, block=4096, num_warps=8)
    ref = reference(x.float().cpu().numpy(), flops, 0.75, 0.125)
    assert check(y, ref, rtol=1e-5 if dtype == torch.float32 else None,
                 dtype=None if dtype == torch.float32 else "bfloat16")


def test_sweep_shape(K):
    assert K.sweep_shape(1) == (True, 1, 1)
    assert K.sweep_shape(2048) == (False, 32, 32)
    assert K.sweep_shape(96) == (False, 16, 3)
    for f in (2, 4, 6, 64, 2048):
        add, unroll, outer = K.sweep_shape(f)
        assert 2 * unroll * outer == f
    with pytest.raises(ValueError):
        K.sweep_shape(3)


def _wide_inputs(n: int, dtype, seed: int) -> torch.Tensor:
    """Fresh values over many scales: small, around multiples of pi, up to 1e4, and one tile past 2^15
    (the short sin's reduction limit), so both sin paths and the sign flips are exercised."""
    g = torch.Generator().manual_seed(seed)
    scale = 10.0 ** torch.randint(-2, 5, (n,), generator=g).double()
    x = torch.randn(n, generator=g, dtype=torch.float64) * scale
    x[-1024:] = torch.randn(1024, generator=g, dtype=torch.float64) * 1e6
    limit = torch.finfo(dtype).max  # fp16 tops out at 65504: stay finite
    return x.clamp(-limit, limit).to(dtype).to(DEV)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_elementwise_sin_to_output_precision(K, dtype, seed):
    x = _wide_inputs(8192, dtype, seed)
    y = poison(torch.empty_like(x))
    K.launch_elementwise("sin", x, y, block=1024, num_warps=4)
    ref = torch.sin(x.double())
    # judged against sin's own scale (|sin| <= 1): near a zero of sin a 16-bit result is exact only to
    # its absolute rounding, as torch.sin's own bf16/fp16 result is
    res = check(y, ref, atol=(1e-6 if dtype == torch.float32 else 4e-3))
    assert count_poisoned(y) == 0 and res.passed, res.summary
    assert check(y, torch.sin(x).double(), atol=1e-6 if dtype == torch.float32 else 8e-3).passed
    if dtype == torch.float16:  # fp16 conversion rounds in the interpreter too: nearly all correctly rounded
        assert (y.cpu() == ref.cpu().to(dtype)).double().mean() > 0.995


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_elementwise_add(K, dtype):
    g = torch.Generator().manual_seed(7)
    x, z = (torch.randn(4096 * 3, generator=g).to(dtype).to(DEV) for _ in range(2))
    y = poison(torch.empty_like(x))
    K.launch_elementwise("add", x, y, z, block=4096, num_warps=4, evict="")
    assert count_poisoned(y) == 0 and check(y, x.double() + z.double()).passed


def test_elementwise_specials_and_errors(K):
    x = torch.ones(1024, device=DEV, dtype=torch.bfloat16)
    x[:3] = torch.tensor([float("inf"), float("nan"), -0.0])
    y = poison(torch.empty_like(x))
    K.launch_elementwise("sin", x, y, block=1024, num_warps=4)
    assert torch.isnan(y[:2]).all() and y[2] == 0 and float(y[3]) == pytest.approx(0.8415, abs=4e-3)
    with pytest.raises(ValueError, match="unknown elementwise op"):
        K.launch_elementwise("cos", x, y)
    with pytest.raises(ValueError, match="add takes z"):
        K.launch_elementwise("add", x, y)


def test_fused_chain(K):
    x = torch.randn(8192, device=DEV)
    y = poison(torch.empty_like(x))
    K.launch_chain(x, y, 1.1, 0.2, 0.5, 0.1)
    xd = x.double()
    assert check(y, torch.sin(xd * np.float32(1.1) + np.float32(0.2)) * np.float32(0.5) + np.float32(0.1), rtol=1e-5)
