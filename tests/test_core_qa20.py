"""QA round 20, core: format_time's rounding past a unit's end, roofline place()'s byte count, launch --explain's
first dynamic-shape recompile, and a demanding user's pass over `gpuspeed profile`."""

from __future__ import annotations

import pytest

from gpuspeed.stats import format_time

# -- format_time: a value that rounds up to 1000 of a unit reads as 1 of the next -------------------------------


@pytest.mark.parametrize(("seconds", "text"), [
    (9.9996e-07, "1.000 us"), (9.99996e-4, "999.996 us"), (9.999996e-4, "1.000 ms"), (0.9999996, "1.000 s"),
    (9.9994e-07, "999.9 ns"), (1e-6, "1.000 us"), (5e-9, "5.0 ns"), (0.0, "0.0 ns"), (-2e-3, "-2.000 ms"),
    (-9.9996e-07, "-1.000 us"), (1234.5, "1234.500 s"),
])
def test_format_time_rolls_over_to_the_next_unit(seconds, text):
    assert format_time(seconds) == text
