"""Read a torch.profiler Chrome trace into findings: busy/idle, launch gaps, tiny kernels, syncs, transfers.

Host events (Python frames, ATen ops, CUDA runtime calls) are nested per thread by time; device events
(kernels, copies, memsets) are tied to the runtime call that launched them by their correlation id.
Every finding is placed at the user's file:line through the innermost user frame above it (`sites`).
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from gpuspeed.profiling.sites import Sites, callee_key, op_key_of

STEP_PREFIX = "gpuspeed.step"
TINY_RUN_MIN = 8  # a run of at least this many consecutive launch-bound kernels is a finding
HOST_CATS = {"python_function", "cpu_op", "cuda_runtime", "cuda_driver", "user_annotation"}
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
LAUNCH_APIS = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
               "cudaLaunchCooperativeKernel", "cudaMemcpyAsync", "cudaMemsetAsync", "cudaGraphLaunch",
               "cudaMemcpy", "cudaMemset", "cudaMemcpy2DAsync", "cuMemcpyAsync", "cuMemsetD8Async",
               "cuMemsetD32Async"}
SYNC_APIS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
             "cudaMemcpy2D", "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH",
             "cuMemcpy"}
# calls that block the host on a GPU tensor: on a CPU-only trace they are reported as "would sync"
_SYNC_PRONE = re.compile(r"<built-in method (item|tolist|cpu|numpy) of Tensor|"
                         r"_tensor\.py\(\d+\): (__repr__|__format__|__str__)")
# ATen ops that copy a value to the host (`if t:`, `int(t)`, `float(t)`, `x[mask]`): on a GPU tensor each
# waits for the GPU; on a CPU-only trace they are reported as "would sync"
SYNC_OPS = {"aten::is_nonzero", "aten::item", "aten::_local_scalar_dense", "aten::nonzero"}
_EPS = 0.002  # us: tolerance for rounding in nested timestamps
_GAP_BUCKETS_US = (1, 5, 20, 100, 1000)


class Node:
    """One host event, with its parent on the same thread."""

    __slots__ = ("i", "name", "cat", "ts", "dur", "end", "args", "tid", "parent", "step", "_user")

    def __init__(self, i, e):
        self.i, self.name, self.cat = i, e.get("name", ""), e.get("cat")
        self.ts, self.dur = float(e["ts"]), float(e.get("dur", 0.0))
        self.end = self.ts + self.dur
        self.args = e.get("args") or {}
        self.tid = (e.get("pid"), e.get("tid"))
        self.parent = None
        self.step = None
        self._user = False  # (F, C) once looked up


def load_trace(path) -> dict:
    """A Chrome trace from .json or .json.gz."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt") as f:
        return json.load(f)


def _nest(nodes: list[Node]) -> None:
    by_thread = defaultdict(list)
    for n in nodes:
        by_thread[n.tid].append(n)
    for thread in by_thread.values():
        thread.sort(key=lambda n: (n.ts, -n.dur))
        stack: list[Node] = []
        for n in thread:
            while stack and not (n.ts >= stack[-1].ts - _EPS and n.end <= stack[-1].end + _EPS):
                stack.pop()
            n.parent = stack[-1] if stack else None
            stack.append(n)


def _pct(x, q):
    return float(np.percentile(x, q)) if len(x) else None


