"""QA round 21, core: a demanding user's pass over the public API (check, bench, peak_memory, roofline.place,
graphs.capture) on the CPU."""

from __future__ import annotations

import re

import numpy as np
import pytest

from gpuspeed import check
from gpuspeed.errors import UserError


def _cpu_ceilings():
    from gpuspeed.roofline.ceilings import Ceiling, Ceilings

    return Ceilings("cpu", "test", [Ceiling("copy", "memory", 20.0), Ceiling("fp32", "compute", 0.5),
                                    Ceiling("fp64", "compute", 0.25)])


# -- check(): a failure's numbers read apart from the bound they broke ---------------------------------------------


def _number_after(label: str, text: str) -> float:
    return float(re.search(re.escape(label) + r" ([-+0-9.e]+)", text).group(1))


def test_check_failing_on_rel_l2_alone_prints_it_above_rtol():
    # one float32 number 1.0013e-5 off: within the elementwise bound, just past rel L2 <= rtol
    r = check(np.float32(1.0), np.float32(1.00001))
    assert not r.passed
    assert _number_after("rel L2", r.summary) > _number_after("> rtol", r.summary), r.summary


def test_check_failing_just_past_atol_prints_max_abs_above_it():
    x = np.random.default_rng(0).standard_normal(5)
    r = check(x, x + 1.00001e-5, rtol=0, atol=1e-5)
    assert not r.passed and r.n_over_tol == 5
    assert _number_after("max abs", r.summary) > _number_after("atol", r.summary), r.summary
    # far apart, three digits as before
    r = check(x, x + 1, rtol=0, atol=1e-5)
    assert "(atol 1e-05, rtol 0); max abs 1," in r.summary


# -- place(): bench options are checked before the call is counted and the ceilings measured -----------------------


@pytest.mark.parametrize(("options", "said"), [
    ({"budge_s": 0.1}, "did you mean budget_s"),
    ({"budget_s": -1}, "budget_s must be a positive"),
    ({"mode": "gpu"}, "unknown mode 'gpu'"),
    ({"min_samples": 1}, "min_samples"),
    ({"rotate": 1.5}, "rotate must be a whole number"),
])
def test_place_refuses_a_bad_bench_option_before_any_work(options, said):
    import torch

    from gpuspeed.roofline import place

    calls = []

    def add(a, b):
        calls.append(1)
        return a + b

    x = torch.randn(64)
    with pytest.raises(UserError, match=said):
        place(add, x, x, flops=64, **options)  # no ceilings=: they would be measured first (~10 s on the CPU)
    assert calls == []


def test_place_graph_mode_on_the_cpu_is_refused_before_any_work():
    import torch

    from gpuspeed.device import cuda_available
    from gpuspeed.roofline import place

    if cuda_available():
        pytest.skip("graph mode is fine with a GPU")
    calls = []
    x = torch.randn(64)
    with pytest.raises(UserError, match="graph mode needs a CUDA device"):
        place(lambda a: calls.append(1) or a * 2, x, flops=64, mode="graph")
    assert calls == []


def test_place_takes_flops_summed_on_a_tensor_and_keeps_a_huge_count_short():
    import torch

    from gpuspeed.roofline import place

    x = torch.randn(256)
    flops = (x != 0).sum() * 2  # a 0-d tensor, as a count summed on the data is
    p = place(torch.add, x, x, flops=flops, ceilings=_cpu_ceilings(), budget_s=0.05, min_samples=3)
    assert p.flops == 2 * int((x != 0).sum()) and p.flops_source == "given"
    p = place(torch.add, x, x, flops=np.array(512), bytes=np.array(3072), ceilings=_cpu_ceilings(), budget_s=0.05,
              min_samples=3)
    assert (p.flops, p.bytes) == (512, 3072)
    with pytest.raises(UserError, match="an int of 401 digits") as err:
        place(torch.add, x, x, flops=10**400, ceilings=_cpu_ceilings())
    assert len(str(err.value)) < 120
    with pytest.raises(UserError, match=r"flops must be finite and >= 0 \(FLOPs per call\), got tensor"):
        place(torch.add, x, x, flops=torch.tensor([1.0, 2.0]), ceilings=_cpu_ceilings())
