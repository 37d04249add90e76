"""GPU checks of the launch study's fusion points: interleaved rounds, checked outputs, honest flags."""

import pytest

pytestmark = pytest.mark.gpu


def test_fusion_points_are_rounds_and_a_slow_copy_is_flagged_not_silent():
    from gpuspeed.launch import fusion

    notes: list[str] = []
    rows = fusion.fusion_study([1_000_000, 100_000_000], 8, ("eager", "compiled", "reduce-overhead", "captured"),
                               "cuda", 0.3, lambda what: None, notes)
    assert not [r for r in rows if "error" in r], [r.get("error") for r in rows]
    assert all(len(r["rounds_us"]) == fusion.ROUNDS and isinstance(r["unreliable"], bool) for r in rows)
    assert all(r["check_passed"] for r in rows if r["variant"] != "copy")
    assert all(r.get("unreliable_why") for r in rows if r["unreliable"])  # a flag always says why
    copy = {r["N"]: r for r in rows if r["variant"] == "copy"}
    # 8 MB copied: a few us of launch and transfer; a cold state once made it ~50x slower, silently
    small = copy[1_000_000]
    assert small["unreliable"] or small["pct_copy_roof"] > 5, small
    # at 1e8 every variant streams: eager reads and writes 8 times what a fused one does
    big = {r["variant"]: r["time_s"] for r in rows if r["N"] == 100_000_000}
    assert big["eager"] > 4 * big["compiled"] and big["compiled"] < 1.5 * big["copy"], big
