"""Run each planted workload through gpuspeed.profiling.profile and check the known answers.

Shared by the tests and benchmarks/profile_planted.py. Each row says what was planted, what the
profiler reported, and whether they agree. On a CPU only the host-side plants are checked.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gpuspeed.profiling import profile
from planted import workloads as w

HERE = str(Path(w.__file__).resolve())


def _row(name, expected, reported, found, **extra):
    return {"planted": name, "expected": expected, "reported": reported, "found": bool(found)} | extra


def check_item(device: str, steps: int = 3) -> list[dict]:
    x = torch.randn(64, device=device)
    res = profile(w.item_loop, x, steps=steps, device=device, hotspots=False)
    line = w.planted_line("item")
    groups = [g for g in res.findings["host_syncs"]["groups"] if g["kind"] == ".item()"]
    got = [(g["file"], g["line"], g["per_step"]) for g in groups]
    ok = got == [(HERE, line, w.ITEM_SYNCS)] and res.findings["host_syncs"]["total"] == w.ITEM_SYNCS * steps
    return [_row("item_syncs", f"{w.ITEM_SYNCS}/step at line {line}", got, ok)]


def check_scalar_syncs(device: str, steps: int = 3) -> list[dict]:
    """`if (x > 100).any():`, `int(t)`, `float(t)`, `bool(t)`, `while t.sum() > 0:`: each a host sync of its
    kind at its own line (on a CPU run, one that would sync on a GPU), and no sync anywhere else."""
    x = torch.randn(64, device=device)
    res = profile(w.scalar_syncs, x, steps=steps, device=device, hotspots=False)
    groups = res.findings["host_syncs"]["groups"]
    planted = {w.planted_line(tag) for tag in w.SCALAR_SYNCS}
    extra = [(g["kind"], g["line"], g["per_step"]) for g in groups if g["file"] != HERE or g["line"] not in planted]
    rows = []
    for tag, (kind, per_step) in w.SCALAR_SYNCS.items():
        line = w.planted_line(tag)
        got = [(g["kind"], g["per_step"]) for g in groups if g["file"] == HERE and g["line"] == line]
        rows.append(_row(f"sync_{tag}", f"{kind} {per_step}/step at line {line}", got,
                         got == [(kind, per_step)] and not extra, **({"elsewhere": extra} if extra else {})))
    return rows


def check_hotspot(device: str, n: int = 120, line_backend: str = "auto") -> list[dict]:
    a = np.random.default_rng(0).standard_normal((n, n))
    res = profile(w.python_hotspot, a, n, steps=1, warmup=0, device=device, line_backend=line_backend)
    loop_line, hot_line = w.planted_line("loop"), w.planted_line("hotline")
    loops = [(lp["file"], lp["line"], lp["depth"]) for lp in res.hotspots["hot_loops"]]
    fns = [f for f in res.hotspots["lines"]["functions"] if f["function"] == "python_hotspot"]
    hot = fns[0]["hot_line"] if fns else None
    verdict = res.hotspots["cprofile"]["verdict"]
    return [_row("python_loop_nest", f"depth-2 loop at line {loop_line}", loops, (HERE, loop_line, 2) in loops),
            _row("python_hot_line", f"line {hot_line}, interpreter-bound", [hot, verdict],
                 hot == hot_line and verdict.startswith("interpreter-bound"),
                 line_backend=res.hotspots["lines"]["backend"])]


def check_tiny(steps: int = 3) -> list[dict]:
    x = torch.randn(256, device="cuda")
    res = profile(w.tiny_kernels, x, steps=steps, hotspots=False)
    line = w.planted_line("tiny")
    runs = [(r["length"], r["runs_per_step"], r["file"], r["line"]) for r in res.findings["tiny_runs"]["runs"]]
    return [_row("tiny_kernel_run", f"1 run/step of {w.TINY_KERNELS} at line {line}", runs,
                 (w.TINY_KERNELS, 1.0, HERE, line) in runs)]


def check_transfers(mib: int = 64, steps: int = 3) -> list[dict]:
    n = mib * 2**20 // 4
    pageable = torch.randn(n)
    pinned = torch.randn(n).pin_memory()
    res = profile(w.transfers, pageable, pinned, steps=steps, hotspots=False)
    rows = res.findings["transfers"]["rows"]
    out = []
    for memory, tag in (("pageable", "pageable"), ("pinned", "pinned")):
        line = w.planted_line(tag)
        # bytes per step, not per record: the driver may split one copy into several records
        got = [(t["direction"], t["memory"], t["line"], t["bytes"] // steps, t["per_step"],
                round(t["GBps"] or 0, 1)) for t in rows if t["memory"] == memory]
        ok = any(g[:4] == ("H2D", memory, line, n * 4) for g in got)
        out.append(_row(f"h2d_{memory}", f"H2D {memory} {n * 4} bytes/step at line {line}", got, ok))
    return out


def check_big_kernel(n: int = 4096, steps: int = 3) -> list[dict]:
    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    small = torch.randn(1024, device="cuda")
    res = profile(w.big_kernel, a, b, small, steps=steps, hotspots=False)
    line = w.planted_line("matmul")
    top = res.findings["top_kernels"]["rows"][0]
    got = {"kernel": top["short"], "line": top["line"], "share": round(top["share"], 3),
           "calls_per_step": top["calls_per_step"]}
    ok = top["line"] == line and top["file"] == HERE and top["share"] >= 0.5 and top["calls_per_step"] == 1
    return [_row("dominant_kernel", f"1 call/step at line {line}, share >= 50%", got, ok)]


def run_all(device: str) -> list[dict]:
    """Every plant that this device can show; a crash in one is recorded in its row and the rest go on."""
    checks = [("item_syncs", lambda: check_item(device)), ("scalar_syncs", lambda: check_scalar_syncs(device)),
              ("python_hotspot", lambda: check_hotspot(device))]
    if device == "cuda":
        checks += [("tiny_kernel_run", check_tiny), ("transfers", check_transfers),
                   ("dominant_kernel", check_big_kernel)]
    rows = []
    for name, fn in checks:
        try:
            rows += fn()
        except Exception as exc:  # record and go on: the other plants' results still count
            rows.append(_row(name, "see error", None, False, error=f"{type(exc).__name__}: {exc}"))
    return rows
