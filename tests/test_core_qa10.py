"""QA round 10 on the measurement core (CPU): check() of infinities, datetimes, large integer references and
object arrays; peak_memory() nested inside a measured call."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuspeed.verify import check


def _rng():
    return np.random.default_rng()


# --- check(): an infinity of the other sign, or a finite value where the reference is infinite -----------------


@pytest.mark.parametrize("out_special, ref_special", [(math.inf, -math.inf), (-math.inf, math.inf), (7.5, math.inf)])
def test_an_infinite_atol_does_not_pass_a_wrong_infinity(out_special, ref_special):
    ref = _rng().standard_normal(16)
    out = ref.copy()
    ref[3], out[3] = ref_special, out_special
    r = check(out, ref, atol=math.inf)
    assert not r.passed and r.n_over_tol == 1 and r.worst_index == (3,), r.summary
    assert check(ref.copy(), ref, atol=math.inf).passed  # the same infinity still matches


def test_an_infinite_rtol_reads_a_wrong_infinity_without_a_warning():
    ref = _rng().standard_normal(8)
    out = ref.copy()
    ref[0], out[0] = math.inf, -math.inf
    with np.errstate(all="raise"):  # inf x 0 of the tolerance: a RuntimeWarning on the user's screen
        r = check(out, ref, rtol=math.inf, atol=0)
    assert not r.passed and r.n_over_tol == 1
    same = np.append(0.0, ref[1:])  # a zero in the reference: inf x 0 was NaN room, which failed 0 against 0
    with np.errstate(all="raise"):
        assert check(same.copy(), same, rtol=math.inf, atol=0).passed
