"""Recommendations keyed to the findings: each names the finding, the fix and the source line."""

from __future__ import annotations

IDLE_SHARE = 0.30  # a GPU idle for more than this share of the window, mostly waiting on the host, is launch-bound
HOST_SHARE_OF_IDLE = 0.50


def _at(row: dict) -> str:
    return f"{row['file']}:{row['line']}" if row.get("file") else "(line not in the trace)"


def recommend(findings: dict, hotspots: dict | None) -> list[dict]:
    """A list of {finding, text, where}: most costly first as the findings order them."""
    recs = []
    bi = findings.get("busy_idle")
    if bi and (bi["idle_share"] or 0) > IDLE_SHARE and (bi["idle_host_share"] or 0) > HOST_SHARE_OF_IDLE:
        recs.append({"finding": "launch_bound", "where": None,
                     "text": (f"The GPU is idle {100 * bi['idle_share']:.0f}% of the window, "
                              f"{100 * bi['idle_host_share']:.0f}% of that waiting on the host: the run is "
                              "launch-bound. Capture the step in a CUDA graph (gpuspeed.timing.record_graph, or "
                              "torch.compile(mode='reduce-overhead')) so one launch replays every kernel.")})
    for run in (findings.get("tiny_runs") or {}).get("runs", [])[:3]:
        recs.append({"finding": "tiny_kernels", "where": _at(run),
                     "text": (f"{run['runs_per_step']:g} run(s) per step of {run['length']} kernels, each shorter "
                              f"than its launch, at {_at(run)}: fuse them (torch.compile, or one Triton kernel) "
                              "so one launch does the work of many.")})
    for g in (findings.get("host_syncs") or {}).get("groups", [])[:5]:
        blocking = "blocks the host" if findings.get("gpu") else "would block the host on a GPU tensor"
        recs.append({"finding": "host_sync", "where": _at(g),
                     "text": (f"{g['kind']} at {_at(g)} {blocking} {g['per_step']:g}x per step: keep the value "
                              "on the GPU (tensor ops, torch.where) or read it once after the loop.")})
    for t in (findings.get("transfers") or {}).get("rows", []):
        if t["memory"] == "pageable" and t["direction"] in ("H2D", "D2H"):
            recs.append({"finding": "pageable_transfer", "where": _at(t),
                         "text": (f"{t['direction']} copy of {t['bytes'] / t['count'] / 2**20:.1f} MiB from pageable "
                                  f"memory at {_at(t)} ({t['GBps'] or 0:.1f} GB/s): allocate the host buffer with "
                                  "pin_memory() and copy with non_blocking=True.")})
    for loop in (hotspots or {}).get("hot_loops", [])[:3]:
        recs.append({"finding": "python_loop", "kind": loop.get("kind"), "where": f"{loop['file']}:{loop['line']}",
                     "text": (f"Loop nest (depth {loop['depth']}) at {loop['file']}:{loop['line']} takes "
                              f"{100 * loop['share']:.0f}% of the host time: {loop['verdict']}.")})
    return recs