class TraceAnalysis:
    """Findings from one trace. `sites` places events at source lines; `steps` is the profiled step count."""

    def __init__(self, trace: dict, sites: Sites | None = None, steps: int | None = None):
        self.sites = sites or Sites()
        events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
        self.host = [Node(i, e) for i, e in enumerate(events) if e.get("cat") in HOST_CATS]
        _nest(self.host)
        self.device = [e for e in events if e.get("cat") in DEVICE_CATS]
        self.sync_events = [e for e in events if e.get("cat") == "cuda_sync"]
        self.steps_ann = sorted((n for n in self.host if n.cat == "user_annotation" and
                                 n.name.startswith(STEP_PREFIX)), key=lambda n: n.ts)
        self.steps = steps or max(len(self.steps_ann), 1)
        for n in self.host:
            p = n
            while p is not None and not (p.cat == "user_annotation" and p.name.startswith(STEP_PREFIX)):
                p = p.parent
            n.step = int(p.name[len(STEP_PREFIX):]) if p is not None else None
        self.launch_by_corr = {}
        for n in self.host:
            if n.cat in ("cuda_runtime", "cuda_driver") and "correlation" in n.args:
                self.launch_by_corr[n.args["correlation"]] = n
        self.gpu = bool(self.device) or any(n.cat == "cuda_runtime" for n in self.host)
        # device events launched inside the profiled steps (or all of them when the trace has no steps)
        self.ops = []
        for e in self.device:
            launch = self.launch_by_corr.get((e.get("args") or {}).get("correlation"))
            step = launch.step if launch is not None else None
            if self.steps_ann and step is None:
                continue
            self.ops.append({"name": e.get("name", ""), "cat": e["cat"], "ts": float(e["ts"]),
                             "dur": float(e.get("dur", 0.0)), "end": float(e["ts"]) + float(e.get("dur", 0.0)),
                             "stream": (e.get("args") or {}).get("stream", e.get("tid")), "args": e.get("args") or {},
                             "launch": launch, "step": step})
        self.ops.sort(key=lambda o: o["ts"])

    # -- placing events at source lines -------------------------------------------------------------

    def user_call(self, node: Node | None):
        """(F, C): the innermost user frame above `node` and the node just under it on the chain."""
        if node is None:
            return None, None
        if node._user is not False:
            return node._user
        child, p = None, node
        while p is not None:
            if p.cat == "python_function" and callee_key(p.name) in self.sites.user_funcs:
                break
            child, p = p, p.parent
        node._user = (p, child) if p is not None else (None, None)
        return node._user

    def where(self, node: Node | None) -> dict:
        f, c = self.user_call(node)
        if f is None:
            return {"file": None, "line": None, "function": None}
        ckey = None if c is None else self._ckey(c)
        ordinal = self._ordinals(f).get(c.i) if c is not None else None
        path, line, lines = self.sites.where(callee_key(f.name), ckey, ordinal)
        return {"file": path, "line": line, "function": callee_key(f.name).split(": ", 1)[-1],
                "lines": {str(k): v for k, v in sorted(lines.items())} if len(lines) > 1 else None,
                "code": self.sites.source_line(path, line)}

    @staticmethod
    def _ckey(c: Node) -> str:
        return op_key_of(c.name) if c.cat == "cpu_op" else callee_key(c.name)

    def _ordinals(self, f: Node) -> dict:
        """child.i -> (k, n): the child is the k-th of n children of f with its callee key."""
        cache = self.__dict__.setdefault("_ord", {})
        if f.i not in cache:
            groups = defaultdict(list)
            for k in self._kids(f):
                groups[self._ckey(k)].append(k.i)
            cache[f.i] = {i: (j, len(ids)) for ids in groups.values() for j, i in enumerate(ids)}
        return cache[f.i]

    def _kids(self, f: Node) -> list:
        """Direct children of a host event, in time order (built once)."""
        if not hasattr(self, "_children"):
            self._children = defaultdict(list)
            for n in sorted(self.host, key=lambda n: n.ts):
                if n.parent is not None:
                    self._children[n.parent.i].append(n)
        return self._children.get(f.i, [])

    # -- findings ------------------------------------------------------------------------------------

    def window(self) -> tuple[float, float]:
        if self.steps_ann:
            t0, t1 = self.steps_ann[0].ts, max(n.end for n in self.steps_ann)
        else:
            pts = [n.ts for n in self.host] + [o["ts"] for o in self.ops]
            ends = [n.end for n in self.host] + [o["end"] for o in self.ops]
            t0, t1 = (min(pts), max(ends)) if pts else (0.0, 0.0)
        if self.ops:
            t1 = max(t1, max(o["end"] for o in self.ops))
        return t0, t1

    def busy_idle(self) -> dict | None:
        if not self.ops:
            return None
        t0, t1 = self.window()
        merged: list[list[float]] = []
        for o in self.ops:
            s, e = max(o["ts"], t0), min(o["end"], t1)
            if e <= s:
                continue
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        busy = sum(e - s for s, e in merged)
        starts = [o["ts"] for o in self.ops]
        host_wait = 0.0
        prev_end = t0
        for s, e in merged + [[t1, t1]]:
            if s > prev_end:  # idle interval [prev_end, s]: was the next piece of work issued yet?
                nxt = self.ops[min(int(np.searchsorted(starts, s - _EPS)), len(self.ops) - 1)]
                issued = nxt["launch"].ts if nxt["launch"] is not None else prev_end
                host_wait += max(0.0, min(issued, s) - prev_end) if s < t1 else s - prev_end
            prev_end = max(prev_end, e)
        window = t1 - t0
        idle = max(window - busy, 0.0)
        return {"window_s": window * 1e-6, "busy_s": busy * 1e-6, "idle_s": idle * 1e-6,
                "busy_share": busy / window if window > 0 else None,
                "idle_share": idle / window if window > 0 else None,
                "idle_host_s": host_wait * 1e-6, "idle_other_s": max(idle - host_wait, 0.0) * 1e-6,
                "idle_host_share": host_wait / idle if idle > 0 else None}

    def launch_gaps(self, top: int = 5) -> dict | None:
        if not self.ops:
            return None
        by_stream = defaultdict(list)
        for o in self.ops:
            by_stream[o["stream"]].append(o)
        gaps = []
        for ops in by_stream.values():
            for a, b in zip(ops, ops[1:], strict=False):
                g = b["ts"] - a["end"]
                if g > 0:
                    gaps.append((g, a, b))
        us = np.array([g for g, _, _ in gaps])
        hist, lo = {}, 0
        for hi in _GAP_BUCKETS_US:
            hist[f"{lo}-{hi}us"] = int(((us >= lo) & (us < hi)).sum())
            lo = hi
        hist[f">={lo}us"] = int((us >= lo).sum())
        largest = []
        for g, a, b in sorted(gaps, key=lambda t: -t[0])[:top]:
            row = {"gap_s": g * 1e-6, "after": a["name"][:80], "before": b["name"][:80], "step": b["step"]}
            launch = b["launch"]
            if launch is not None:
                late = launch.ts - a["end"]
                row["host_late_s"] = max(late, 0.0) * 1e-6
                row["cause"] = self._host_work(launch.tid, a["end"], launch.ts) if late > 0 else {
                    "what": "issued before the GPU went idle (dependency or launch latency)"}
                row["next_launched_at"] = self.where(launch)
            largest.append(row)
        return {"count": len(gaps), "total_s": float(us.sum()) * 1e-6,
                "p50_us": _pct(us, 50), "p90_us": _pct(us, 90), "p99_us": _pct(us, 99),
                "max_us": float(us.max()) if len(us) else None, "histogram": hist, "largest": largest}

    def _host_work(self, tid, t0: float, t1: float) -> dict:
        """The user-level call that took most of the host time in [t0, t1] on thread tid."""
        best, best_overlap = None, 0.0
        span = max(t1 - t0, 1e-9)
        for n in self.host:
            if n.tid != tid or n.end <= t0 or n.ts >= t1 or n.cat == "user_annotation":
                continue
            f, c = self.user_call(n)
            if c is not n:
                continue
            ov = min(n.end, t1) - max(n.ts, t0)
            if ov > best_overlap:
                best, best_overlap = n, ov
        if best is None or best_overlap < 0.3 * span:
            f = None
            for n in self.host:  # the user frame the host was in: Python code between calls
                if n.tid == tid and n.ts <= t0 and n.end >= t1 and n.cat == "python_function" and \
                        callee_key(n.name) in self.sites.user_funcs:
                    f = n
            where = {}
            if f is not None:
                info = self.sites.user_funcs[callee_key(f.name)]
                where = {"file": info[0], "line": info[1], "function": info[2]}
            return {"what": "Python code between GPU calls", **where, "overlap_s": None}
        return {"what": _short(best.name), **self.where(best), "overlap_s": best_overlap * 1e-6}

    def _launch_cost(self) -> dict:
        """Host time to issue each launch: from the end of the previous launch call on its thread (or the
        start of its step, for the first one) to the end of this one."""
        step_start = {int(a.name[len(STEP_PREFIX):]): a.ts for a in self.steps_ann}
        per_thread = defaultdict(list)
        for n in self.host:
            if n.cat in ("cuda_runtime", "cuda_driver") and n.name in LAUNCH_APIS:
                per_thread[n.tid].append(n)
        cost = {}
        for launches in per_thread.values():
            launches.sort(key=lambda n: n.ts)
            for k, n in enumerate(launches):
                if k and launches[k - 1].step == n.step:
                    cost[n.i] = n.end - launches[k - 1].end
                elif n.step in step_start:
                    cost[n.i] = n.end - step_start[n.step]
                else:
                    cost[n.i] = n.dur
        return cost

    def tiny_runs(self) -> dict | None:
        kernels = [o for o in self.ops if o["cat"] == "kernel" and o["launch"] is not None]
        if not kernels:
            return None
        cost = self._launch_cost()
        by_stream = defaultdict(list)
        for o in kernels:
            by_stream[o["stream"]].append(o)
        runs = []
        for ops in by_stream.values():
            cur: list = []
            for o in ops + [None]:
                tiny = o is not None and o["dur"] < cost.get(o["launch"].i, 0.0)
                if tiny and cur and cur[-1]["step"] != o["step"]:
                    tiny_break = True
                else:
                    tiny_break = False
                if not tiny or tiny_break:
                    if len(cur) >= TINY_RUN_MIN:
                        runs.append(cur)
                    cur = [o] if tiny else []
                else:
                    cur.append(o)
        groups: dict = {}
        for run in runs:
            places = Counter()
            for o in run:
                w = self.where(o["launch"])
                places[(w["file"], w["line"], w.get("code", ""))] += 1
            key = (len(run), tuple(sorted(places)))
            g = groups.setdefault(key, {"length": len(run), "runs": 0, "kernel_s": 0.0, "host_s": 0.0,
                                        "kernels": Counter(), "sites": places})
            g["runs"] += 1
            g["kernel_s"] += sum(o["dur"] for o in run) * 1e-6
            g["host_s"] += (run[-1]["launch"].end - run[0]["launch"].ts) * 1e-6
            g["kernels"].update(_short(o["name"]) for o in run)
        out = []
        for g in sorted(groups.values(), key=lambda g: -g["host_s"]):
            (file, line, code), _ = g["sites"].most_common(1)[0]
            out.append({"length": g["length"], "runs": g["runs"], "runs_per_step": g["runs"] / self.steps,
                        "kernel_s": g["kernel_s"], "host_s": g["host_s"], "file": file, "line": line, "code": code,
                        "lines": sorted({ln for (_, ln, _) in g["sites"] if ln}),
                        "kernels": [k for k, _ in g["kernels"].most_common(3)]})
        n_tiny = sum(1 for o in kernels if o["dur"] < cost.get(o["launch"].i, 0.0))
        return {"runs": out, "total_runs": len(runs), "tiny_kernels": n_tiny, "kernels": len(kernels)}

    def host_syncs(self) -> dict:
        """Calls that block the host until the GPU catches up, grouped by kind and source line."""
        occurrences: dict = {}
        if self.gpu:
            markers = [n for n in self.host if n.cat in ("cuda_runtime", "cuda_driver") and n.name in SYNC_APIS]
        else:
            markers = [n for n in self.host if (n.cat == "python_function" and _SYNC_PRONE.search(n.name))
                       or (n.cat == "cpu_op" and n.name in SYNC_OPS and not _value_read(n))]
        for m in markers:
            if self.steps_ann and m.step is None:
                continue
            f, c = self.user_call(m)
            if f is None:
                continue
            key = c.i if c is not None else m.i
            occ = occurrences.setdefault(key, {"node": c or m, "frame": f, "marker_chain": [], "wait_us": 0.0})
            occ["wait_us"] += m.dur if self.gpu else 0.0
            p = m
            while p is not None and p is not f:
                occ["marker_chain"].append(p.name)
                p = p.parent
        groups: dict = {}
        for occ in occurrences.values():
            w = self.where(occ["node"])
            kind = self._conversion_kind(occ["node"], occ["frame"], w["line"]) or \
                _sync_kind(occ["node"].name, occ["marker_chain"])
            key = (kind, w["file"], w["line"])
            g = groups.setdefault(key, {"kind": kind, **{k: w.get(k) for k in ("file", "line", "function", "code")},
                                        "count": 0, "wait_s": 0.0})
            g["count"] += 1
            g["wait_s"] += occ["wait_us"] * 1e-6
        if not self.gpu:  # x.cpu().numpy(): one copy to the host on a GPU tensor (.numpy() refuses one), not two
            for (kind, file, line), g in list(groups.items()):
                cpu = groups.get((".cpu()", file, line))
                if kind == ".numpy()" and cpu is not None:
                    g["count"] -= min(g["count"], cpu["count"])
                    if not g["count"]:
                        del groups[(kind, file, line)]
        rows = sorted(groups.values(), key=lambda g: (-g["wait_s"], -g["count"]))
        for g in rows:
            g["per_step"] = g["count"] / self.steps
            if not self.gpu:  # nothing ran on a GPU to wait for: 0.0 read as a free sync in --json
                g["wait_s"] = None
        api = Counter(m.name for m in markers if not self.steps_ann or m.step is not None) if self.gpu else Counter()
        return {"device_syncs": self.gpu, "total": sum(g["count"] for g in rows), "groups": rows,
                "api_calls": dict(api), "sync_events": len(self.sync_events)}

    def _conversion_kind(self, node: Node, frame: Node, line: int | None) -> str | None:
        """'bool(tensor)', 'int(tensor)', ...: a tensor turned into a Python value by the user's line itself
        (the ATen op sits straight under the user frame, with no Python call between)."""
        if node.cat != "cpu_op":
            return None
        if node.name == "aten::is_nonzero":
            return "bool(tensor)"
        if node.name in ("aten::item", "aten::_local_scalar_dense"):
            return self.sites.conversion_kind(callee_key(frame.name), line) or "int/float(tensor)"
        return None

    def transfers(self) -> dict | None:
        copies = [o for o in self.ops if o["cat"] == "gpu_memcpy"]
        if not copies:
            return None if not self.gpu else {"rows": [], "h2d_bytes": 0, "d2h_bytes": 0}
        groups: dict = {}
        for o in copies:
            direction, memory = _copy_kind(o["name"])
            w = self.where(o["launch"])
            key = (direction, memory, w["file"], w["line"])
            g = groups.setdefault(key, {"direction": direction, "memory": memory, "file": w["file"],
                                        "line": w["line"], "code": w.get("code"), "count": 0, "bytes": 0,
                                        "time_s": 0.0})
            g["count"] += 1
            g["bytes"] += int(o["args"].get("bytes", 0) or 0)
            g["time_s"] += o["dur"] * 1e-6
        rows = sorted(groups.values(), key=lambda g: -g["time_s"])
        for g in rows:
            g["GBps"] = g["bytes"] / g["time_s"] / 1e9 if g["time_s"] > 0 else None
            g["per_step"] = g["count"] / self.steps
        return {"rows": rows, "h2d_bytes": sum(g["bytes"] for g in rows if g["direction"] == "H2D"),
                "d2h_bytes": sum(g["bytes"] for g in rows if g["direction"] == "D2H"),
                "pageable_bytes": sum(g["bytes"] for g in rows if g["memory"] == "pageable")}

    def top_kernels(self, top: int = 10) -> dict | None:
        kernels = [o for o in self.ops if o["cat"] == "kernel"]
        if not kernels:
            return None
        total = sum(o["dur"] for o in kernels)
        groups: dict = {}
        for o in kernels:
            g = groups.setdefault(o["name"], {"name": o["name"], "calls": 0, "time_s": 0.0, "places": Counter()})
            g["calls"] += 1
            g["time_s"] += o["dur"] * 1e-6
            if o["launch"] is not None and len(g["places"]) < 50:
                w = self.where(o["launch"])
                g["places"][(w["file"], w["line"])] += 1
        rows = []
        for g in sorted(groups.values(), key=lambda g: -g["time_s"])[:top]:
            (file, line), _ = g.pop("places").most_common(1)[0] if g["places"] else ((None, None), 0)
            rows.append(g | {"short": _short(g["name"]), "share": g["time_s"] / (total * 1e-6) if total else None,
                             "calls_per_step": g["calls"] / self.steps, "mean_us": g["time_s"] / g["calls"] * 1e6,
                             "file": file, "line": line, "code": self.sites.source_line(file, line)})
        return {"total_s": total * 1e-6, "count": len(kernels), "rows": rows}

    def top_ops(self, top: int = 10) -> list:
        """Host time by outermost ATen op of the profiled steps (what a CPU run has instead of kernels), each at
        the user's line that called it. An op with no user frame above it (a library nn.Module given as the
        function, torch.nn.Linear, whose forward is all torch's code) is still the function's: its row has no
        file (it was left out, and such a module's profile had no op table at all)."""
        groups: dict = {}
        for n in self.host:
            if n.cat != "cpu_op" or (n.parent is not None and n.parent.cat == "cpu_op"):
                continue
            if self.steps_ann and n.step is None:
                continue
            w = self.where(n)
            g = groups.setdefault((n.name, w["file"], w["line"]), {"name": n.name, "file": w["file"],
                                                                   "line": w["line"], "calls": 0, "time_s": 0.0})
            g["calls"] += 1
            g["time_s"] += n.dur * 1e-6
        rows = sorted(groups.values(), key=lambda g: -g["time_s"])[:top]
        for g in rows:
            g["calls_per_step"] = g["calls"] / self.steps
            g["time_per_step_s"] = g["time_s"] / self.steps  # time_s is all the profiled steps'
        return rows

    def op_lines(self) -> set:
        """(file, line) of every user line that called an ATen op in the profiled steps: lines of array work,
        whatever their source looks like (`x = x * 0.5 + 1` on a tensor calls no torch function by name)."""
        out = set()
        for n in self.host:
            if n.cat == "cpu_op" and (n.parent is None or n.parent.cat != "cpu_op") and n.name not in _ELEMENT_OPS \
                    and not (self.steps_ann and n.step is None):
                w = self.where(n)
                if w["file"] and w["line"]:
                    out.add((os.path.realpath(w["file"]), w["line"]))
        return out

    def findings(self) -> dict:
        return {"gpu": self.gpu, "steps": self.steps, "busy_idle": self.busy_idle(),
                "launch_gaps": self.launch_gaps(), "tiny_runs": self.tiny_runs(), "host_syncs": self.host_syncs(),
                "transfers": self.transfers(), "top_kernels": self.top_kernels(), "top_ops": self.top_ops()}


