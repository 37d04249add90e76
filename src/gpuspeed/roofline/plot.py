"""The roofline plot: log-log FLOP/s against FLOP/byte with every measured ceiling, the AI sweep curves,
the ridges and each placed point labelled. Reads a roofline results document; writes PNG and SVG."""

from __future__ import annotations

from pathlib import Path

GROUP_MARKERS = {"elementwise": ("o", "tab:blue"), "torch elementwise": ("o", "tab:orange"),
                 "normalization": ("s", "tab:green"),
                 "reduction": ("v", "tab:cyan"), "matmul": ("D", "tab:red"), "attention": ("*", "tab:purple")}
MEM_STYLES = {"copy": "-", "read": "--", "write": ":", "torch_copy": "-.", "l2": (0, (1, 1))}


def plot(doc: dict, out_dir: str | Path, stem: str = "roofline") -> list[Path]:
    """Draw the roofline of `doc` to <out_dir>/<stem>.png and .svg; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpu = doc["params"].get("device") == "cuda"
    scale, yunit = (1.0, "TFLOP/s") if gpu else (1e3, "GFLOP/s")  # stored in TFLOP/s
    ceil = {r["name"]: r for r in doc["rows"] if r.get("section") == "ceiling" and r.get("value")}
    mem = {k: v["value"] for k, v in ceil.items() if v["kind"] == "memory"}
    comp = {k: v["value"] * scale for k, v in ceil.items() if v["kind"] == "compute"}
    sweep = [r for r in doc["rows"] if r.get("section") == "sweep" and "TFLOPs" in r]
    placed = [r for r in doc["rows"] if r.get("section") == "placement" and r.get("ai")]

    fig, ax = plt.subplots(figsize=(12, 7.5))
    xs = [2.0**e for e in range(-6, 15)]
    top = max(comp.values(), default=1.0)
    for name, gbps in sorted(mem.items(), key=lambda kv: -kv[1]):
        if name not in MEM_STYLES:
            continue
        ys = [min(gbps * 1e9 * x / 1e12 * scale, top) for x in xs]
        ax.plot(xs, ys, linestyle=MEM_STYLES[name], color="0.25" if name != "l2" else "0.6", lw=1.2,
                label=f"{name} {gbps:,.0f} GB/s")
    roof_bw = max((v for k, v in mem.items() if k != "l2"), default=None)
    for name, peak in sorted(comp.items(), key=lambda kv: -kv[1]):
        x_ridge = peak / scale * 1e12 / (roof_bw * 1e9) if roof_bw else xs[0]
        ax.hlines(peak, x_ridge, xs[-1], colors="tab:orange", lw=1.2)
        ax.annotate(f"{name} {peak:,.3g} {yunit}", (xs[-1], peak), fontsize=7, ha="right", va="bottom",
                    color="tab:orange")
        if name in ("bf16", "fp32") and roof_bw:
            ax.axvline(x_ridge, color="tab:orange", lw=0.6, ls=":")
            ax.annotate(f"ridge {name} {x_ridge:.3g}", (x_ridge, peak), fontsize=7, rotation=90, ha="right",
                        va="top", color="tab:orange")
    for dt, color in (("fp32", "tab:brown"), ("bf16", "tab:pink")):
        pts = sorted((r["ai"], r["TFLOPs"] * scale) for r in sweep if r["dtype"] == dt)
        if pts:
            ax.plot(*zip(*pts, strict=True), marker=".", color=color, lw=1, label=f"AI sweep {dt} (CUDA cores)")
    seen = set()
    for r in placed:
        marker, color = GROUP_MARKERS.get(r.get("group"), ("x", "k"))
        ax.scatter(r["ai"], r["TFLOPs"] * scale, marker=marker, color=color, s=28, zorder=3,
                   label=r["group"] if r["group"] not in seen else None)
        seen.add(r.get("group"))
        ax.annotate(r["name"], (r["ai"], r["TFLOPs"] * scale), fontsize=6, xytext=(3, -3),
                    textcoords="offset points")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel(f"achieved ({yunit})")
    dev = doc.get("device", {}).get("name", "?")
    ax.set_title(f"Measured roofline: {dev}" + (" (quick)" if doc["params"].get("quick") else ""))
    ys = [r["TFLOPs"] * scale for r in placed + sweep] + list(comp.values())
    if ys:
        ax.set_ylim(min(ys) / 3, top * 2.5)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.png", out / f"{stem}.svg"]
    fig.tight_layout()
    fig.savefig(paths[0], dpi=130)
    fig.savefig(paths[1])
    plt.close(fig)
    return paths
