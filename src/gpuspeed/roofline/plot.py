"""The roofline plot: log-log FLOP/s against FLOP/byte with every measured ceiling, the AI sweep curves,
the ridges and each placed point labelled (a 0-FLOP copy, which log FLOP/s axes cannot show, is listed in a box
with its GB/s and % of the memory roof). Reads a roofline results document; writes PNG and SVG.

A plot is read, not decoded: no label may cover another label, a point or the legend. Labels are placed
greedily (ceilings first, then ridges, then points from the top down): each tries positions around its
anchor, nearest first, and takes the first whose box is free; a label pushed away from its point gets a
leader line. The x axis spans the data (placements, sweep, ridges) with a margin, not a fixed range.
"""

from __future__ import annotations

import math
from pathlib import Path

GROUP_MARKERS = {"elementwise": ("o", "tab:blue"), "torch elementwise": ("o", "tab:orange"),
                 "normalization": ("s", "tab:green"),
                 "reduction": ("v", "tab:cyan"), "matmul": ("D", "tab:red"), "attention": ("*", "tab:purple")}
MEM_STYLES = {"copy": "-", "read": "--", "write": ":", "torch_copy": "-.", "l2": (0, (1, 1))}
LABEL_SIZE = 6.5
BACKDROP = dict(boxstyle="square,pad=0.05", fc="white", ec="none", alpha=0.75)  # text stays readable over lines
POINT_SIZE = 28


def _x_range(values: list[float]) -> tuple[float, float]:
    """Whole powers of two around the data, one step of margin each side (two on the right for labels)."""
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    if not vals:
        return 2.0**-6, 2.0**14
    return 2.0 ** (math.floor(math.log2(min(vals))) - 1), 2.0 ** (math.ceil(math.log2(max(vals))) + 2)


def _rings(step: float, rings: int, first: float = 4.0) -> list[tuple[float, float, str, str]]:
    """Candidate offsets (points) around an anchor, nearest first: right, left, above, below, diagonals."""
    out = []
    for i in range(rings):
        r = first + i * step
        out += [(r, 0, "left", "center"), (-r, 0, "right", "center"), (0, r, "center", "bottom"),
                (0, -r, "center", "top"), (r, r, "left", "bottom"), (r, -r, "left", "top"),
                (-r, r, "right", "bottom"), (-r, -r, "right", "top")]
    return out


class _Labels:
    """Greedy, collision-free text placement on one axes (boxes in display pixels)."""

    def __init__(self, ax, renderer):
        self.ax, self.renderer = ax, renderer
        self.taken: list = []  # boxes no label may overlap: labels, points, the legend
        self.frame = ax.get_window_extent(renderer)

    def block(self, bbox) -> None:
        self.taken.append(bbox)

    def block_point(self, x: float, y: float, radius_px: float = 3.5) -> None:
        from matplotlib.transforms import Bbox

        px, py = self.ax.transData.transform((x, y))
        self.taken.append(Bbox.from_extents(px - radius_px, py - radius_px, px + radius_px, py + radius_px))

    def _free(self, bbox) -> bool:
        inside = (bbox.x0 >= self.frame.x0 and bbox.x1 <= self.frame.x1 and bbox.y0 >= self.frame.y0
                  and bbox.y1 <= self.frame.y1)
        return inside and not any(bbox.overlaps(t) for t in self.taken)

    def place(self, text: str, xy, candidates, leader_beyond: float = 8.0, **style):
        """Put `text` near data point `xy` at the first free candidate offset; returns the Annotation."""
        for dx, dy, ha, va in candidates:
            far = math.hypot(dx, dy) > leader_beyond
            ann = self.ax.annotate(text, xy, xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                                   arrowprops=dict(arrowstyle="-", lw=0.5, color="0.5") if far else None,
                                   **style)
            box = self._text_box(ann)
            if self._free(box):
                self.taken.append(box)
                return ann
            ann.remove()
        # nowhere free within reach: the nearest spot, still drawn (never silently dropped)
        dx, dy, ha, va = candidates[0]
        ann = self.ax.annotate(text, xy, xytext=(dx, dy), textcoords="offset points", ha=ha, va=va, **style)
        self.taken.append(self._text_box(ann))
        return ann

    def _text_box(self, ann):
        """The box of the text alone (an Annotation's own extent includes its leader line)."""
        from matplotlib.text import Text

        ann.update_positions(self.renderer)
        return Text.get_window_extent(ann, self.renderer).padded(1.0)


def _above(row: dict) -> bool:
    return bool(row.get("above_roof")) or (row.get("pct_of_roof") or 0) > 100  # older files lack the flag


