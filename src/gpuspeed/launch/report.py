"""The launch study's report: Markdown tables, the two-panel PNG, and writing both beside launch.json."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpuspeed.launch.fusion import format_n
from gpuspeed.launch.sweep import err_text


def fmt(v, spec=".3g") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        return format(v, spec)
    return str(v)


def to_markdown(doc: dict) -> str:
    s, p = doc["summary"], doc["params"]
    dev = doc["device"].get("name", "?")
    lines = [f"# Launch overhead and fusion on {dev}", "",
             f"git {doc.get('git')}, {doc.get('created')}; torch {doc['versions'].get('torch')}", "",
             "| summary | value | target |", "|---|---|---|"]
    for key, val in s.items():
        if key.endswith("_target_met"):
            continue
        t = p.get("targets", {}).get(key, "")
        met = s.get(f"{key}_target_met")
        mark = "" if met is None or not t else (" (met)" if met else " (MISSED)")
        lines.append(f"| {key} | {fmt(val)} | {t}{mark} |")
    lines += ["", "## Fits: T(K) = fixed + per_launch * K", "", "| series | fixed us | per launch us | R^2 |",
              "|---|---|---|---|"]
    for name, f in p.get("fits", {}).items():
        # two K values fit exactly: no residual, so no error estimate (NaN, written as null)
        lines.append(f"| {name} | {fmt(f['fixed_us'], '.2f')} ± {fmt(f['fixed_err_us'], '.2f')} | "
                     f"{fmt(f['per_us'], '.3f')} ± {fmt(f['per_err_us'], '.3f')} | {fmt(f['r2'], '.4f')} |")
    lines += ["", "## Tiny-kernel sweep (us per launch)", ""]
    sweep = [r for r in doc["rows"] if r["study"] == "sweep"]
    series = list(dict.fromkeys(r["variant"] for r in sweep))
    lines += ["| K | " + " | ".join(series) + " |", "|---" * (len(series) + 1) + "|"]
    for k in p["ks"]:
        cells = []
        for sname in series:
            r = next((r for r in sweep if r["variant"] == sname and r["K"] == k), None)
            cells.append(fmt(r.get("us_per_launch")) if r and "error" not in r else "err")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines += ["", f"## {p['tiny_k']}-op chain on {p['tiny_n']} elements", "",
              "| variant | time us | us/op | check | error |", "|---|---|---|---|---|"]
    for r in (r for r in doc["rows"] if r["study"] == "chain"):
        why = r.get("error") or (f"skipped: {r['skipped']}" if r.get("skipped") else "")  # not four bare dashes
        lines.append(f"| {r['variant']} | {fmt(r.get('time_s') and r['time_s'] * 1e6)} | {fmt(r.get('us_per_op'))} "
                     f"| {fmt(r.get('check_passed'))} | {why} |")
    lines += ["", f"## Fusion: {p['chain_k']} elementwise ops over N fp32 elements", "",
              "| N | variant | time us | bytes | GB/s | % copy roof | x copy | check | reliable | error |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in (r for r in doc["rows"] if r["study"] == "fusion"):
        why = "; ".join(r.get("unreliable_why", []))
        reliable = f"no: {why}" if r.get("unreliable") else ("yes" if "time_s" in r else "-")
        lines.append(f"| {format_n(r['N'])} | {r['variant']} | {fmt(r.get('median_us'))} | {r['bytes']:.3g} | "
                     f"{fmt(r.get('GBps'))} | {fmt(r.get('pct_copy_roof'), '.1f')} | {fmt(r.get('over_copy'))} "
                     f"| {fmt(r.get('check_passed'))} | {reliable} | {r.get('error', '')} |")
    lines += ["", "## Notes", ""] + [f"- {n}" for n in doc["notes"]]
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: str | Path) -> Path:
    """Left: latency against K per series, with fits. Right: fusion time against N per variant
    (unreliable points hollow)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    sweep = [r for r in doc["rows"] if r["study"] == "sweep" and "time_s" in r]
    fits = doc["params"].get("fits", {})
    for name in dict.fromkeys(r["variant"] for r in sweep):
        pts = [(r["K"], r["time_s"] * 1e6) for r in sweep if r["variant"] == name]
        ks, ts = zip(*pts, strict=True)
        line, = left.loglog(ks, ts, "o", label=name)
        f = fits.get(name)
        if f:
            kk = np.geomspace(min(ks), max(ks), 50)
            left.loglog(kk, f["fixed_us"] + f["per_us"] * kk, "-", color=line.get_color(), alpha=0.6,
                        label=f"{name} fit: {f['fixed_us']:.1f} + {f['per_us']:.2f}·K us")
    left.set_xlabel("K kernels in a row")
    left.set_ylabel("time for K launches (us)")
    left.set_title("launch overhead")
    left.grid(True, which="both", alpha=0.3)
    if left.get_legend_handles_labels()[0]:  # a partial run may have no points here (matplotlib warned)
        left.legend(fontsize=7)
    fusion = [r for r in doc["rows"] if r["study"] == "fusion" and "time_s" in r]
    any_hollow = False
    for name in dict.fromkeys(r["variant"] for r in fusion):
        pts = sorted((r["N"], r["time_s"] * 1e6, bool(r.get("unreliable"))) for r in fusion if r["variant"] == name)
        ns, ts, bad = zip(*pts, strict=True)
        line, = right.loglog(ns, ts, "k--" if name == "copy" else "-", label=name)
        color = line.get_color()
        solid = [(n, t) for n, t, b in pts if not b]
        hollow = [(n, t) for n, t, b in pts if b]
        if solid:
            right.plot(*zip(*solid, strict=True), "o", color=color, ms=5)
        if hollow:
            any_hollow = True
            right.plot(*zip(*hollow, strict=True), "o", mfc="none", mec=color, ms=7, mew=1.5)
    if any_hollow:
        right.plot([], [], "o", mfc="none", mec="0.3", label="unreliable point (see launch.md)")
    right.set_xlabel("N elements (fp32)")
    right.set_ylabel("time per call (us)")
    right.set_title(f"{doc['params']['chain_k']}-op elementwise chain: flat = launch-bound, sloped = bandwidth-bound")
    right.title.set_fontsize(9)
    right.grid(True, which="both", alpha=0.3)
    if right.get_legend_handles_labels()[0]:  # a partial run may have no points here (matplotlib warned)
        right.legend(fontsize=7)
    fig.suptitle(f"gpuspeed launch on {doc['device'].get('name', '?')}")
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(tmp, dpi=110)
        tmp.replace(path)  # atomic: never a half-written plot
    finally:  # a failed save or rename leaves neither an open figure nor the temporary file
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return path


def write_artifacts(doc: dict, out: str | Path, stem: str = "launch") -> list[Path]:
    """launch.json (through gpuspeed.results), launch.md and launch.png under `out` (`stem` names them)."""
    from gpuspeed.results import write_results, write_text_atomic

    out = Path(out)
    pics = []
    try:  # first, so that a failure is among the notes the JSON and the Markdown hold
        pics.append(plot(doc, out / f"{stem}.png"))
    except Exception as exc:  # a plot failure must not lose the numbers
        doc["notes"].append(f"plot failed: {err_text(exc)}")
    paths = [write_results(doc, out / f"{stem}.json")]
    paths.append(write_text_atomic(out / f"{stem}.md", to_markdown(doc)))  # never half-written, no temp left
    return paths + pics
