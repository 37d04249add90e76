"""Markdown report of a roofline results document: summary, ceilings, AI sweep, placements."""

from __future__ import annotations


def _f(v, fmt=None) -> str:
    """A number as a reader wants it: one decimal from 100 up, three significant figures below (a CPU's
    0.04 TFLOP/s is not '0.0')."""
    if v is None:
        return "-"
    if not isinstance(v, (int, float)):
        return str(v)
    return format(v, fmt or (",.1f" if abs(v) >= 100 else ".3g"))


def pct_text(row: dict, fmt: str = ",.1f", *, cpu: bool = False) -> str:
    """% of roof as shown to a reader: a point above the roof is labelled why, not shown as 103-180 %
    (cpu: a CPU's point, where a shared host's drifting ceilings explain it as well as a cache does)."""
    from gpuspeed.roofline.place import IMPLAUSIBLE_OVER_ROOF

    if row.get("pct_of_roof") is None:
        return "-"
    if row["pct_of_roof"] > 100 * IMPLAUSIBLE_OVER_ROOF:  # no cache is that fast: the counts were not the call's
        return f">{IMPLAUSIBLE_OVER_ROOF}x roof (fewer bytes or FLOPs moved than counted)"
    if row["pct_of_roof"] > 100:
        return ">100 (above roof: cache-resident data)" if row.get("bound") == "memory" and not cpu else \
            ">100 (above the measured ceiling)"
    # bench() found the samples on more than one level: another run's median can land far from this one
    shaky = any(str(n).startswith("unreliable:") for n in row.get("notes") or ())
    return format(row["pct_of_roof"], fmt) + (" (unreliable: noisy samples)" if shaky else "")


def markdown(doc: dict) -> str:
    gpu = doc["params"].get("device") == "cuda"
    dev = doc.get("device", {})
    lines = [f"# Roofline: {dev.get('name', '?')}", "",
             f"Created {doc['created']}, git {doc.get('git')}, quick={doc['params'].get('quick')}. "
             "Memory in GB/s (bytes read + written), compute in TFLOP/s.", "", "## Summary", "",
             "| key | value |", "| --- | --- |"]
    lines += [f"| {k} | {_f(v, ',.4g')} |" for k, v in doc["summary"].items()]
    lines += ["", "## Ceilings", "", "| ceiling | value | unit | % datasheet | how | noise |",
              "| --- | ---: | --- | ---: | --- | ---: |"]
    for r in (r for r in doc["rows"] if r.get("section") == "ceiling"):
        unit = "GB/s" if r["kind"] == "memory" else "TFLOP/s"
        if r.get("error"):
            lines.append(f"| {r['name']} | error | | | {r['error'][:120]} | |")
            continue
        noise = f"{100 * r['rel_noise']:.2f}%" if r.get("rel_noise") is not None else "-"
        lines.append(f"| {r['name']} | {_f(r['value'])} | {unit} | {_f(r.get('pct_of_datasheet'))} | "
                     f"{r['how']} | {noise} |")
    sweep = [r for r in doc["rows"] if r.get("section") == "sweep"]
    if sweep:
        lines += ["", "## AI sweep (CUDA-core FMA chains)", "", "| dtype | FLOP/byte | TFLOP/s | GB/s | note |",
                  "| --- | ---: | ---: | ---: | --- |"]
        for r in sweep:
            lines.append(f"| {r['dtype']} | {r['ai']:g} | {_f(r.get('TFLOPs'), ',.2f')} | {_f(r.get('GBps'))} | "
                         f"{r.get('error', '')} |")
    placed = [r for r in doc["rows"] if r.get("section") == "placement"]
    if placed:
        lines += ["", "## Placements", "",
                  "| workload | FLOP/byte | TFLOP/s | GB/s | roof TFLOP/s | % of roof | bound | ceiling | note |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |"]
        for r in placed:
            if r.get("error"):
                lines.append(f"| {r['name']} | | | | | | | | error: {r['error'][:100]} |")
                continue
            lines.append(f"| {r['name']} | {r['ai']:.3g} | {_f(r['TFLOPs'], ',.3g')} | {_f(r['GBps'])} | "
                         f"{_f(r.get('roof_TFLOPs'), ',.3g')} | {pct_text(r, cpu=not gpu)} | {r.get('bound')} | "
                         f"{r.get('compute_ceiling')} | {r.get('flops_source', '')} |")
    lines += ["", "## Notes", ""] + [f"- {n}" for n in doc.get("notes", [])]
    if not gpu:
        lines.append("- CPU run: compute ceilings in TFLOP/s here (x1000 for GFLOP/s in the plot)")
    return "\n".join(lines) + "\n"
