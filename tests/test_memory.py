"""peak_memory() on the host, budgets, cap() fallback and the chunk planner."""

import numpy as np
import pytest

from gpuspeed.errors import UserError
from gpuspeed.memory import HEADROOM, cap, check_budget, parse_budget, peak_memory, plan_chunks


@pytest.mark.parametrize("text,total,expected", [
    ("8GiB", None, 8 * 2**30), ("8GB", None, 8 * 10**9), ("512 MiB", None, 512 * 2**20),
    ("1.5gib", None, int(1.5 * 2**30)), ("80%", 10**10, 8 * 10**9), (12345, None, 12345), ("100", None, 100),
])
def test_parse_budget(text, total, expected):
    assert parse_budget(text, total) == expected


@pytest.mark.parametrize("bad", ["eight gigs", "8XB", "-1GB", "80%", "150%", 0, "0GB"])
def test_parse_budget_errors(bad):
    with pytest.raises(UserError):
        parse_budget(bad, None if bad != "150%" else 100)


def test_budget_headroom_rule():
    b = 8 * 2**30
    assert HEADROOM == 0.15
    assert check_budget(int(b * 0.85), "8GiB").fits
    assert not check_budget(int(b * 0.85) + 1, "8GiB").fits
    msg = check_budget(int(b * 0.9), "8GiB").message
    assert "does NOT fit" in msg and "15%" in msg


def test_peak_host_memory_of_a_numpy_allocation():
    n = 64 * 2**20  # 64 MiB, written so the pages are real

    def alloc():
        a = np.ones(n // 8)
        return float(a.sum())

    rep = peak_memory(alloc, device="cpu")
    assert rep.device == "cpu"
    assert n <= rep.peak_bytes < 1.5 * n
    assert rep.host_peak_bytes == rep.peak_bytes
    assert "no GPU" in rep.notes[0]
    assert rep.fits("1GiB").fits and not rep.fits("32MiB").fits


def test_peak_memory_of_nothing_is_small():
    rep = peak_memory(lambda: None, device="cpu")
    assert rep.peak_bytes < 8 * 2**20


def test_cap_without_gpu_says_it_is_not_enforced():
    import torch

    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    with cap("8GiB") as c:
        assert not c.enforced and "not enforced" in c.note
        assert c.budget_bytes == 8 * 2**30


def test_chunk_planner_fits_a_line():
    # peak = 100 MB + 4 kB per item
    plan = plan_chunks(1000, 100e6 + 4e6, 3000, 100e6 + 12e6, "1GB")
    assert plan.bytes_per_item == pytest.approx(4000)
    assert plan.fixed_bytes == pytest.approx(100e6)
    usable = 1e9 * 0.85
    assert plan.max_chunk == int((usable - 100e6) // 4000)
    assert plan.predicted_peak_bytes <= usable
    assert plan_chunks(1000, 1.0e6, 3000, 1.0e6, "1GB").max_chunk is None
    assert plan_chunks(10, 2e9, 20, 2.1e9, "1GB").max_chunk == 0
    assert plan_chunks(1000, 100e6 + 4e6, 3000, 100e6 + 12e6, "1GB", max_size=5000).max_chunk == 5000
    with pytest.raises(UserError):
        plan_chunks(10, 1, 10, 2, "1GB")
    with pytest.raises(UserError):
        plan_chunks(0, 1, 10, 2, "1GB")


def test_measure_chunk_plan_on_the_host():
    from gpuspeed.memory import measure_chunk_plan

    def run_chunk(n):  # 8 bytes per item, written so the pages are real
        return float(np.ones(n).sum())

    plan = measure_chunk_plan(run_chunk, 2_000_000, 6_000_000, "256MiB", device="cpu")
    assert plan.bytes_per_item == pytest.approx(8, rel=0.25)
    assert plan.max_chunk == pytest.approx((0.85 * 256 * 2**20 - plan.fixed_bytes) / plan.bytes_per_item, rel=1e-6)
