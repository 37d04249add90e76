"""Output of a profile run: headline summary, a Markdown section (the optimize report embeds it), a rich
console report and a results document (through gpuspeed.results)."""

from __future__ import annotations

from gpuspeed.results import make_results
from gpuspeed.timing import format_time


def _where(row: dict) -> str:
    if not row.get("file"):
        return "-"
    from pathlib import Path

    return f"{Path(row['file']).name}:{row['line']}"


def _shown_functions(hotspots: dict, n: int = 2) -> list:
    """The line-timed functions whose lines the report shows: those with the most time of their own (cProfile's self
    time). By time with calls included, a script's module code and its main() came first, each one line that calls
    the function doing the work, whose lines were never shown."""
    from gpuspeed.profiling.hotspots import _fn_key  # with the name: a script's module code and a def on line 1

    own = {_fn_key(r["file"], r["line"], r["name"]): r["tottime_s"] for r in hotspots["cprofile"]["top"] if r["file"]}
    functions = hotspots["lines"]["functions"]
    return sorted(functions, key=lambda f: -own.get(_fn_key(f["file"], f["line"], f["function"]), 0.0))[:n]


def summary(res) -> dict:
    """Headline numbers, flat (results `summary`)."""
    f = res.findings
    out = {"steps": res.steps, "gpu": bool(f.get("gpu"))}
    bi = f.get("busy_idle")
    if bi:
        out |= {"window_s": bi["window_s"], "gpu_busy_share": bi["busy_share"], "gpu_idle_share": bi["idle_share"],
                "idle_waiting_on_host_s": bi["idle_host_s"], "idle_other_s": bi["idle_other_s"]}
    gaps = f.get("launch_gaps")
    if gaps:
        out |= {"launch_gaps": gaps["count"], "launch_gap_p50_us": gaps["p50_us"], "launch_gap_max_us": gaps["max_us"]}
    tiny = f.get("tiny_runs")
    if tiny:
        out |= {"tiny_kernel_runs": tiny["total_runs"], "tiny_kernels": tiny["tiny_kernels"]}
    syncs = f.get("host_syncs") or {}
    waits = [g["wait_s"] for g in syncs.get("groups", [])]
    out |= {"host_syncs": syncs.get("total", 0),  # None on a CPU run: no wait was measured
            "host_sync_wait_s": sum(waits) if f.get("gpu") else None}
    tr = f.get("transfers")
    if tr:
        out |= {"h2d_bytes": tr["h2d_bytes"], "d2h_bytes": tr["d2h_bytes"]}
    tk = f.get("top_kernels")
    if tk and tk["rows"]:
        out |= {"kernel_time_s": tk["total_s"], "top_kernel_share": tk["rows"][0]["share"]}
    if res.hotspots:
        cp = res.hotspots["cprofile"]
        out |= {"python_total_s": cp["total_s"], "python_verdict": cp["verdict"],
                "interpreter_share": cp["shares"]["interpreter"], "library_share": cp["shares"]["library"],
                "allocation_share": cp["shares"]["allocation"], "waiting_share": cp["shares"].get("waiting", 0.0),
                "hot_loops": len(res.hotspots["hot_loops"])}
    out["recommendations"] = len(res.recommendations)
    return out


def rows(res) -> list[dict]:
    """One row per finding (results `rows`): kind, where, count and time."""
    f, out = res.findings, []
    for g in (f.get("host_syncs") or {}).get("groups", []):
        out.append({"finding": "host_sync", **g})
    for r in (f.get("tiny_runs") or {}).get("runs", []):
        out.append({"finding": "tiny_kernel_run", **r})
    for t in (f.get("transfers") or {}).get("rows", []):
        out.append({"finding": "transfer", **t})
    for k in (f.get("top_kernels") or {}).get("rows", []):
        out.append({"finding": "top_kernel", **k})
    for g in (f.get("launch_gaps") or {}).get("largest", []):
        out.append({"finding": "launch_gap", **g})
    for loop in (res.hotspots or {}).get("hot_loops", []):
        out.append({"finding": "python_loop", **loop})
    return out


