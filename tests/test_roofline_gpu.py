"""GPU sanity of the measured ceilings: none above its datasheet figure by more than 5 %; placements' bounds."""

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ceil():
    from gpuspeed.roofline import ceilings

    return ceilings("cuda", quick=True, nbytes=2**30)


def test_every_ceiling_measured_and_none_above_datasheet(ceil):
    import torch

    expected = {"copy", "read", "write", "torch_copy", "torch_read", "torch_write", "l2", "fp32", "fp64", "tf32",
                "bf16", "fp16"} | ({"fp8"} if torch.cuda.get_device_capability() >= (8, 9) else set())
    by_name = {c.name: c for c in ceil.rows}
    assert expected <= set(by_name), sorted(expected - set(by_name))
    missing = {n: by_name[n].error for n in expected if not by_name[n].value or by_name[n].value <= 0}
    assert not missing, missing
    over = [(c.name, c.value, c.pct_of_datasheet) for c in ceil.rows
            if c.pct_of_datasheet and c.pct_of_datasheet > 105]
    assert not over, over
    for name in expected:  # the ceiling is the best candidate that passed its check, and says which it was
        c = by_name[name]
        ran = [cand for cand in c.candidates if "value" in cand]
        best = max(ran, key=lambda cand: cand["value"])
        assert c.value == best["value"] and c.how == best["how"], (name, c.how, best)


def test_placements_bounds(ceil):
    import torch

    from gpuspeed.roofline import place

    x, y = torch.rand(2**26, device="cuda") + 0.5, torch.rand(2**26, device="cuda") + 0.5
    p = place(torch.add, x, y, flops=x.numel(), ceilings=ceil, budget_s=0.3)
    assert p.bound == "memory" and p.pct_of_roof < 105
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    p = place(torch.mm, a, b, ceilings=ceil, budget_s=0.3)
    assert p.flops == 2 * 8192**3 and p.bound == "compute"
    # A tensor-core rate is power-bound: one matmul's short runs spread over a band on an H200
    # (results/nvidia-h200/matmul_power.json, spread_max_over_min), and a quick ceiling measured hot read
    # 8 % under a later placement. So, as the study does, the roof is the best of a pass before and after
    # the placement, and the bound allows that spread (a wrong FLOP count or roof would be off by far
    # more); the memory-bound placement above is held to 5 %.
    from gpuspeed.roofline.ceilings import ceiling_steps

    again = dict(ceiling_steps("cuda", quick=True, nbytes=2**26))["BF16 matmul"]()
    roof = max(ceil.value("bf16"), again.value)
    assert 0.5 < p.TFLOPs / roof < 1.15, (p.TFLOPs, ceil.value("bf16"), again.value)


def test_sdpa_flops_counted_on_gpu():
    import torch

    from gpuspeed.roofline.place import count_flops
    from gpuspeed.roofline.workloads import sdpa_flops

    q = torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16)
    flops, _ = count_flops(torch.nn.functional.scaled_dot_product_attention, q, q, q)
    assert flops == sdpa_flops((q, q, q))


def test_builtin_elementwise_kernels_verify_on_gpu():
    # the Triton elementwise workloads check themselves against float64 before they are placed
    from gpuspeed.roofline.workloads import builtin

    checked = [w for w in builtin("cuda", quick=True) if w.verify is not None]
    assert {w.name for w in checked} >= {"add fp32", "add bf16", "sin fp32", "sin bf16", "fused chain fp32"}
    for w in checked:
        w.verify()
