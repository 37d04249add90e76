"""Elementwise chains: the K-op chain both studies run, its float64 check, and the tiny 1000-op chain
(eager against one replayed capture())."""

from __future__ import annotations

from typing import Callable

import numpy as np

from gpuspeed import graphs, timing, verify
from gpuspeed.device import why_cpu
from gpuspeed.errors import UserError
from gpuspeed.launch.sweep import TINY_N, Progress, err_text, wall_time

CHECK_ELEMENTS = 1_000_000  # outputs are checked on an evenly strided subsample this big


def make_chain(k: int) -> Callable:
    """x -> K elementwise ops, alternating *1.001 and -0.001: one kernel and one HBM round trip each."""
    if k < 1:
        raise UserError("a chain needs at least one op")

    def chain(x):
        for i in range(k):
            x = x * 1.001 if i % 2 == 0 else x - 0.001
        return x

    chain.__name__ = f"chain{k}"
    return chain


def chain_rtol(k: int) -> float:
    """fp32 tolerance for a K-op chain: rounding grows at most ~1 ulp per op (2^-24 each), x2 margin."""
    return max(verify.TOLERANCES["float32"], 2 * k * 2.0**-24 * 4)


def check_chain(out, x, k: int) -> verify.CheckResult:
    """Check out == chain(x) against a float64 reference on an evenly strided subsample."""
    step = max(1, x.numel() // CHECK_ELEMENTS)
    ref = make_chain(k)(x[::step].detach().double().cpu())
    return verify.check(out[::step], ref, rtol=chain_rtol(k))


def tiny_chain(k: int, where: str, budget_s: float, progress: Progress, notes: list[str],
               rows: list | None = None) -> tuple[list, dict]:
    """Eager vs a replayed capture() of a K-op chain on TINY_N elements, both timed with bench(). `rows`: the list
    each row goes into as it is measured (the caller's, so that a run stopped part-way keeps them)."""
    import torch

    rows = [] if rows is None else rows
    fn = make_chain(k)
    dev = "cuda" if where == "cuda" else "cpu"
    x = torch.randn(TINY_N, device=dev)
    times: dict = {}
    for variant in ("eager", "captured"):
        progress(f"chain{k} {variant}")
        row = {"study": "chain", "variant": variant, "K": k, "N": TINY_N}
        try:
            if variant == "eager":
                run = lambda: fn(x)  # noqa: E731
                out = fn(x)
            else:
                if where != "cuda":
                    row["skipped"] = f"{why_cpu()}: CUDA graphs are captured on a GPU only"
                    rows.append(row)
                    continue
                g = graphs.capture(fn, x)
                verify.poison(g.static_outputs)
                out = g(x)
                run = g.replay
            res = check_chain(out, x, k)
            row |= {"check_passed": res.passed, "rel_l2_err": res.rel_l2_err}
            m = timing.bench(run, name=f"chain{k} {variant}", device=dev, mode="events" if dev == "cuda" else "cpu",
                             flush=False, budget_s=budget_s)
            row |= {"time_s": m.median, "us_per_op": m.median / k * 1e6, "n": m.n, "rel_noise": m.rel_noise,
                    "mode": m.mode, "throttled": m.throttled, "unreliable": bool(getattr(m, "unreliable", False))}
            times[variant] = m.median
            if where == "cuda":
                # what one call costs its caller: host wall time from a synchronize to a synchronize
                wall = float(np.median(wall_time(run, 1, torch.cuda.synchronize, 15)))
                row["wall_s"] = wall
                times[f"{variant}_wall"] = wall
            if variant == "captured":
                row["identical_to_eager"] = bool(torch.equal(out, fn(x)))
        except Exception as exc:
            row["error"] = err_text(exc)
        rows.append(row)
    both = "eager" in times and "captured" in times
    # the headline compares like with like and is the conservative one: host wall time of one call,
    # synchronize to synchronize, on both sides (bench()'s events ratio is kept beside it)
    walls = "eager_wall" in times and "captured_wall" in times
    speedup = times["eager_wall"] / times["captured_wall"] if walls else None
    speedup_events = times["eager"] / times["captured"] if both else None
    return rows, {"eager_s": times.get("eager"), "eager_wall_s": times.get("eager_wall"),
                  "captured_s": times.get("captured"), "captured_wall_s": times.get("captured_wall"),
                  "speedup": speedup, "speedup_events": speedup_events}