def results_doc(res, study: str = "profile", params: dict | None = None, notes: list | None = None) -> dict:
    return make_results(study, params=(params or {}) | res.params | {"name": res.name, "trace": res.trace_path},
                        summary=summary(res), rows=rows(res) + [{"finding": "raw", **res.to_dict()}],
                        notes=res.notes + (notes or []), device=res.device)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _sync_wait(group: dict, findings: dict) -> str:
    """A host sync's wait, or '-' where no GPU ran: nothing was waited for, and '0.0 ns' read as a sync costing
    nothing where on a GPU it waits for all the work queued before it."""
    return format_time(group["wait_s"]) if findings.get("gpu") else "-"


def _waiting(shares: dict) -> str:
    """', waiting 93.0%' where time was spent blocked (sleep, I/O, another process); nothing where none was."""
    return f", waiting {_pct(shares['waiting'])}" if shares.get("waiting") else ""


def _table(lines: list[str], title: str, header: str, align: str, body: list[str]) -> None:
    """Append a titled Markdown table, or nothing when it has no rows."""
    if body:
        lines += [title, "", header, align, *body, ""]


def markdown(res, level: int = 2) -> str:
    """The profile as a Markdown section; `level` is the heading level of its title."""
    h = "#" * level
    f = res.findings
    lines = [f"{h} Profile: {res.name} ({res.device}, {res.steps} step{'' if res.steps == 1 else 's'})", ""]
    if res.trace_path:
        lines += [f"Chrome trace: `{res.trace_path}` (open in https://ui.perfetto.dev)", ""]
    bi = f.get("busy_idle")
    if bi:
        lines += [f"- GPU busy {_pct(bi['busy_share'])} of {format_time(bi['window_s'])}; idle "
                  f"{format_time(bi['idle_s'])}: {format_time(bi['idle_host_s'])} waiting on the host, "
                  f"{format_time(bi['idle_other_s'])} other."]
    gaps = f.get("launch_gaps")
    if gaps and gaps["count"]:
        lines += [f"- Launch gaps: {gaps['count']}, median {gaps['p50_us']:.1f} us, p90 {gaps['p90_us']:.1f} us, "
                  f"max {gaps['max_us']:.1f} us."]
    lines.append("")
    syncs = (f.get("host_syncs") or {}).get("groups", [])
    _table(lines, f"{h}# Host syncs" + ("" if f.get("gpu") else " (calls that block on a GPU tensor)"),
           "| kind | where | count | per step | wait |", "|---|---|---:|---:|---:|",
           [f"| {g['kind']} | `{_where(g)}` | {g['count']} | {g['per_step']:g} | {_sync_wait(g, f)} |" for g in syncs])
    _table(lines, f"{h}# Tiny-kernel runs", "| length | runs/step | where | kernel time | host time |",
           "|---:|---:|---|---:|---:|",
           [f"| {r['length']} | {r['runs_per_step']:g} | `{_where(r)}` | {format_time(r['kernel_s'])} | "
            f"{format_time(r['host_s'])} |" for r in (f.get("tiny_runs") or {}).get("runs", [])])
    _table(lines, f"{h}# Transfers", "| dir | memory | where | count | bytes | time | GB/s |",
           "|---|---|---|---:|---:|---:|---:|",
           [f"| {t['direction']} | {t['memory']} | `{_where(t)}` | {t['count']} | {t['bytes']} | "
            f"{format_time(t['time_s'])} | {t['GBps'] or 0:.1f} |" for t in (f.get("transfers") or {}).get("rows", [])])
    _table(lines, f"{h}# Top kernels", "| kernel | where | share | calls/step | mean |", "|---|---|---:|---:|---:|",
           [f"| `{k['short']}` | `{_where(k)}` | {_pct(k['share'])} | {k['calls_per_step']:g} | "
            f"{k['mean_us']:.1f} us |" for k in ((f.get("top_kernels") or {}).get("rows", []))[:8]])
    if not f.get("gpu"):  # what a CPU run has instead of kernels, as the console shows it
        _table(lines, f"{h}# Top ops (host time)", "| op | where | calls/step | time/step |", "|---|---|---:|---:|",
               [f"| `{o['name']}` | `{_where(o)}` | {o['calls_per_step']:g} | {format_time(o['time_per_step_s'])} |"
                for o in f.get("top_ops", [])[:8]])
    if res.hotspots:
        cp = res.hotspots["cprofile"]
        s = cp["shares"]
        lines += [f"{h}# Python hotspots", "",
                  f"{format_time(cp['total_s'])} of host Python per call: **{cp['verdict']}** (interpreter "
                  f"{_pct(s['interpreter'])}, libraries {_pct(s['library'])}, allocation {_pct(s['allocation'])}"
                  f"{_waiting(s)}).",
                  "", "| function | calls | self | cumulative |", "|---|---:|---:|---:|"]
        lines += [f"| `{r['function']}` | {r['calls']} | {format_time(r['tottime_s'])} | {format_time(r['cumtime_s'])} |"
                  for r in cp["top"][:8]]
        lines.append("")
        for fn in _shown_functions(res.hotspots):
            hot = sorted(fn["lines"], key=lambda r: -r["time_s"])[:5]
            lines += [f"Hot lines of `{fn['function']}` ({res.hotspots['lines']['backend']}):", "",
                      "| line | hits | time | share | code |", "|---:|---:|---:|---:|---|"]
            lines += [f"| {r['line']} | {r['hits']} | {format_time(r['time_s'])} | {_pct(r['share'])} | "
                      f"`{r['code'].strip()[:60]}` |" for r in hot]
            lines.append("")
        _table(lines, "Hot loop nests:", "| where | depth | share | kind |", "|---|---:|---:|---|",
               [f"| `{_where(lp)}` ({lp['function']}) | {lp['depth']} | {_pct(lp['share'])} | {lp.get('kind', '-')} |"
                for lp in res.hotspots["hot_loops"]])
    if res.recommendations:
        lines += [f"{h}# Recommendations", ""] + [f"- {r['text']}" for r in res.recommendations] + [""]
    if res.notes:
        lines += [f"_Notes: {'; '.join(res.notes)}._", ""]
    return "\n".join(lines)


