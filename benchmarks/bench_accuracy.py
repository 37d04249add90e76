"""Is bench() right on this GPU? Writes <out>/bench_accuracy.json.

1. Known durations: torch.cuda._sleep(cycles) spins for a number of SM clock cycles. Its rate (cycles
   per second) is calibrated independently of CUDA events, from the host wall-clock slope between two
   long sleeps, so 10 us / 100 us / 1 ms / 10 ms kernels have known lengths; bench() must find them
   within 2 %.
2. Noise: rel_noise (relative standard error of the median) under 1 % from 100 us up.
3. Agreement with triton.testing.do_bench (median, the same flush: its 256 MB buffer zeroed between
   samples) within 3 % on a copy, a matmul and a softmax. Sustained load lowers the clocks (a 4096^3
   bf16 matmul drives an H200 from 1980 to ~1710 MHz within do_bench's 100 ms), so the headline compares
   like with like: bench() right after do_bench, for as long. Also recorded: bench() on a cool GPU
   against do_bench, and against a 20 ms do_bench that barely heats it.

Run on the GPU:  PYTHONPATH=src python3 benchmarks/bench_accuracy.py --out results/nvidia-h200
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import numpy as np
import torch

from gpuspeed import device as gdev
from gpuspeed.results import make_results, write_results
from gpuspeed.timing import bench

TARGETS_S = [10e-6, 100e-6, 1e-3, 10e-3]


def _wall(cycles: int, reps: int = 5) -> float:
    # Host wall clock between two synchronizes: deliberately NOT events, so the calibration is
    # independent of what it checks. Launch and sync costs cancel in the slope below.
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.cuda._sleep(cycles)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def calibrate_sleep_rate() -> float:
    """Cycles per second of torch.cuda._sleep: slope of wall time between ~20 ms and ~100 ms sleeps."""
    c1, c2 = 40_000_000, 200_000_000
    _wall(c1, reps=2)  # wake the clocks up
    return (c2 - c1) / (_wall(c2) - _wall(c1))


def known_durations() -> tuple[list[dict], list[str]]:
    """Each target timed in every GPU mode: auto (what bench() picks), events, graph and kernel."""
    rows, notes = [], []
    for target in TARGETS_S:
        rate_before = calibrate_sleep_rate()
        cycles = int(round(target * rate_before))
        fn = lambda c=cycles: torch.cuda._sleep(c)  # noqa: E731
        ms = {mode: bench(fn, name=f"sleep {target * 1e6:g} us", mode=mode, budget_s=2.0)
              for mode in ("auto", "events", "graph", "kernel")}
        rate_after = calibrate_sleep_rate()
        rate = (rate_before + rate_after) / 2
        known = cycles / rate
        row = {"target_s": target, "cycles": cycles, "known_s": known, "rate_hz": rate,
               "rate_drift": abs(rate_after - rate_before) / rate, "auto_mode": ms["auto"].mode,
               "throttled": any(m.throttled for m in ms.values()), "clocks": ms["auto"].clocks}
        for mode, m in ms.items():
            row |= {f"{mode}_median_s": m.median, f"{mode}_rel_error": (m.median - known) / known,
                    f"{mode}_rel_noise": m.rel_noise, f"{mode}_n": m.n}
        rows.append(row)
        print(f"sleep {target * 1e6:8.1f} us: known {known * 1e6:9.3f} us | " + " | ".join(
            f"{mode} {m.median * 1e6:9.3f} us ({100 * row[f'{mode}_rel_error']:+.2f}%)" for mode, m in ms.items()),
            flush=True)
    notes.append("known duration = cycles / rate, rate from the host wall-clock slope between 40M- and "
                 "200M-cycle sleeps, calibrated before and after each target (mean of the two)")
    notes.append("kernel mode times the kernel itself (CUPTI); events and graph modes also carry the fixed "
                 "cost of a kernel boundary (events_fixed_overhead_us, graph_fixed_overhead_us)")
    return rows, notes


def versus_do_bench() -> list[dict]:
    import triton.testing

    n = 1 << 28  # 1 GiB of fp32 each way for the copy
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(8192, 8192, device="cuda")
    cases = {
        "copy 1 GiB fp32": lambda: dst.copy_(src),
        "matmul 4096^3 bf16": lambda: torch.mm(a, b),
        "softmax 8192x8192 fp32": lambda: torch.softmax(x, dim=1),
    }
    # the same flush as do_bench: zero its own 256 MB buffer between samples
    cache = triton.runtime.driver.active.get_empty_cache_for_benchmark()
    same_flush = cache.zero_
    rows = []
    for name, fn in cases.items():
        cold = bench(fn, name=name, budget_s=2.0, flush=same_flush)  # the GPU as a single call finds it
        short = triton.testing.do_bench(fn, warmup=5, rep=20, return_mode="median") * 1e-3  # 20 ms: little heating
        theirs_ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        clock_after_do_bench = gdev.sm_clock_mhz()
        # like with like: right after do_bench, the same flush and as long a sustained run as its 100 ms
        n_sustained = int(min(2000, max(200, math.ceil(0.125 / cold.median))))
        hot = bench(fn, name=name, budget_s=10.0, min_samples=n_sustained, max_samples=n_sustained,
                    flush=same_flush)
        own = bench(fn, name=name, budget_s=2.0)  # bench()'s own flush (2x L2, fill), for the record
        theirs = theirs_ms * 1e-3
        rows.append({"case": name, "bench_median_s": cold.median, "bench_sustained_median_s": hot.median,
                     "bench_sustained_n": hot.n, "do_bench_median_s": theirs,
                     "rel_diff": (cold.median - theirs) / theirs,
                     "rel_diff_sustained": (hot.median - theirs) / theirs, "rel_noise": cold.rel_noise,
                     "do_bench_short_median_s": short, "rel_diff_short": (cold.median - short) / short,
                     "bench_own_flush_median_s": own.median, "rel_diff_own_flush": (own.median - theirs) / theirs,
                     "n": cold.n, "mode": cold.mode, "clocks": cold.clocks, "clocks_sustained": hot.clocks,
                     "sm_mhz_after_do_bench": clock_after_do_bench, "throttled_sustained": hot.throttled})
        print(f"{name:26}: bench {cold.median * 1e6:9.2f} us, do_bench 20 ms {short * 1e6:9.2f} us, do_bench "
              f"{theirs * 1e6:9.2f} us, bench sustained {hot.median * 1e6:9.2f} us (n={hot.n}); clocks "
              f"{cold.clocks} / {clock_after_do_bench} / {hot.clocks} MHz", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for bench_accuracy.json (default results/<gpu>)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_accuracy: needs a CUDA GPU (the CPU path is covered by the unit tests)", file=sys.stderr)
        return 2
    known, notes = known_durations()
    vs = versus_do_bench()
    big = [r for r in known if r["target_s"] >= 100e-6]
    known_s = np.array([r["known_s"] for r in known])
    summary = {
        "max_rel_error_known_duration": max(abs(r["kernel_rel_error"]) for r in known),
        "max_rel_error_known_duration_100us_plus": max(abs(r["kernel_rel_error"]) for r in big),
        "max_rel_error_known_duration_auto": max(abs(r["auto_rel_error"]) for r in known),
        "max_rel_noise_100us_plus": max(max(r["auto_rel_noise"], r["kernel_rel_noise"]) for r in big),
        # like with like: the same flush and as long a sustained load, so both see the same clocks
        "max_rel_diff_vs_do_bench": max(abs(r["rel_diff_sustained"]) for r in vs),
        "max_rel_diff_vs_do_bench_cold": max(abs(r["rel_diff"]) for r in vs),
        "max_rel_diff_vs_do_bench_short": max(abs(r["rel_diff_short"]) for r in vs),
        "any_throttled": any(r["throttled"] for r in known),
    }
    for mode in ("events", "graph", "kernel"):
        # median = fixed + slope x known: the fixed part is what a kernel boundary costs in this mode
        slope, fixed = np.polyfit(known_s, [r[f"{mode}_median_s"] for r in known], 1, w=1 / known_s)
        summary[f"{mode}_fixed_overhead_us"] = float(fixed * 1e6)
        summary[f"{mode}_slope"] = float(slope)
    rows = [{"kind": "known_duration", **r} for r in known] + [{"kind": "vs_do_bench", **r} for r in vs]
    doc = make_results("bench_accuracy", params={"targets_s": TARGETS_S, "flush_l2_bytes": 2 * gdev.l2_bytes()},
                       summary=summary, rows=rows, notes=notes)
    path = write_results(doc, args.out or gdev.get_device().slug and f"results/{gdev.get_device().slug}")
    print({k: (round(v, 5) if isinstance(v, float) else v) for k, v in summary.items()})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