def _label_of(row: dict, cpu: bool = False) -> str:
    """A point's label; above its roof, with the reason the tables give (report.pct_text): far above it, counts that
    were not the call's; on a CPU, ceilings a shared host measured low as much as a cache."""
    from gpuspeed.roofline.place import IMPLAUSIBLE_OVER_ROOF

    if not _above(row):
        return row["name"]
    if (row.get("pct_of_roof") or 0) > 100 * IMPLAUSIBLE_OVER_ROOF:
        return f"{row['name']} (>{IMPLAUSIBLE_OVER_ROOF}x roof: fewer bytes or FLOPs moved than counted)"
    if row.get("bound") == "memory" and not cpu:
        return f"{row['name']} (above roof: cache-resident)"
    return f"{row['name']} (above measured roof)"


def draw(doc: dict):
    """The roofline figure of `doc` (a matplotlib Figure; the caller saves or closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpuspeed.roofline.ceilings import check_ceiling_row

    for row in doc["rows"]:  # a file edited by hand: one line, not a TypeError inside matplotlib
        if isinstance(row, dict) and row.get("section") == "ceiling":
            check_ceiling_row(row)
    gpu = doc["params"].get("device") == "cuda"
    scale, yunit = (1.0, "TFLOP/s") if gpu else (1e3, "GFLOP/s")  # stored in TFLOP/s
    ceil = {r["name"]: r for r in doc["rows"] if r.get("section") == "ceiling" and r.get("value")}
    mem = {k: v["value"] for k, v in ceil.items() if v["kind"] == "memory"}
    comp = {k: v["value"] * scale for k, v in ceil.items() if v["kind"] == "compute"}
    sweep = [r for r in doc["rows"] if r.get("section") == "sweep" and "TFLOPs" in r]
    placed = [r for r in doc["rows"] if r.get("section") == "placement" and r.get("ai")]
    # a copy placed with 0 FLOP (place(..., flops=0)) has no point on log FLOP/s axes: it is listed in a box instead
    no_flops = [r for r in doc["rows"] if r.get("section") == "placement" and not r.get("error")
                and r.get("flops") == 0 and r.get("GBps")]
    roof_bw = max((v for k, v in mem.items() if k != "l2"), default=None)
    ridges = {name: peak / scale * 1e12 / (roof_bw * 1e9) for name, peak in comp.items()} if roof_bw else {}
    shown_ridges = {k: v for k, v in ridges.items() if k in ("bf16", "fp32")}

    fig, ax = plt.subplots(figsize=(12, 7.5))
    x0, x1 = _x_range([r["ai"] for r in placed + sweep] + list(shown_ridges.values()))
    xs = [2.0**e for e in range(round(math.log2(x0)), round(math.log2(x1)) + 1)]
    top = max(comp.values(), default=1.0)
    for name, gbps in sorted(mem.items(), key=lambda kv: -kv[1]):
        if name not in MEM_STYLES:
            continue
        corner = top / (gbps * 1e9 / 1e12 * scale)  # where the line meets the top: a vertex, not cut between xs
        line_xs = sorted(set(xs) | ({corner} if xs[0] < corner < xs[-1] else set()))
        ys = [min(gbps * 1e9 * x / 1e12 * scale, top) for x in line_xs]
        ax.plot(line_xs, ys, linestyle=MEM_STYLES[name], color="0.25" if name != "l2" else "0.6", lw=1.2,
                label=f"{name} {gbps:,.0f} GB/s")
    for name, peak in comp.items():
        ax.hlines(peak, ridges.get(name, x0), x1, colors="tab:orange", lw=1.2)
        if name in shown_ridges:
            ax.axvline(ridges[name], color="tab:orange", lw=0.6, ls=":")
    for dt, color in (("fp32", "tab:brown"), ("bf16", "tab:pink")):
        pts = sorted((r["ai"], r["TFLOPs"] * scale) for r in sweep if r["dtype"] == dt)
        if pts:
            ax.plot(*zip(*pts, strict=True), marker=".", color=color, lw=1, label=f"AI sweep {dt} (CUDA cores)")
    for r in placed:
        marker, color = GROUP_MARKERS.get(r.get("group"), ("x", "k"))
        hollow = dict(facecolors="none", edgecolors=color) if _above(r) else dict(color=color)
        ax.scatter(r["ai"], r["TFLOPs"] * scale, marker=marker, s=POINT_SIZE, zorder=3, **hollow)
    for group in dict.fromkeys(r.get("group") for r in placed):  # legend keys solid, whatever the points
        marker, color = GROUP_MARKERS.get(group, ("x", "k"))
        ax.scatter([], [], marker=marker, s=POINT_SIZE, color=color, label=group)
    if any(_above(r) for r in placed):
        ax.scatter([], [], marker="o", s=POINT_SIZE, facecolors="none", edgecolors="0.3",
                   label="hollow: above its roof (labelled why)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlim(x0, x1)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel(f"achieved ({yunit})")
    dev = doc.get("device", {}).get("name", "?")
    ax.set_title(f"Measured roofline: {dev}" + (" (quick)" if doc["params"].get("quick") else ""))
    ys = [r["TFLOPs"] * scale for r in placed + sweep] + list(comp.values())
    if ys:
        ax.set_ylim(min(ys) / 3, top * 2.5)
    ax.grid(True, which="major", alpha=0.3)
    # no roof drawn (every ceiling failed, or a partial run's): no legend, which matplotlib warned about
    legend = ax.legend(fontsize=7, loc="lower right") if ax.get_legend_handles_labels()[0] else None
    fig.tight_layout()  # final layout first: label boxes are measured in display pixels

    renderer = fig.canvas.get_renderer()
    labels = _Labels(ax, renderer)
    if legend is not None:
        labels.block(legend.get_window_extent(renderer))
    for r in placed:
        labels.block_point(r["ai"], r["TFLOPs"] * scale)
    for r in sweep:
        labels.block_point(r["ai"], r["TFLOPs"] * scale, radius_px=2.5)
    # ceiling labels at the right end, above or below their line, stacked outwards when taken
    stack = [(-3, dy, "right", va) for k in range(8) for dy, va in ((2 + 7 * k, "bottom"), (-2 - 7 * k, "top"))]
    for name, peak in sorted(comp.items(), key=lambda kv: -kv[1]):
        labels.place(f"{name} {peak:,.3g} {yunit}", (x1, peak), stack, leader_beyond=1e9, fontsize=LABEL_SIZE,
                     color="tab:orange", bbox=BACKDROP)
    for name, x_ridge in shown_ridges.items():
        labels.place(f"ridge {name} {x_ridge:.3g}", (x_ridge, comp[name]),
                     [(-2, -3 - 8 * k, "right", "top") for k in range(12)], leader_beyond=1e9,
                     fontsize=LABEL_SIZE, color="tab:orange", rotation=90, bbox=BACKDROP)
    for r in sorted(placed, key=lambda r: -r["TFLOPs"]):
        labels.place(_label_of(r, cpu=not gpu), (r["ai"], r["TFLOPs"] * scale), _rings(7.0, 10), fontsize=LABEL_SIZE,
                     bbox=BACKDROP)
    if no_flops:  # top left, moved down or right until free
        labels.place(_no_flops_text(no_flops, cpu=doc["params"].get("device") != "cuda"), (x0, top * 2.5),
                     [(4 + 12 * i, -4 - 8 * j, "left", "top") for j in range(30) for i in range(4)],
                     leader_beyond=1e9, fontsize=LABEL_SIZE, bbox=BACKDROP)
    return fig


def _no_flops_text(rows: list[dict], cpu: bool = False) -> str:
    """The 0-FLOP placements (copies), which log FLOP/s axes cannot show: bandwidth and % of the memory roof."""
    from gpuspeed.roofline.report import pct_text

    lines = ["0 FLOP, not on these axes (GB/s, % of memory roof):"]
    for r in rows:
        pct = pct_text(r, cpu=cpu)
        number, _, flag = pct.partition(" (")  # '12.0 (unreliable: ...)': the % goes with the number
        lines.append(f"{r['name']}: {r['GBps']:,.4g} GB/s, "
                     + (f"{number} %" + (f" ({flag}" if flag else "") if pct[:1].isdigit() else pct))
    return "\n".join(lines)


def plot(doc: dict, out_dir: str | Path, stem: str = "roofline") -> list[Path]:
    """Draw the roofline of `doc` to <out_dir>/<stem>.png and .svg; returns the paths."""
    import matplotlib.pyplot as plt

    fig = draw(doc)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.png", out / f"{stem}.svg"]
    try:
        for path, kw in zip(paths, ({"dpi": 130}, {}), strict=True):
            tmp = path.with_name(f".{path.name}.tmp{path.suffix}")  # the format from the suffix; never half-written
            fig.savefig(tmp, **kw)
            tmp.replace(path)
    finally:
        plt.close(fig)
        for path in paths:
            path.with_name(f".{path.name}.tmp{path.suffix}").unlink(missing_ok=True)
    return paths
