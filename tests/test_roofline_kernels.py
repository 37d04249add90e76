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


@pytest.mark.parametrize("seed,evict", [(0, False), (1, True), (2, False)])
@pytest.mark.parametrize("block,warps", [(4096, 4), (8192, 8)])
def test_streams(K, seed, evict, block, warps):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(4 * block, device=DEV, generator=g)
    part = poison(torch.empty(4, device=DEV))
    assert check(K.launch_read(x, part, block=block, num_warps=warps, evict_first=evict),
                 x.double().view(4, -1).sum(1), rtol=1e-5)
    part = poison(torch.empty(2, device=DEV))
    ref = x.double().view(-1, 2, block).sum((0, 2))  # program p owns tiles p, p+2
    assert check(K.launch_read_persistent(x, part, block=block, num_warps=warps), ref, rtol=1e-5)
    y = poison(torch.empty_like(x))
    assert check(K.launch_copy(x, y, block=block, num_warps=warps, evict_first=evict), x, rtol=0, atol=0)
    poison(y)
    assert check(K.launch_copy(x, y, block=block, num_warps=warps, stream_store=True), x, rtol=0, atol=0)
    poison(y)
    v = float(torch.rand(1, generator=g, device=DEV)) + 0.5
    K.launch_write(y, v, block=block, num_warps=warps)
    assert count_poisoned(y) == 0 and check(y, torch.full_like(y, v), rtol=0, atol=0)


def test_stream_rejects_ragged_size(K):
    with pytest.raises(ValueError):
        K.launch_copy(torch.randn(5000, device=DEV), torch.empty(5000, device=DEV), block=4096, num_warps=4)


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


def test_fused_chain(K):
    x = torch.randn(8192, device=DEV)
    y = poison(torch.empty_like(x))
    K.launch_chain(x, y, 1.1, 0.2, 0.5, 0.1)
    xd = x.double()
    assert check(y, torch.sin(xd * np.float32(1.1) + np.float32(0.2)) * np.float32(0.5) + np.float32(0.1), rtol=1e-5)
