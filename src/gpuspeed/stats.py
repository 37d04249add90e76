"""What a timing means: the Measurement record, its statistics, and compare()'s verdict.

The noise figure is the relative standard error of the median (distribution-free); a measurement whose
noise or spread makes its median untrustworthy says so (`unreliable` and a note). compare() bootstraps
the ratio of medians and prints the speedup with as many digits as its interval needs.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import MISSING, asdict, dataclass, field

import numpy as np

from gpuspeed.errors import UserError

_Z95 = 1.959963984540054
UNRELIABLE_NOISE = 0.05  # a median known only to over ±5 % is not a number to act on
# IQR over a quarter of the median: the samples spread over several levels (two modes, interference),
# and the median can land on a different one next run however tight its own error bar looks
UNRELIABLE_SPREAD = 0.25
# the median of the last third of the samples (in the order taken) over 10 % from the first third's: the call's time
# moved during the run (state kept between calls, heat, a cache that grows), so the median is of a moving target
UNRELIABLE_DRIFT = 0.10
DRIFT_THIRD = 5  # samples a third needs: the medians of 3 noisy samples moved 10 % apart in ~1 % of steady runs
MIN_COMPARE_SAMPLES = 3  # compare() bootstraps an interval only from this many samples a side (median_rel_error's too)


@dataclass
class Measurement:
    """Timing of one function. All times in seconds."""

    name: str
    median: float
    mean: float
    min: float
    max: float
    iqr: float
    p10: float
    p90: float
    n: int
    rel_noise: float  # relative standard error of the median (what the stopping rule watches)
    samples: list[float] = field(repr=False)  # a notebook showing `m` lists the statistics, not 2000 floats
    device: str
    mode: str  # "events", "graph", "kernel" or "cpu" (the host clock)
    # sm_max_mhz, sm_mhz_before/_after, sm_mhz_median_during/_min_during (polled while sampling),
    # power_/thermal_capped_fraction (share of the sampling a cap acted)
    clocks: dict = field(default_factory=dict)
    throttled: bool = False
    flush_l2: bool = True  # True only when every timed call started with L2 flushed
    rotate: int = 0
    calls_per_sample: int = 1  # per graph replay (graph mode), per batch (a call under 20 us on the bare host clock)
    notes: list[str] = field(default_factory=list)
    # how L2 was cleared: "per-call", "per-replay" (graph mode: once per replay of calls_per_sample calls),
    # "custom per-call" / "custom per-replay" (the caller's flush), "none"; "" in records made before it
    flush: str = ""
    device_sync: bool = False  # host clock with a full device synchronize before and after each call
    unreliable: bool = False  # noise or spread too large to trust the median (a note says which)
    shared_gpu: bool = False  # another process computed on the GPU while sampling (NVML; a note names it)
    # other_processes (holding a context), other_busy (pid -> highest SM % sampled), other_used_bytes_*
    gpu_sharing: dict = field(default_factory=dict)

    @property
    def rel_iqr(self) -> float:
        return self.iqr / self.median if self.median > 0 else float("nan")

    @property
    def median_us(self) -> float:
        return self.median * 1e6

    @property
    def median_ms(self) -> float:
        return self.median * 1e3

    def to_dict(self) -> dict:
        d = asdict(self)
        d["rel_iqr"] = self.rel_iqr
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Measurement":
        """Reads records of any version: unknown keys are dropped, missing ones take their defaults.

        Strict JSON (results files, --json) writes NaN and infinities as null: a null rel_noise reads back as
        inf (no error estimate: fewer than 3 samples), any other null time or sample as NaN, a null list or
        dict as empty."""
        if not isinstance(d, dict):
            raise UserError(f"a Measurement record is a dict (a JSON object), got {type(d).__name__}")
        known = {f for f in cls.__dataclass_fields__}
        kept = {k: v for k, v in d.items() if k in known}
        for k in _FLOAT_FIELDS:
            if k in kept and kept[k] is None:
                kept[k] = math.inf if k == "rel_noise" else math.nan
        if isinstance(kept.get("samples"), list):
            kept["samples"] = [math.nan if v is None else v for v in kept["samples"]]
        for k, empty in (("samples", list), ("notes", list), ("clocks", dict), ("gpu_sharing", dict)):
            if k in kept and kept[k] is None:
                kept[k] = empty()
        samples = kept.get("samples")
        if samples is not None and (not isinstance(samples, list) or not all(_is_number(v) for v in samples)):
            raise UserError(f"a Measurement record's samples must be a list of seconds, got {_short(samples)}")
        if samples and any(v < 0 for v in samples):  # a time is never negative: [-1, 1, 2] read as a 1 s median
            raise UserError(f"a Measurement record's samples are seconds, none below 0, got {_short(samples)}")
        if samples and any(k not in kept for k in _STAT_FIELDS):  # an older or trimmed record: its samples say them
            stats = summarize(samples, name="", device="", mode="")
            kept = {k: getattr(stats, k) for k in _STAT_FIELDS} | kept
        missing = [k for k, f in cls.__dataclass_fields__.items()
                   if k not in kept and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise UserError(f"a Measurement record lacks {', '.join(missing)}")
        for k in (*_FLOAT_FIELDS, "n"):
            if not _is_number(kept[k]):
                raise UserError(f"a Measurement record's {k} must be a number, got {_short(kept[k])}")
        _check_record_types(kept)
        return cls(**kept)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> "Measurement":
        try:
            d = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise UserError(f"a Measurement record is JSON text: {exc}") from None
        return cls.from_dict(d)

    def __str__(self) -> str:
        flag = flags(self)
        return (f"{self.name}: {format_time(self.median)} median, ±{100 * self.rel_noise:.2f}% "
                f"(IQR {100 * self.rel_iqr:.1f}%, n={self.n}, {self.mode}){flag}")


def flags(m) -> str:
    """' THROTTLED', ' UNRELIABLE', ' SHARED-GPU' for a Measurement or its dict, as tables print them."""
    get = m.get if isinstance(m, dict) else lambda k: getattr(m, k, False)
    return "".join(f" {word}" for key, word in (("throttled", "THROTTLED"), ("unreliable", "UNRELIABLE"),
                                                 ("shared_gpu", "SHARED-GPU")) if get(key))


_FLOAT_FIELDS = ("median", "mean", "min", "max", "iqr", "p10", "p90", "rel_noise")
_STAT_FIELDS = (*_FLOAT_FIELDS, "n")  # what summarize() reads off the samples
_TEXT_FIELDS = ("name", "device", "mode", "flush")
_FLAG_FIELDS = ("throttled", "flush_l2", "device_sync", "unreliable", "shared_gpu")
_COUNT_FIELDS = {"n": 0, "rotate": 0, "calls_per_sample": 1}  # the least each may be


def _check_record_types(kept: dict) -> None:
    """A one-line UserError for a record field of the wrong type or sign, which read on as a wrong answer: a
    'throttled': "no" printed THROTTLED, a negative median made compare()'s speedup negative, notes "abc" three notes.
    Whole counts written as floats (10.0) are taken as the count; a null time (NaN) passes."""
    for k in _FLOAT_FIELDS:
        if kept[k] < 0:
            raise UserError(f"a Measurement record's {k} is never below 0, got {_short(kept[k])}")
    for k, least in _COUNT_FIELDS.items():
        v = kept.get(k, least)
        if isinstance(v, float) and v.is_integer():
            kept[k] = v = int(v)
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < least:
            raise UserError(f"a Measurement record's {k} must be a whole number >= {least}, got {_short(v)}")
    for k in _TEXT_FIELDS:
        if k in kept and not isinstance(kept[k], str):
            raise UserError(f"a Measurement record's {k} must be a string, got {_short(kept[k])}")
    for k in _FLAG_FIELDS:
        if k in kept and not isinstance(kept[k], (bool, np.bool_)):
            raise UserError(f"a Measurement record's {k} must be true or false, got {_short(kept[k])}")
    if "notes" in kept and not (isinstance(kept["notes"], list) and all(isinstance(n, str) for n in kept["notes"])):
        raise UserError(f"a Measurement record's notes must be a list of strings, got {_short(kept['notes'])}")
    for k in ("clocks", "gpu_sharing"):
        if k in kept and not isinstance(kept[k], dict):
            raise UserError(f"a Measurement record's {k} must be a dict (a JSON object), got {_short(kept[k])}")


def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def format_time(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "nan" if math.isnan(seconds) else "inf" if seconds > 0 else "-inf"
    sign, size = ("-" if seconds < 0 else ""), abs(seconds)
    for unit, scale, decimals in (("ns", 1e-9, 1), ("us", 1e-6, 3), ("ms", 1e-3, 3), ("s", 1.0, 3)):
        text = f"{size / scale:.{decimals}f}"
        if float(text) < 1000 or unit == "s":  # the unit is chosen on the rounded text: 999.96 ns reads 1.000 us
            return f"{sign}{text} {unit}"


def median_rel_error(samples) -> float:
    """Relative standard error of the median, distribution-free.

    The 95 % confidence interval of the median runs between the order statistics n/2 -+ 1.96 sqrt(n)/2;
    its half-width over 1.96 is the standard error. Robust to the long right tail of GPU timings.
    """
    x = np.sort(np.asarray(samples, dtype=np.float64))
    n = x.size
    if n < 3:
        return float("inf")
    half = _Z95 * math.sqrt(n) / 2
    lo = max(int(math.floor(n / 2 - half)), 0)
    hi = min(int(math.ceil(n / 2 + half)), n - 1)
    med = float(np.median(x))
    return float((x[hi] - x[lo]) / (2 * _Z95) / med) if med > 0 else float("inf")


def _pct(fraction: float, decimals: int) -> str:
    """A fraction as a percentage for a note: fixed-point up to 10^6 %, then in powers of ten (not 300 digits)."""
    v = 100 * fraction
    return f"{v:.{decimals}f}" if not math.isfinite(v) or abs(v) < 1e6 else f"{v:.2e}"


def _quantiles(x, qs) -> list[float]:
    """np.percentile's linear quantiles (`qs` in percent), exact where a sample is infinite: numpy interpolates
    with 0 * inf there, so the median of [1, 2, inf] would read NaN (it is 2) and the top decile NaN (it is inf)."""
    x = np.asarray(x, dtype=np.float64)
    if np.isfinite(x).all() or np.isnan(x).any():  # all finite: numpy's own; a NaN makes every quantile NaN
        return [float(v) for v in np.percentile(x, qs)]
    x = np.sort(x)
    out = []
    for q in qs:
        h = (x.size - 1) * q / 100
        lo = int(math.floor(h))
        hi = min(lo + 1, x.size - 1)
        a, b, t = float(x[lo]), float(x[hi]), h - lo
        out.append(a if t == 0 or a == b else a + (b - a) * t)  # a finite, b = inf: inf
    return out


def reliability(rel_noise: float, rel_iqr: float) -> str | None:
    """Why a median with this noise and spread should not be trusted, or None when it can be."""
    if not math.isfinite(rel_noise) or rel_noise > UNRELIABLE_NOISE:
        return (f"unreliable: the median is known only to ±{_pct(rel_noise, 1)}% (over "
                f"{100 * UNRELIABLE_NOISE:.0f}%); take more samples (budget_s, max_samples) or quiet the machine")
    if math.isfinite(rel_iqr) and rel_iqr > UNRELIABLE_SPREAD:
        return (f"unreliable: IQR/median is {_pct(rel_iqr, 0)}% beside a median error of "
                f"±{_pct(rel_noise, 2)}%: the samples spread over more than one level (two modes, "
                "interference), so another run's median can land elsewhere; look at the samples")
    return None


def drift(samples) -> str | None:
    """Why samples taken in this order are not of one time: the last third's median over UNRELIABLE_DRIFT from the
    first third's, by more than three standard errors of the two (a steady call's thirds agree within their noise).
    None when they agree, or with under DRIFT_THIRD samples a third. Neither the median's error nor the IQR sees a steady
    rise: 1.0 ms rising to 1.4 ms read 1.2 ms, +-1 %."""
    x = np.asarray(samples, dtype=np.float64)
    third = x.size // 3
    if third < DRIFT_THIRD or not np.isfinite(x).all():
        return None
    first, last = float(np.median(x[:third])), float(np.median(x[-third:]))
    if not first > 0:
        return None
    change = (last - first) / first
    noise = math.hypot(median_rel_error(x[:third]) * first, median_rel_error(x[-third:]) * last)
    if abs(change) <= UNRELIABLE_DRIFT or not abs(last - first) > 3 * noise:
        return None
    why = ("slower as it repeats (state kept between calls, heat, a growing cache?)" if change > 0 else
           "faster as it repeats (a warm-up too short for it: pass a larger warmup_s)")
    return (f"unreliable: the time drifted {100 * change:+.0f}% during the run (median {format_time(first)} over the "
            f"first third of the samples, {format_time(last)} over the last): the call got {why}, so the median is "
            "of a moving target")


def summarize(samples, *, name: str, device: str, mode: str, **extra) -> Measurement:
    """A Measurement from raw samples (seconds), flagged unreliable (with a note) when it is."""
    x = np.asarray(samples, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no samples")
    q10, q25, q50, q75, q90 = _quantiles(x, [10, 25, 50, 75, 90])
    notes = list(extra.pop("notes", []))
    rel_noise = median_rel_error(x)
    iqr = q75 - q25 if q75 != q25 else 0.0  # inf - inf: no spread, not NaN
    # each reason said: a drift spreads the samples too (IQR over 25 %), and "more than one level" alone hid it
    whys = [w for w in (reliability(rel_noise, float(iqr / q50) if q50 > 0 else float("nan")), drift(x)) if w]
    notes += whys
    return Measurement(
        name=name, median=float(q50), mean=float(x.mean()), min=float(x.min()), max=float(x.max()),
        iqr=float(iqr), p10=float(q10), p90=float(q90), n=int(x.size),
        rel_noise=rel_noise, samples=[float(v) for v in x], device=device, mode=mode, notes=notes,
        unreliable=bool(whys), **extra,
    )


# ---------------------------------------------------------------------------------------------------
# compare()
# ---------------------------------------------------------------------------------------------------


def _digits(*gaps: float) -> int:
    """Decimals that make each nonzero gap visible (two significant digits of the smallest), 3 to 6."""
    small = min((abs(g) for g in gaps if g and math.isfinite(g)), default=1.0)
    return int(min(6, max(3, math.ceil(-math.log10(small)) + 1)))


def format_speedup(speedup: float, ci_low: float, ci_high: float, confidence: float = 0.95) -> str:
    """"1.0032x [95% CI 1.0011, 1.0054]": enough digits that the interval's ends differ from each other
    and from 1, so the verdict's basis can be read off the line."""
    finite = [abs(v) for v in (speedup, ci_low, ci_high) if math.isfinite(v) and v]
    if finite and (max(finite) >= 1e6 or min(finite) < 1e-3):  # fixed-point would print 300 digits, or 0.000x
        return f"{speedup:.3g}x [{100 * confidence:.0f}% CI {ci_low:.3g}, {ci_high:.3g}]"
    d = _digits(ci_high - ci_low, ci_low - 1, ci_high - 1)
    return f"{speedup:.{d}f}x [{100 * confidence:.0f}% CI {ci_low:.{d}f}, {ci_high:.{d}f}]"


