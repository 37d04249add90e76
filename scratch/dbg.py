import time, torch
from torch.profiler import ProfilerActivity, profile
from gpuspeed.timing import kernel as K, gpu, bench

a = torch.randn(1024, 1024, device="cuda")
print("lead", K.flush_activity_count())
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        K.place_marker(); gpu.flush_l2(); torch.mm(a, a)
    torch.cuda.synchronize()
for e in K.device_activities(prof):
    print(round(e.time_range.elapsed_us(), 1), str(e.device_type), e.name[:150])
# flush cost: host issue time and GPU time
torch.cuda.synchronize()
for name, f in (("read", gpu.flush_l2), ("fill", lambda: torch.empty(2 * 62914560, dtype=torch.int8, device="cuda").fill_(1))):
    f(); torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter(); 
    for _ in range(100): f()
    host = (time.perf_counter() - t0) / 100
    torch.cuda.synchronize(); s.record(); f(); e.record(); torch.cuda.synchronize()
    print(name, "host us", host * 1e6, "gpu us", s.elapsed_time(e) * 1e3)
m = bench(torch.mm, a, a, mode="kernel", min_samples=3, max_samples=12, max_noise=1e-9, budget_s=5)
print(m.n, m.median, m.notes)
x = torch.randn(16, device="cuda")
m = bench(torch.add, x, x)
print(m.mode, m.median, m.notes)