def _clip(text: str, limit: int) -> str:
    """text cut to at most limit characters at a word's end, '…' where it was cut: a cut mid-word read as another
    word (a loop's verdict ending "line 5), s" where it said "so")."""
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    head = cut.rsplit(" ", 1)[0] if " " in cut else cut
    return head.rstrip(" ,;:(") + "…"


def print_report(res, console) -> None:
    """The rich console report."""
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    f = res.findings
    trace = res.trace_path or "not kept (--out DIR, or trace_path=, keeps it)"
    steps = f"{res.steps} step{'' if res.steps == 1 else 's'}"
    console.print(f"[bold]Profile of {escape(res.name)}[/] on {res.device}, {steps}. Trace: {escape(trace)}")
    bi = f.get("busy_idle")
    if bi:
        console.print(f"GPU busy {_pct(bi['busy_share'])} of {format_time(bi['window_s'])}; idle: "
                      f"{format_time(bi['idle_host_s'])} waiting on the host, {format_time(bi['idle_other_s'])} other")
    gaps = f.get("launch_gaps")
    if gaps and gaps["count"]:
        console.print(f"Launch gaps: {gaps['count']} (median {gaps['p50_us']:.1f} us, p90 {gaps['p90_us']:.1f} us, "
                      f"max {gaps['max_us']:.1f} us) " + " ".join(f"{k}:{v}" for k, v in gaps["histogram"].items()))

    def table(title, cols, data):
        if not data:
            return
        t = Table(title=title)
        for c in cols:
            t.add_column(c)
        for r in data:
            t.add_row(*[Text(str(x)) for x in r])  # Text: source code holds [brackets]
        console.print(t)

    syncs = (f.get("host_syncs") or {}).get("groups", [])
    table("Host syncs" + ("" if f.get("gpu") else " (would block on a GPU tensor)"),
          ["kind", "where", "count", "per step", "wait", "code"],
          [(g["kind"], _where(g), g["count"], f"{g['per_step']:g}", _sync_wait(g, f), (g.get("code") or "")[:50])
           for g in syncs])
    table("Tiny-kernel runs", ["length", "runs/step", "where", "kernel time", "host time"],
          [(r["length"], f"{r['runs_per_step']:g}", _where(r), format_time(r["kernel_s"]), format_time(r["host_s"]))
           for r in (f.get("tiny_runs") or {}).get("runs", [])])
    table("Transfers", ["dir", "memory", "where", "count", "MiB", "time", "GB/s"],
          [(t["direction"], t["memory"], _where(t), t["count"], f"{t['bytes'] / 2**20:.1f}", format_time(t["time_s"]),
            f"{t['GBps'] or 0:.1f}") for t in (f.get("transfers") or {}).get("rows", [])])
    table("Top kernels", ["kernel", "where", "share", "calls/step", "mean"],
          [(k["short"], _where(k), _pct(k["share"]), f"{k['calls_per_step']:g}", f"{k['mean_us']:.1f} us")
           for k in (f.get("top_kernels") or {}).get("rows", [])[:8]])
    if not f.get("gpu"):
        # per step, as its calls are: the steps' total beside calls/step read 5x an op's time (a 45 ms call's four ops
        # at 55-60 ms each)
        table("Top ops (host time)", ["op", "where", "calls/step", "time/step"],
              [(o["name"], _where(o), f"{o['calls_per_step']:g}", format_time(o["time_per_step_s"]))
               for o in f.get("top_ops", [])[:8]])
    table("Largest launch gaps", ["gap", "before kernel", "host late", "cause", "where"],
          [(format_time(g["gap_s"]), g["before"][:40], format_time(g.get("host_late_s") or 0),
            (g.get("cause") or {}).get("what", "-")[:40], _where(g.get("cause") or {}))
           for g in (f.get("launch_gaps") or {}).get("largest", [])])
    if res.hotspots:
        cp = res.hotspots["cprofile"]
        s = cp["shares"]
        console.print(f"Python: {format_time(cp['total_s'])} per call, [bold]{cp['verdict']}[/] (interpreter "
                      f"{_pct(s['interpreter'])}, libraries {_pct(s['library'])}, allocation {_pct(s['allocation'])}"
                      f"{_waiting(s)})")
        table("cProfile top functions", ["function", "calls", "self", "cumulative", "kind"],
              [(r["function"][:60], r["calls"], format_time(r["tottime_s"]), format_time(r["cumtime_s"]), r["category"])
               for r in cp["top"][:10]])
        for fn in _shown_functions(res.hotspots):
            hot = sorted(fn["lines"], key=lambda r: -r["time_s"])[:6]
            table(f"Hot lines of {fn['function']} ({res.hotspots['lines']['backend']})",
                  ["line", "hits", "time", "share", "code"],
                  [(r["line"], r["hits"], format_time(r["time_s"]), _pct(r["share"]), r["code"].strip()[:60]) for r in hot])
        table("Hot loop nests", ["where", "depth", "share", "kind", "verdict"],
              [(f"{loop['function']}:{loop['line']}", loop["depth"], _pct(loop["share"]), loop.get("kind", "-"),
                _clip(loop["verdict"], 90)) for loop in res.hotspots["hot_loops"]])
    for r in res.recommendations:
        console.print(f"[green]->[/] {escape(r['text'])}")
    for n in res.notes:
        console.print(f"[yellow]note:[/] {escape(n)}")
