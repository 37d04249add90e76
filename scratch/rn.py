"""Scratch: row_normalize float32 configs, timed as kernel_report times them (events, hide_launch_latency)."""
import itertools, numpy as np, torch, triton
from gpuspeed import bench
from gpuspeed.examples.kernels import row_normalize as RN

x = torch.from_numpy(np.random.default_rng(0).standard_normal((4096, 1024))).cuda().float()
out = torch.empty_like(x)
res = []
for rows, w, s in itertools.product((1, 2, 4, 8, 16), (1, 2, 4, 8, 16), (1, 2)):
    if rows * 1024 // (32 * w) < 4 or rows * 1024 // (32 * w) > 128:
        continue
    cfg = triton.Config({"ROWS": rows}, num_warps=w, num_stages=s)
    try:
        m = bench(lambda: RN.normalize_rows_triton_fp32(x, config=cfg, out=out), mode="events", hide_launch_latency=True,
                  budget_s=0.4)
        res.append((m.median * 1e6, rows, w, s))
    except Exception as e:
        print(rows, w, s, "failed", repr(e)[:100])
b = torch.empty_like(x)
m = bench(lambda: b.copy_(x), mode="events", hide_launch_latency=True, budget_s=0.4)
print("copy", round(m.median * 1e6, 2))
m = bench(lambda: RN.normalize_rows_triton_fp32(x, out=out), mode="events", hide_launch_latency=True, budget_s=0.4)
print("autotuned", round(m.median * 1e6, 2))
for r in sorted(res)[:14]:
    print(f"{r[0]:.2f} us ROWS={r[1]} warps={r[2]} stages={r[3]}")
