"""QA round 21, core: a demanding user's pass over the public API (check, bench, peak_memory, roofline.place,
graphs.capture) on the CPU."""

from __future__ import annotations

import re

import numpy as np
import pytest

from gpuspeed import check
from gpuspeed.errors import UserError


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
