"""Scratch: what each L2 flush leaves behind. Times (CUDA events, median of 30) a 16 MiB read of
 - B: the buffer written just before the flush (a previous call's output): fast if it survived, dirty or not
 - A: the buffer read just before the flush (a previous call's input)
 - C: a buffer untouched for a long time (cold), whose read must evict whatever the flush left (dirty lines cost)
and a 16 MiB copy C->D (read + write after the flush)."""
import json, os
import torch
from gpuspeed import device as D

L2 = D.l2_bytes()
n = 16 * 2**20 // 4
A, B, C, Dd = (torch.randn(n, device="cuda") for _ in range(4))
pool = [torch.randn(n, device="cuda") for _ in range(16)]  # 256 MiB of cold buffers, cycled
wbuf = torch.empty(2 * L2, dtype=torch.int8, device="cuda")
rbuf = torch.ones(2 * L2 // 4, device="cuda")
sink = torch.empty((), device="cuda")
flushes = {
    "write": lambda: wbuf.fill_(1),
    "read": lambda: torch.sum(rbuf, dim=0, out=sink),
    "write+read": lambda: (wbuf.fill_(1), torch.sum(rbuf, dim=0, out=sink)),
    "read+read": lambda: (torch.sum(rbuf, dim=0, out=sink), torch.sum(rbuf, dim=0, out=sink)),
    "none": lambda: None,
}
ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]


def timed(before, what, trials=30):
    ts = []
    for i in range(trials):
        before(i)
        ev[0].record()
        what(i)
        ev[1].record()
        torch.cuda.synchronize()
        ts.append(ev[0].elapsed_time(ev[1]) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


res = {}
for name, fl in flushes.items():
    def prev(i):  # a previous call: read A, write B; then the flush
        torch.sum(A, dim=0, out=sink)
        B.fill_(2.0)
        fl()
    r = {
        "read B (prev output)": timed(prev, lambda i: torch.sum(B, dim=0, out=sink)),
        "read A (prev input)": timed(prev, lambda i: torch.sum(A, dim=0, out=sink)),
        "read cold": timed(prev, lambda i: torch.sum(pool[i % 16], dim=0, out=sink)),
        "copy cold->D": timed(prev, lambda i: Dd.copy_(pool[i % 16])),
        "copy A->B (same call again)": timed(prev, lambda i: B.copy_(A)),
    }
    res[name] = r
    print(name, {k: round(v, 2) for k, v in r.items()}, flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "residue.json"), "w"), indent=1)
