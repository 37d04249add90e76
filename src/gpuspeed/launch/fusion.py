"""The fusion study: a K-op elementwise chain over N elements, eager vs torch.compile (default,
reduce-overhead) vs hand capture() of each, against one device-to-device copy of N elements (the copy roof).

Every point of one N is built and checked first, then timed in ROUNDS interleaved rounds of bench()
(copy, eager, compiled, ..., copy, eager, ...): a cold start or a disturbed moment of the host lands in
one round of one point rather than being the point. A point's time is the median of its rounds. Points
the numbers cannot vouch for are kept but flagged `unreliable` with the reason: noisy samples, rounds
that disagree, or a time above the same variant's time at a larger N (more work cannot take less time,
so the smaller-N point caught a slow host state: the small-N points are host-bound).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from gpuspeed import device as _device
from gpuspeed import graphs, timing, verify
from gpuspeed.errors import UserError
from gpuspeed.launch.chains import check_chain, make_chain
from gpuspeed.launch.sweep import Progress, err_text

VARIANTS = ("eager", "compiled", "reduce-overhead", "captured", "captured-compiled")
ROUNDS = 3  # interleaved bench() rounds per point
NOISY = 0.05  # a point whose median rel_noise is above this is flagged
ROUND_SPREAD = 0.25  # ... or whose rounds spread (max - min) / median above this
MONOTONE_SLACK = 0.20  # ... or that is this much slower (plus 3x noise) than the same variant at a larger N


def format_n(n) -> str:
    """N as 1e+06 where that is exact, else in full: 1500 and 2000 both read "2e+03" in one table."""
    short = format(n, ".0e")
    return short if float(short) == n else f"{int(n):,}" if float(n).is_integer() else f"{n:g}"


def _rotation(n: int, where: str) -> int:
    """Input copies to cycle through so each call reads cold data: ~2x L2 in all, at most 64."""
    if where != "cuda":
        return 1
    return int(min(64, max(1, math.ceil(2 * _device.l2_bytes() / (4 * n)))))


def _cycler(fns: list, xs: list) -> Callable:
    i = [0]

    def run():
        j = i[0] % len(xs)
        i[0] += 1
        return fns[j % len(fns)](xs[j])

    return run


def _build_variant(variant: str, fn, xs, compiled: dict, where: str):
    """(timed callable cycling through xs, a callable giving one checked output for xs[0])."""
    import torch

    def compiled_fn(mode: str):
        if mode not in compiled:
            # dynamic=False: one kernel specialized per N, as a user with fixed shapes gets; automatic
            # dynamic shapes (after the second N) give a slower generic kernel
            compiled[mode] = torch.compile(fn, mode=None if mode == "default" else mode, dynamic=False)
        return compiled[mode]

    if variant == "eager":
        return _cycler([fn], xs), lambda: fn(xs[0])
    if variant == "compiled":
        cf = compiled_fn("default")
        return _cycler([cf], xs), lambda: cf(xs[0]).clone()
    if variant == "reduce-overhead":
        rf = compiled_fn("reduce-overhead")

        def step(x):
            torch.compiler.cudagraph_mark_step_begin()  # an inference loop: the last outputs are dead
            return rf(x)
        return _cycler([step], xs), lambda: step(xs[0]).clone()
    inner = fn if variant == "captured" else compiled_fn("default")
    if where != "cuda":
        return _cycler([inner], xs), lambda: inner(xs[0])
    gs = [graphs.capture(inner, x) for x in xs]  # one graph per input copy: passed in place, no copy-in

    def first():
        verify.poison(gs[0].static_outputs)
        return gs[0](xs[0]).clone()
    return _cycler(gs, xs), first


def timing_fields(rounds: list[timing.Measurement], nbytes: int) -> dict:
    """A point's fields from its rounds: time = median of the rounds' medians, their spread, and whether
    the point is unreliable (with why)."""
    medians = [m.median for m in rounds]
    t = float(np.median(medians))
    noise = float(np.median([m.rel_noise for m in rounds]))
    spread = (max(medians) - min(medians)) / t if t > 0 else math.nan
    why = []
    if noise > NOISY:
        why.append(f"samples noisy (rel_noise {noise:.1%} > {NOISY:.0%})")
    if len(rounds) > 1 and spread > ROUND_SPREAD:
        why.append(f"rounds disagree ({', '.join(f'{v * 1e6:.3g}' for v in medians)} us)")
    flagged = [m for m in rounds if getattr(m, "unreliable", False)]  # bench()'s own verdict, where it gives one
    if flagged:
        said = next((n for m in flagged for n in m.notes if n.startswith("unreliable")), "")
        why.append(f"bench flagged {len(flagged)} of {len(rounds)} rounds unreliable" + (f" ({said})" if said else ""))
    d = {"time_s": t, "median_us": t * 1e6, "n": sum(m.n for m in rounds), "rel_noise": noise,
         "rounds_us": [v * 1e6 for v in medians], "round_spread": spread, "mode": rounds[0].mode,
         "throttled": any(m.throttled for m in rounds), "GBps": nbytes / t / 1e9, "unreliable": bool(why)}
    if why:
        d["unreliable_why"] = why
    return d


def _noise(row: dict) -> float:
    v = row.get("rel_noise")
    return v if isinstance(v, (int, float)) and math.isfinite(v) else 0.0  # unknown noise adds no slack


def flag_non_monotone(rows: list[dict]) -> None:
    """Flag a point slower than its own variant at a larger N by more than MONOTONE_SLACK + 3x noise."""
    for variant in dict.fromkeys(r["variant"] for r in rows):
        pts = sorted((r for r in rows if r["variant"] == variant and "time_s" in r), key=lambda r: r["N"])
        for i, r in enumerate(pts):
            later = pts[i + 1:]
            if not later:
                continue
            fastest = min(later, key=lambda q: q["time_s"])
            slack = MONOTONE_SLACK + 3 * (_noise(r) + _noise(fastest))
            if r["time_s"] > fastest["time_s"] * (1 + slack):
                r["unreliable"] = True
                r.setdefault("unreliable_why", []).append(
                    f"slower than the same variant at N={format_n(fastest['N'])} ({fastest['time_s'] * 1e6:.3g} us): "
                    f"more work cannot take less time, so this point caught a slow host state")


def add_roof(rows: list[dict]) -> None:
    """% of the copy roof (best copy GB/s over all N) and time over one copy at the same N."""
    copies = {r["N"]: r for r in rows if r["variant"] == "copy" and "time_s" in r}
    roof = max((r["GBps"] for r in copies.values()), default=None)
    for r in rows:
        if "GBps" in r and roof:
            r["pct_copy_roof"] = 100.0 * r["GBps"] / roof
        c = copies.get(r["N"])
        if c and "time_s" in r:
            r["over_copy"] = r["time_s"] / c["time_s"]


def point_bytes(variant: str, n: int, k: int, where: str) -> int:
    """Bytes one call of a fusion point moves, by design (fp32): eager reads and writes N per op, a fused chain once,
    a copy once; reduce-overhead on a GPU also copies its (non-static) input into its CUDA graph's static buffer,
    which a CPU run (no graph) never does."""
    if variant in ("eager", "captured"):
        passes = 2 * k
    else:
        passes = 4 if variant == "reduce-overhead" and where == "cuda" else 2
    return passes * 4 * n


def steps(ns, variants) -> int:
    """Progress steps of fusion_study: one build and ROUNDS timings per point."""
    return len(ns) * (1 + len(variants)) * (1 + ROUNDS)


def fusion_study(ns, k: int, variants, where: str, budget_s: float, progress: Progress,
                 notes: list[str], rows: list | None = None) -> list[dict]:
    """Each variant of a K-op chain at each N, plus one copy of N elements; rows with time, bytes, GB/s. `rows`: the
    list each N's rows go into once its rounds are done (the caller's, so that a run stopped part-way keeps them)."""
    import torch

    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise UserError(f"unknown variant(s) {', '.join(unknown)}: choose from {', '.join(VARIANTS)}")
    dev = "cuda" if where == "cuda" else "cpu"
    mode = "events" if dev == "cuda" else "cpu"
    fn = make_chain(k)
    rows = [] if rows is None else rows
    if where != "cuda" and any(v.startswith("captured") for v in variants):
        notes.append(f"{_device.why_cpu()}: captured variants run eagerly (capture() falls back)")
    for n in ns:
        # fresh compiles per N: static shapes give one kernel per N, and dynamo's per-function recompile
        # limit (8) must not silently send later N back to eager
        torch._dynamo.reset()
        compiled: dict = {}
        r = _rotation(n, where)
        xs = [torch.randn(n, device=dev) for _ in range(r)]
        dst = torch.empty(n, device=dev)
        progress(f"fusion N={format_n(n)} copy")
        points = [({"study": "fusion", "variant": "copy", "N": n, "K": k, "rotate": r,
                    "bytes": point_bytes("copy", n, k, where)}, _cycler([dst.copy_], xs))]
        for variant in variants:
            progress(f"fusion N={format_n(n)} {variant}")
            row = {"study": "fusion", "variant": variant, "N": n, "K": k, "rotate": r,
                   "bytes": point_bytes(variant, n, k, where)}
            call = None
            try:
                call, first = _build_variant(variant, fn, xs, compiled, where)
                res = check_chain(first(), xs[0], k)
                row |= {"check_passed": res.passed, "rel_l2_err": res.rel_l2_err}
            except Exception as exc:
                row["error"] = err_text(exc)
            points.append((row, call))
        measured: dict[int, list] = {id(row): [] for row, _ in points}
        for row, call in points:  # warm every point before any is timed: compiles, allocator, caches
            if call is not None and "error" not in row:
                try:
                    for _ in range(len(xs) + 2):
                        call()
                except Exception as exc:
                    row["error"] = err_text(exc)
        if dev == "cuda":
            torch.cuda.synchronize()
        for i in range(ROUNDS):
            for row, call in points:
                progress(f"fusion N={format_n(n)} {row['variant']} round {i + 1}")
                if call is None or "error" in row:
                    continue
                try:
                    measured[id(row)].append(timing.bench(call, name=f"{row['variant']} N={n}", device=dev,
                                                          mode=mode, flush=False, budget_s=budget_s / ROUNDS))
                except Exception as exc:
                    row["error"] = err_text(exc)
        for row, _ in points:
            if "error" not in row and measured[id(row)]:
                row |= timing_fields(measured[id(row)], row["bytes"])
            rows.append(row)
        points = measured = xs = dst = None
        if dev == "cuda":
            torch.cuda.empty_cache()
    flag_non_monotone(rows)
    add_roof(rows)
    return rows