# one element read from a tensor (t[i], t[i].item(), `if t[i]:`): a scalar loop over a tensor, not array work
_ELEMENT_OPS = {"aten::select", "aten::item", "aten::_local_scalar_dense", "aten::is_nonzero"}


def _short(name: str) -> str:
    name = re.sub(r" at 0x[0-9a-fA-F]+", "", name)
    m = re.match(r"<built-in (?:method|function) (\w+)", name)
    if m:
        return m.group(1)
    return name if len(name) <= 60 else name[:57] + "..."


def _value_read(node: Node) -> bool:
    """`x[mask] = 0.0`: index_put_ reads its one-element value with item() to take masked_fill_, and that value is
    a host tensor (torch puts a Python scalar stored into a CUDA tensor on the CPU), so no GPU wait."""
    p = node.parent
    while p is not None and p.name in ("aten::item", "aten::_local_scalar_dense"):
        p = p.parent
    return node.name in ("aten::item", "aten::_local_scalar_dense") and p is not None and \
        p.name == "aten::_index_put_impl_"


def _sync_kind(call: str, chain: list[str]) -> str:
    names = " ".join([call] + chain)
    if "built-in function print" in call or re.search(r"__repr__|__format__|__str__|_tensor_str", names):
        return "print(tensor)"
    for method, kind in (("item", ".item()"), ("tolist", ".tolist()"), ("cpu", ".cpu()"), ("numpy", ".numpy()"),
                         ("to", ".to(cpu)"), ("__bool__", "bool(tensor)")):
        if re.search(rf"<built-in method {method} of Tensor", call):
            return kind
    if "synchronize" in call:
        return "torch.cuda.synchronize()"
    if "aten::nonzero" in chain and call in ("aten::index", "aten::index_put_", "aten::_index_put_impl_"):
        # x[mask] / x[mask] = v: the size of the result is the mask's count, read back to the host
        return "boolean-mask assignment" if "index_put" in call else "boolean-mask indexing"
    ops = [n for n in chain if n.startswith("aten::")]
    return f"{_short(call)} ({ops[-1]})" if ops else _short(call)


def _copy_kind(name: str) -> tuple[str, str]:
    m = re.search(r"Memcpy (\w+)", name)
    raw = m.group(1) if m else "?"
    direction = {"HtoD": "H2D", "DtoH": "D2H", "DtoD": "D2D", "HtoH": "H2H", "PtoP": "P2P"}.get(raw, raw)
    memory = "pageable" if "Pageable" in name else "pinned" if "Pinned" in name else "device"
    return direction, memory
