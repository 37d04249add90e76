"""The roofline arithmetic: intensity, the roof at an intensity, the ridge, the bound. Pure functions.

Units: FLOP, bytes, seconds, FLOP/s and bytes/s (SI). A roof is min(peak FLOP/s, bandwidth x intensity);
the ridge is the intensity where the two meet (peak / bandwidth).
"""

from __future__ import annotations

import math


def intensity(flops: float, nbytes: float) -> float:
    """Arithmetic intensity in FLOP per byte (inf when no bytes move)."""
    if flops < 0 or nbytes < 0:
        raise ValueError("flops and bytes must be >= 0")
    if nbytes == 0:
        return math.inf if flops > 0 else math.nan
    return flops / nbytes


def roof(ai: float, peak_flops: float, bandwidth: float) -> float:
    """Attainable FLOP/s at intensity `ai` under one compute peak and one bandwidth (bytes/s)."""
    if peak_flops <= 0 or bandwidth <= 0:
        raise ValueError("peak and bandwidth must be positive")
    return min(peak_flops, bandwidth * ai)


def ridge(peak_flops: float, bandwidth: float) -> float:
    """Intensity (FLOP/byte) where the bandwidth roof meets the compute roof."""
    if peak_flops <= 0 or bandwidth <= 0:
        raise ValueError("peak and bandwidth must be positive")
    return peak_flops / bandwidth


def bound(ai: float, peak_flops: float, bandwidth: float) -> str:
    """'memory' left of the ridge, 'compute' at or right of it."""
    return "memory" if ai < ridge(peak_flops, bandwidth) else "compute"


def pct_of_roof(achieved_flops: float, ai: float, peak_flops: float, bandwidth: float) -> float:
    """Achieved FLOP/s as a percentage of the roof at its intensity."""
    return 100.0 * achieved_flops / roof(ai, peak_flops, bandwidth)


def ridge_from_curve(points: list[tuple[float, float, float]]) -> dict:
    """Fit a two-roof model to a measured sweep and derive its ridge.

    points: (intensity FLOP/byte, achieved FLOP/s, achieved bytes/s). The bandwidth roof is the best
    bytes/s seen, the compute roof the best FLOP/s; the ridge is their ratio. Also returns the measured
    knee: the lowest swept intensity that reaches 90 % of the compute roof.
    """
    pts = [p for p in points if p[1] > 0 and p[2] > 0 and math.isfinite(p[0])]
    if not pts:
        return {"bandwidth": None, "peak_flops": None, "ridge": None, "knee": None}
    bw = max(p[2] for p in pts)
    peak = max(p[1] for p in pts)
    knee = min((p[0] for p in pts if p[1] >= 0.9 * peak), default=None)
    return {"bandwidth": bw, "peak_flops": peak, "ridge": peak / bw, "knee": knee}
