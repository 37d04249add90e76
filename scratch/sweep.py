"""Scratch sweep (not committed): L2 flush variants on small copies / row_normalize; histogram counting variants."""
import json, os, sys, time
import numpy as np
import torch
import triton
import triton.language as tl

from gpuspeed import bench
from gpuspeed import device as D
from gpuspeed.examples.kernels import histogram as H
from gpuspeed.examples.kernels import row_normalize as RN

out = {}
OUT = os.environ.get("OUT", "/tmp")
gpu = torch.cuda.is_available()
dev = "cuda" if gpu else "cpu"


def log(*a):
    print(*a, flush=True)


def t(fn, flush, budget=0.6):
    m = bench(fn, mode="events", flush=flush, hide_launch_latency=True, budget_s=budget)
    return m.median


# ----------------------------------------------------------------------------- part A: flushes
if gpu and "A" in sys.argv[1:]:
    L2 = D.l2_bytes()
    log("L2 bytes", L2)
    wbuf = torch.empty(2 * L2, dtype=torch.int8, device="cuda")
    rbuf = torch.ones(2 * L2 // 4, dtype=torch.float32, device="cuda")
    rbuf3 = torch.ones(3 * L2 // 4, dtype=torch.float32, device="cuda")
    sink = torch.empty((), device="cuda")
    flushes = {
        "write": lambda: wbuf.fill_(1),
        "read": lambda: torch.sum(rbuf, dim=0, out=sink),
        "read3": lambda: torch.sum(rbuf3, dim=0, out=sink),
        "write+read": lambda: (wbuf.fill_(1), torch.sum(rbuf, dim=0, out=sink)),
        "none": False,
    }
    res = {}
    for mib in (4, 16, 32, 64, 256, 1024):
        a = torch.randn(mib * 2**20 // 4, device="cuda")
        b = torch.empty_like(a)
        for name, fl in flushes.items():
            s = t(lambda: b.copy_(a), fl)
            res[f"copy{mib}MiB/{name}"] = 2 * a.nbytes / s / 1e9
            log(f"copy {mib} MiB flush={name}: {s*1e6:.2f} us {2*a.nbytes/s/1e9:.0f} GB/s")
        del a, b
    rng = np.random.default_rng(0)
    x64 = torch.from_numpy(rng.standard_normal((4096, 1024))).cuda()
    x32 = x64.float()
    for name, fl in flushes.items():
        s = t(lambda: RN.normalize_rows_triton(x64), fl)
        res[f"rownorm64/{name}"] = 2 * x64.nbytes / s / 1e9
        s32 = t(lambda: RN.normalize_rows_triton_fp32(x32), fl)
        res[f"rownorm32/{name}"] = 2 * x32.nbytes / s32 / 1e9
        log(f"row_normalize flush={name}: fp64 {s*1e6:.2f} us {2*x64.nbytes/s/1e9:.0f} GB/s; fp32 {s32*1e6:.2f} us "
            f"{2*x32.nbytes/s32/1e9:.0f} GB/s")
    out["A"] = res


# ----------------------------------------------------------------------------- part B: histogram counting
@triton.jit
def hist_atomic_kernel(x_ptr, range_ptr, priv_ptr, n, bins, BINS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    lo = tl.load(range_ptr)
    hi = tl.load(range_ptr + 1)
    step = tl.load(range_ptr + 2)
    scale = bins / (hi - lo)
    offs0 = tl.arange(0, BLOCK)
    base = priv_ptr + pid * BINS
    for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + offs0
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        keep = (offs < n) & (x >= lo) & (x <= hi)
        idx = H._bin(tl.where(keep, x, lo), lo, step, scale, range_ptr, bins, True)
        tl.atomic_add(base + idx, 1, mask=keep, sem="relaxed")


@triton.jit
def hist_dot_kernel(x_ptr, range_ptr, out_ptr, n, bins, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    lo = tl.load(range_ptr)
    hi = tl.load(range_ptr + 1)
    step = tl.load(range_ptr + 2)
    scale = bins / (hi - lo)
    offs0 = tl.arange(0, BLOCK)
    r16 = tl.arange(0, 16)
    acc = tl.zeros((16, 16), dtype=tl.int32)
    for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + offs0
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        keep = (offs < n) & (x >= lo) & (x <= hi)
        idx = H._bin(tl.where(keep, x, lo), lo, step, scale, range_ptr, bins, True)
        idx = tl.where(keep, idx, 256)
        hb = idx >> 4
        lb = idx & 15
        a = (hb[None, :] == r16[:, None]).to(tl.int8)
        b = (lb[:, None] == r16[None, :]).to(tl.int8)
        acc = tl.dot(a, b, acc)
    tl.atomic_add(out_ptr + r16[:, None] * 16 + r16[None, :], acc)


@triton.jit
def loads_bin_only_kernel(x_ptr, range_ptr, out_ptr, n, bins, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    lo = tl.load(range_ptr)
    hi = tl.load(range_ptr + 1)
    step = tl.load(range_ptr + 2)
    scale = bins / (hi - lo)
    offs0 = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + offs0
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        keep = (offs < n) & (x >= lo) & (x <= hi)
        idx = H._bin(tl.where(keep, x, lo), lo, step, scale, range_ptr, bins, True)
        acc += tl.where(keep, idx, 0)
    tl.atomic_add(out_ptr + (pid % 256), tl.sum(acc, 0))


def run_atomic(x, bounds, bins, block, per_sm, warps):
    sms = H.sm_count(x.device.index or 0) if x.is_cuda else 4
    grid = max(1, min(triton.cdiv(x.numel(), block), sms * per_sm))
    priv = torch.zeros(grid * 256, dtype=torch.int32, device=x.device)
    hist_atomic_kernel[(grid,)](x, bounds, priv, x.numel(), bins, BINS=256, BLOCK=block, num_warps=warps,
                                enable_fp_fusion=False)
    return priv.view(grid, 256).sum(0, dtype=torch.int64)[:bins]


def run_dot(x, bounds, bins, block, per_sm, warps):
    sms = H.sm_count(x.device.index or 0) if x.is_cuda else 4
    grid = max(1, min(triton.cdiv(x.numel(), block), sms * per_sm))
    o = torch.zeros(256, dtype=torch.int32, device=x.device)
    hist_dot_kernel[(grid,)](x, bounds, o, x.numel(), bins, BLOCK=block, num_warps=warps, enable_fp_fusion=False)
    return o[:bins].to(torch.int64)


def run_loads(x, bounds, bins, block, per_sm, warps):
    sms = H.sm_count(x.device.index or 0) if x.is_cuda else 4
    grid = max(1, min(triton.cdiv(x.numel(), block), sms * per_sm))
    o = torch.zeros(256, dtype=torch.int32, device=x.device)
    loads_bin_only_kernel[(grid,)](x, bounds, o, x.numel(), bins, BLOCK=block, num_warps=warps,
                                   enable_fp_fusion=False)
    return o


if "B" in sys.argv[1:]:
    rng = np.random.default_rng(1)
    n = 50_000_000 if gpu else 5000
    xs = rng.standard_normal(n)
    ref = np.histogram(xs, 256, (-4.0, 4.0))[0]
    x = torch.from_numpy(xs).to(dev)
    lo, hi, edges, step, arith = H._edges_host(256, -4.0, 4.0)
    bounds = torch.tensor([lo, hi, step], dtype=torch.float64, device=dev)
    res = {}
    roof = 4125.75
    cands = {}
    for c in H.CONFIGS + [triton.Config({"BLOCK": b, "PER_SM": p}, num_warps=1, num_stages=1)
                          for b, p in ((256, 32), (512, 32), (1024, 16), (512, 16), (2048, 8), (1024, 32))] \
            + [triton.Config({"BLOCK": b, "PER_SM": p}, num_warps=2, num_stages=1)
               for b, p in ((1024, 16), (2048, 16), (4096, 8))]:
        cands[f"tlhist/{c}"] = (lambda c=c: H.histogram_triton(x, 256, -4.0, 4.0, config=c))
    for blk, per, w in ((1024, 8, 4), (2048, 8, 8), (512, 16, 4), (4096, 4, 8), (1024, 16, 8)):
        cands[f"atomic/{blk},{per},{w}"] = (lambda a=(blk, per, w): run_atomic(x, bounds, 256, *a))
    for blk, per, w in ((256, 8, 4), (512, 8, 4), (1024, 4, 4), (512, 8, 8), (1024, 8, 8), (2048, 4, 8)):
        cands[f"dot/{blk},{per},{w}"] = (lambda a=(blk, per, w): run_dot(x, bounds, 256, *a))
    for blk, per, w in ((2048, 16, 4), (4096, 8, 8)):
        cands[f"loadsonly/{blk},{per},{w}"] = (lambda a=(blk, per, w): run_loads(x, bounds, 256, *a))
    only = os.environ.get("ONLY")
    for name, fn in cands.items():
        if only and not name.startswith(only):
            continue
        try:
            got = fn().cpu().numpy()
            ok = name.startswith("loadsonly") or np.array_equal(got, ref)
            if not gpu:
                log(name, "exact" if ok else "WRONG")
                continue
            s = t(fn, True, budget=0.5)
            res[name] = {"us": s * 1e6, "pct": 8 * n / s / 1e9 / roof * 100, "exact": bool(ok)}
            log(f"{name}: {s*1e6:.1f} us {res[name]['pct']:.1f} % exact={ok}")
        except Exception as e:  # noqa
            log(name, "FAILED", str(e)[-1500:])
            res[name] = {"error": repr(e)[:300]}
    out["B"] = res

json.dump(out, open(os.path.join(OUT, "sweep.json"), "w"), indent=1)
