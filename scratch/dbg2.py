import torch
from gpuspeed.timing import gpu, bench
import gpuspeed.timing.cuda as C

x = torch.randn(16, device="cuda")
a = torch.randn(1024, 1024, device="cuda")
_old_buf = torch.empty(2 * 62914560, dtype=torch.int8, device="cuda")
new_flush = gpu.flush_l2
def old_flush():
    _old_buf.fill_(1)

def adds(tag):
    for _ in range(3):
        m = bench(torch.add, x, x)
        print(tag, m.mode, round(m.median * 1e6, 2), m.calls_per_sample, flush=True)

adds("fresh/read")
gpu.flush_l2 = old_flush
adds("fresh/fill")
gpu.flush_l2 = new_flush
m = bench(torch.mm, a, a, mode="kernel", min_samples=3, max_samples=12, max_noise=1e-9, budget_s=5)
print("kernel mm", m.n, m.notes[0], flush=True)
adds("after-profiler/read")
gpu.flush_l2 = old_flush
adds("after-profiler/fill")
gpu.flush_l2 = new_flush