@dataclass
class Comparison:
    speedup: float  # baseline.median / candidate.median: > 1 means the candidate is faster
    ci_low: float
    ci_high: float
    verdict: str  # "faster", "slower" or "same"
    confidence: float = 0.95
    threshold: float = 0.01
    note: str = ""  # set when the interval could not be estimated (too few samples): the basis says so

    @property
    def basis(self) -> str:
        """Why the verdict is what it is, in words."""
        if self.note:
            return self.note
        if self.verdict == "faster":
            return f"whole interval above 1, speedup over {1 + self.threshold:g}"
        if self.verdict == "slower":
            return f"whole interval below 1, speedup under 1/{1 + self.threshold:g}"
        if self.ci_low <= 1 <= self.ci_high:
            return "interval includes 1"
        return f"within {100 * self.threshold:g}% of 1"

    def __str__(self) -> str:
        return (f"{format_speedup(self.speedup, self.ci_low, self.ci_high, self.confidence)} "
                f"({self.verdict}: {self.basis})")


def compare(baseline: Measurement, candidate: Measurement, *, n_boot: int = 2000, confidence: float = 0.95,
            threshold: float = 0.01, seed: int = 0) -> Comparison:
    """Speedup of `candidate` over `baseline`, with a bootstrap confidence interval of the median ratio.

    The verdict is "faster" (or "slower") only when the whole interval lies on one side of 1 and the
    speedup itself is beyond `threshold` (1 % by default); otherwise "same". A measurement of fewer than
    MIN_COMPARE_SAMPLES samples has no error estimate (its rel_noise is inf): resampling one or two values
    gives a zero-width interval that is no evidence, so the interval is [0, inf] and the verdict "same".
    """
    for what, m in (("baseline", baseline), ("candidate", candidate)):
        if not isinstance(m, Measurement):
            raise UserError(f"compare() takes two Measurements (what bench() returns); the {what} is a "
                            f"{type(m).__name__}")
    if isinstance(confidence, bool) or not isinstance(confidence, numbers.Real) or not 0 < confidence < 1:
        raise UserError(f"confidence is a fraction in (0, 1), e.g. 0.95; got {confidence!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not 0 <= threshold < math.inf:
        raise UserError(f"threshold is a fraction >= 0, e.g. 0.01 for 1 %; got {threshold!r}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, numbers.Integral) or n_boot < 1:
        raise UserError(f"n_boot must be a whole number >= 1, got {n_boot!r}")
    a = np.asarray(baseline.samples, dtype=np.float64)
    b = np.asarray(candidate.samples, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        raise UserError("compare() needs measurements with samples")
    if math.isnan(baseline.median) or math.isnan(candidate.median) or np.isnan(a).any() or np.isnan(b).any():
        raise UserError("compare() needs measurements without NaN times: a NaN sample has no speed to compare")
    if not candidate.median > 0:  # the speedup divides by it
        raise UserError(f"compare() needs a candidate with a positive median time, got {candidate.median:g}")
    speedup = baseline.median / candidate.median
    few = min(a.size, b.size)
    if few < MIN_COMPARE_SAMPLES:  # the bootstrap of one or two values is a point, not an interval
        return Comparison(speedup=float(speedup), ci_low=0.0, ci_high=math.inf, verdict="same",
                          confidence=confidence, threshold=threshold,
                          note=f"too few samples to tell (n={a.size} vs {b.size}; at least "
                               f"{MIN_COMPARE_SAMPLES} each give an interval)")
    rng = np.random.default_rng(seed)
    ma = np.median(a[rng.integers(0, a.size, (n_boot, a.size))], axis=1)
    mb = np.median(b[rng.integers(0, b.size, (n_boot, b.size))], axis=1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # a resampled median of 0: an infinite ratio (0/0: NaN)
        ratios = ma / mb
    ratios = ratios[~np.isnan(ratios)]  # 0/0 says nothing about the ratio: left out, not made the whole CI NaN
    alpha = (1 - confidence) / 2
    lo, hi = (_quantiles(ratios, [100 * alpha, 100 * (1 - alpha)]) if ratios.size  # an infinite end stays infinite
              else (math.nan, math.nan))
    if lo > 1 and speedup > 1 + threshold:
        verdict = "faster"
    elif hi < 1 and speedup < 1 / (1 + threshold):
        verdict = "slower"
    else:
        verdict = "same"
    return Comparison(speedup=float(speedup), ci_low=lo, ci_high=hi, verdict=verdict, confidence=confidence,
                      threshold=threshold)
