"""How far a power-bound matmul's rate moves from one short run to the next. Writes <out>/matmul_power.json.

A large bf16 matmul draws the GPU to its power cap; the driver then lowers the SM clock for as long as the
cap acts, in steps of tens of ms. bench() reads the share of each run the cap acted from NVML's violation
counters (clocks["power_capped_fraction"]). This times one bf16 matmul in RUNS short bench() runs, each
after an idle of 0, 0.3 or 1 s, and records each run's median rate and cap share: the spread of those
medians is why gpuspeed's tensor-core ceilings are the best of several runs (roofline/ceilings.py,
TENSOR_RUNS), and why a single placement can land a few % above or below such a ceiling.

Run on the GPU:  PYTHONPATH=src python3 benchmarks/matmul_power.py --out results/nvidia-h200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from gpuspeed.results import make_results, write_results
from gpuspeed.timing import bench

N = 8192
RUNS = 8  # per idle setting
IDLES_S = (0.0, 0.3, 1.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for matmul_power.json (default results/<gpu>)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("matmul_power: needs a CUDA GPU", file=sys.stderr)
        return 2
    a, b = (torch.randn(N, N, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    flops = 2 * N**3
    rows = []
    for idle in IDLES_S:
        for i in range(RUNS):
            time.sleep(idle)
            m = bench(torch.mm, a, b, name=f"mm bf16 {N}^3", budget_s=1.0, warmup_s=0.3)
            c = m.clocks
            row = {"idle_s": idle, "run": i, "TFLOPs": flops / m.median / 1e12, "median_s": m.median, "n": m.n,
                   "TFLOPs_p10_sample": flops / m.p90 / 1e12, "TFLOPs_p90_sample": flops / m.p10 / 1e12,
                   "power_capped_fraction": c.get("power_capped_fraction"),
                   "thermal_capped_fraction": c.get("thermal_capped_fraction"),
                   "sm_mhz_before": c.get("sm_mhz_before"), "sm_mhz_after": c.get("sm_mhz_after"),
                   "sm_mhz_median_during": c.get("sm_mhz_median_during"),
                   "sm_mhz_min_during": c.get("sm_mhz_min_during"),
                   "throttled": m.throttled}
            rows.append(row)
            print(f"idle {idle:3.1f} s run {i}: {row['TFLOPs']:6.1f} TFLOP/s (samples p10-p90 "
                  f"{row['TFLOPs_p10_sample']:.0f}-{row['TFLOPs_p90_sample']:.0f}), power cap acted "
                  f"{row['power_capped_fraction']}, SM clock median while sampling {row['sm_mhz_median_during']} MHz",
                  flush=True)
    rates = [r["TFLOPs"] for r in rows]
    capped = [r["power_capped_fraction"] for r in rows if r["power_capped_fraction"] is not None]
    summary = {
        "runs": len(rows),
        "min_run_TFLOPs": min(rates), "median_run_TFLOPs": statistics.median(rates), "max_run_TFLOPs": max(rates),
        "spread_max_over_min": max(rates) / min(rates),
        "median_power_capped_fraction": statistics.median(capped) if capped else None,
        "min_power_capped_fraction": min(capped) if capped else None,
        "share_of_runs_flagged_throttled": sum(r["throttled"] for r in rows) / len(rows),
        "median_sm_mhz_during": statistics.median(r["sm_mhz_median_during"] or 0 for r in rows),
    }
    doc = make_results("matmul_power", params={"n": N, "dtype": "bf16", "runs_per_idle": RUNS, "idles_s": IDLES_S},
                       summary=summary, rows=rows,
                       notes=["each row is one bench() run (median of its samples); power_capped_fraction is the "
                              "share of its sampling during which NVML's power violation counter advanced"])
    path = write_results(doc, args.out)  # None: results/<gpu>
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in summary.items()})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
