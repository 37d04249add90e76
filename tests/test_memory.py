"""peak_memory() on the host, budgets, cap() fallback and the chunk planner."""

import numpy as np
import pytest

from gpuspeed.errors import UserError
from gpuspeed.memory import HEADROOM, cap, check_budget, format_bytes, parse_budget, peak_memory, plan_chunks


@pytest.mark.parametrize("text,total,expected", [
    ("8GiB", None, 8 * 2**30), ("8GB", None, 8 * 10**9), ("512 MiB", None, 512 * 2**20),
    ("1.5gib", None, int(1.5 * 2**30)), ("80%", 10**10, 8 * 10**9), (2**20, None, 2**20), ("100B", None, 100),
    (8.5e9, None, 8_500_000_000), ("3000000", None, 3_000_000),
])
def test_parse_budget(text, total, expected):
    assert parse_budget(text, total) == expected


@pytest.mark.parametrize("bad", ["eight gigs", "8XB", "-1GB", "80%", "150%", 0, "0GB", 8.5, 8, "8", 1000.0])
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
    with pytest.warns(RuntimeWarning, match="not enforced"):
        with cap("8GiB") as c:
            assert not c.enforced and "not enforced" in c.note
            assert c.budget_bytes == 8 * 2**30


def test_a_bare_small_number_is_refused_with_the_unit_to_write():
    with pytest.raises(UserError, match="8.5GiB"):
        check_budget(2**30, 8.5)


def test_fits_message_has_enough_digits_and_says_when_nothing_was_measured():
    msg = check_budget(3 * 2**20, "8GiB").message
    assert msg.startswith("peak 3.00 MiB fits in 8.00 GiB") and "0.00" not in msg
    assert "limit 6.80 GiB" in msg
    assert check_budget(0, "8GiB").message.startswith("nothing measured")
    assert format_bytes(1536) == "1.50 KiB" and format_bytes(100) == "100 B"
    assert format_bytes(123.4 * 2**30) == "123 GiB" and format_bytes(None) == "?"


def test_peak_memory_warms_up_first_unless_told_not_to():
    cache = []

    def first_call_builds_a_cache():
        if not cache:  # a one-time workspace, as cuBLAS or a compiled kernel would make
            cache.append(np.ones(32 * 2**20 // 8))
        return float(np.ones(2**20 // 8).sum())

    warm = peak_memory(first_call_builds_a_cache, device="cpu")
    assert warm.warmup == 1 and warm.peak_bytes < 16 * 2**20
    cache.clear()
    cold = peak_memory(first_call_builds_a_cache, device="cpu", warmup=0)
    assert cold.peak_bytes >= 32 * 2**20
    with pytest.raises(UserError):
        peak_memory(first_call_builds_a_cache, device="cpu", warmup=-1)


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


def test_measuring_numpy_code_on_the_cpu_does_not_import_torch():
    # peak_memory and bench of NumPy code on the CPU imported torch (~1.3 s) only to name the CPU and its memory
    # (get_device checked CUDA for a note): every NumPy or Numba candidate's worker in `gpuspeed optimize` paid it
    import subprocess
    import sys

    code = ("import sys, numpy as np, gpuspeed\n"
            "x = np.ones(1000)\n"
            "r = gpuspeed.peak_memory(np.cumsum, x, device='cpu')\n"
            "m = gpuspeed.bench(np.cumsum, x, device='cpu', budget_s=0.01)\n"
            "assert r.total_bytes and m.device, (r, m.device)\n"
            "print('torch' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stdout + r.stderr[-2000:]
