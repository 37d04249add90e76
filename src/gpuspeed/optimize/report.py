"""The optimize report: Markdown sections A-E, the results JSON and a PNG (each candidate's speedup over the
original, labelled with its time; the primary's bandwidth against the roofs of this GPU and the target)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from gpuspeed.timing import format_time

STATUS_WORDS = {"ok": "correct", "incorrect": "WRONG", "unverifiable": "not checkable",
                "wrong_output": "WRONG shape/dtype",
                "mutates_inputs": "REJECTED (mutates inputs)", "error": "failed", "crashed": "crashed",
                "timeout": "timed out", "oom": "out of memory", "over_budget": "over budget",
                "unavailable": "unavailable", "skipped": "skipped"}


def status_word(row) -> str:
    """The table's word for a candidate's status; an original that does not reproduce its own outputs is
    not 'correct': nothing, itself included, could be checked against it."""
    if row.get("nondeterministic"):
        return "not reproducible"
    return STATUS_WORDS.get(row.get("status"), str(row.get("status")))


def _t(row, key="device_time"):
    m = row.get(key) or {}
    return m.get("median")


def _fmt_t(v):
    return "-" if v is None else format_time(v)


def _fmt_x(d):
    if not d:
        return "-"
    same = " (same within noise)" if d.get("verdict") == "same" else ""
    # over the original's separate time, which the primary's confirmation found off: see A
    same += " (rescaled)" if d.get("rescaled") else ""
    return f"{_ratio(d['speedup'])}x [{_ratio(d['ci_low'])}, {_ratio(d['ci_high'])}]{same}"


def _settled_by_rounds(row, label: str) -> str:
    """A tag for a speedup within noise timed apart that the candidate's confirmation (agreeing) established faster:
    the line below gives the rounds; without it the primary's number read "same within noise", unexplained."""
    from gpuspeed.optimize.confirm import rounds_verdict

    conf = row.get("confirmation") or {}
    if (row.get(label) or {}).get("verdict") != "same" or conf.get("status") != "ok" or conf.get("replaced") \
            or not conf.get("ratios"):
        return ""
    return " timed apart, faster timed alternately (below)" if rounds_verdict(conf["ratios"]) == "faster" else ""


def _ratio(v) -> str:
    """1.72 as '1.72'; a ratio under 0.1 in two significant figures: 230x slower read '0.00x', as if it never ran."""
    return f"{v:.2f}" if abs(v) >= 0.1 else f"{v:.2g}"


def _pct(v):
    return "-" if v is None else f"{v:.0f} %"


def peak_text(row) -> str:
    """A candidate's peak memory as the report shows it: 'not measured' where a part of it could not be seen
    (torch's host allocations), and small peaks in their own unit (90 KiB read '0.00 GiB', as if nothing)."""
    from gpuspeed.memory import format_bytes

    if row.get("peak_unmeasured"):
        return "not measured"
    b = row.get("peak_bytes")
    # the original's peak is its first call's (it is called as few times as possible): not like for like
    return "-" if b is None else format_bytes(b) + (" (first call)" if row.get("peak_first_call") else "")


def table_rows(run) -> list[dict]:
    rows = []
    for name, r in run.results.items():
        rows.append({"name": name, "backend": r.get("recipe", {}).get("backend"), "label": r.get("label"),
                     "status": r.get("status"), "reason": r.get("reason"), "device_s": _t(r),
                     "e2e_s": _t(r, "e2e_time"), "speedup": (r.get("speedup") or {}).get("speedup"),
                     "speedup_ci": [(r.get("speedup") or {}).get("ci_low"), (r.get("speedup") or {}).get("ci_high")],
                     "speedup_e2e": (r.get("speedup_e2e") or {}).get("speedup"),
                     "max_abs_err": r.get("max_abs_err"), "max_rel_err": r.get("max_rel_err"),
                     "peak_bytes": r.get("peak_bytes"), "peak_unmeasured": r.get("peak_unmeasured"),
                     "peak_first_call": r.get("peak_first_call"),
                     "fits_budget": r.get("fits_budget"),
                     "traffic_bytes": r.get("traffic_bytes"), "pct_of_bw_roof": r.get("pct_of_bw_roof"),
                     "chunk_size": r.get("chunk_size"), "wall_s": r.get("wall_s"), "stage": r.get("stage")})
    return rows


def table_order(run) -> list[str]:
    """The candidates in report.md's table: fastest first by the time the run ranked them on (end to end on the CPU's
    default; the device-resident order put a float32 candidate slower end to end above the one ranked first), the
    untimed last."""
    way = "e2e_time" if run.params.get("rank_by") == "e2e" else "device_time"
    return [n for n, _ in sorted(run.results.items(), key=lambda kv: (_t(kv[1], way) is None, _t(kv[1], way) or 0))]


def _code_of(run, name) -> str:
    from gpuspeed.optimize import emit

    return emit.implementation_source(run, name)


def markdown(run) -> str:
    wl, ch = run.wl, run.choice
    p = ch.get("primary")
    prim = run.results.get(p) if p else None
    orig = run.results.get("original", {})
    L = [f"# gpuspeed optimize: {wl.name}", ""]
    L += ["## A — Summary", ""]
    dev = "GPU " + (_device_name(run) or "?") if run.where == "cuda" else "CPU only (no GPU)"
    args0 = wl.make_args(0)  # the timed seed's arguments (section E's profile command repeats their forms)
    L.append(f"- Workload `{wl.path.name}`:`{wl.func}`, inputs {', '.join(wl.describe_args(args0))[:200]}; "
             f"measured on {dev}.")
    if run.params.get("in_place"):
        from gpuspeed.optimize.workload import param_names

        what = ("returns its result and also changes" if run.params.get("in_place_returns") else
                "returns None and writes its result into")
        L.append(f"- Output: `{wl.func}` {what} {param_names(wl, run.params['in_place'])}; "
                 "that is what every candidate is checked on, and the optimized script writes it into your arrays.")
    conf = ch.get("confirmation") or {}
    again = (f" ({_fmt_t(conf['original_s'])} timed alternately with {conf['candidate']}: see below)"
             if conf.get("replaced") else "")
    L.append(f"- Original: {_fmt_t(_t(orig))} per call on the CPU{again}.")
    if orig.get("nondeterministic"):
        L.append(f"- **The original is not deterministic**: {orig['nondeterministic']}. No candidate can be checked "
                 "against it: seed its random numbers (or take a Generator argument) and run again.")
    closest = ch.get("closest")
    if ch.get("kept_original") and closest:  # timed faster, not established so: said, with its numbers
        low, high = closest["ci"]
        L.append(f"- Nothing beat the original within the tolerance and the budget: it stays (the fastest candidate, "
                 f"{closest['name']}, is {_ratio(closest['speedup'])}x [{_ratio(low)}, {_ratio(high)}], timed "
                 f"{closest['timed']}: no faster than the original within noise).")
    elif ch.get("kept_original"):
        L.append("- Nothing beat the original within the tolerance and the budget: it stays.")
    if prim:
        ranked = "speedup_e2e" if ch.get("rank_by") == "e2e" else "speedup"
        dev_x, e2e_x = (_fmt_x(prim.get(label)) + (_settled_by_rounds(prim, label) if label == ranked else "")
                        for label in ("speedup", "speedup_e2e"))
        L.append(f"- **Primary: {p}** ({prim.get('label')}): {_fmt_t(_t(prim))} device-resident, "
                 f"{_fmt_t(_t(prim, 'e2e_time'))} end to end; speedup {dev_x} (end to end {e2e_x}).")
        alt = ch.get("alternative")
        if alt:
            a = run.results[alt]
            # both ways, as the primary's: a run without a GPU picked it end to end, where a float32 one pays its casts
            L.append(f"- Alternative: {alt} ({a.get('label')}): {_fmt_t(_t(a))} device-resident, "
                     f"{_fmt_t(_t(a, 'e2e_time'))} end to end; speedup {_fmt_x(a.get('speedup'))} "
                     f"(end to end {_fmt_x(a.get('speedup_e2e'))}).")
        if ch.get("over_best_dropin"):
            L.append(f"- Against the best plain drop-in ({ch['best_dropin']}): {ch['over_best_dropin']:.2f}x.")
        if prim.get("peak_unmeasured"):
            mem = f"peak host memory not measured ({prim['peak_unmeasured']})"
        elif prim.get("fits_budget") is None:  # a CPU candidate, or no GPU here: no GPU memory held to the budget
            mem = f"peak host memory {peak_text(prim)} (the GPU budget of {run.params['budget']} applies " \
                  "to GPU memory, which it does not use)"
        else:
            mem = f"peak memory {peak_text(prim)} against a budget of {run.params['budget']} with 15 % headroom"
        if prim.get("nondeterministic"):
            L.append(f"- Not verifiable: the original does not reproduce its own outputs; {mem}.")
        elif p == "original":  # the reference itself, called once against its own output: no check to report
            L.append(f"- The original is the reference every candidate was checked against; {mem}.")
        else:
            L.append(f"- Correct on {len(run.params['seeds'])} fresh seeds: max abs error {prim.get('max_abs_err'):.3g}, "
                     f"relative L2 error {prim.get('rel_l2_err'):.3g} (tolerance: {_tol(run)}); {mem}.")
    else:
        L.append("- No candidate passed the correctness check within the budget: keep the original.")
    if conf.get("status") == "ok":  # one not made is a timing caveat
        from gpuspeed.optimize.confirm import line

        # the original kept: the rounds confirmed no candidate's place, they measured the one it kept its place against
        word = "Closest candidate" if ch.get("kept_original") else "Confirmed"
        L.append(f"- {'**Speedup replaced**' if conf.get('replaced') else word}: {line(conf)}.")
    if ch.get("caveats"):
        L.append(f"- **Timing caveat**: {'; '.join(ch['caveats'])}.")
    if ch.get("why_not_2x"):
        L.append(f"- Below 2x because: {'; '.join(ch['why_not_2x'])}. Fastest route: "
                 f"{ch.get('fastest_route') or 'the original'}.")
    elif ch.get("why_not_gpu"):  # fast, but not through a GPU: say why a GPU is not the route
        gain = f" ({ch['speedup']:.3g}x)" if ch.get("speedup") else ""
        L.append(f"- Not 2x on the GPU: {ch['why_not_gpu']}. Fastest route: "
                 f"{ch.get('fastest_route') or 'the original'}{gain}.")
    pr = run.projection
    if pr.get("memory_bound_s"):
        L.append(f"- On {pr['target']} (projection from the roofline, not measured): "
                 f"~{_fmt_t(pr.get('projected_s') or pr['memory_bound_s'])} per call.")
    L += ["", "## B — Primary code", ""]
    L += ["```python", _code_of(run, p) if p else "# the original stays: nothing passed", "```", ""]
    L.append(f"The standalone script `{Path(run.paths.get('script', 'optimized_' + wl.name + '.py')).name}` holds it with "
             "install notes, `main()`, device detection and a CPU fallback, a benchmark and a correctness test.")
    L += ["", "## C — Alternative", ""]
    alt = ch.get("alternative")
    L += ["```python", _code_of(run, alt) if alt else "# no correct candidate from a second backend", "```"]
    L += ["", "## D — Benchmark and correctness", ""]
    # the roof is a GPU's datasheet bandwidth: a CPU-only run (or a GPU without a datasheet entry) has none to show
    roof = any(r.get("pct_of_bw_roof") is not None for r in run.results.values())
    roof_text = ("% of bw roof: the least traffic of a call (inputs read once, outputs written once) over its time, "
                 "against this GPU's datasheet bandwidth: a lower bound. " if roof else
                 "No GPU here, so no bandwidth roof to hold the times against (`gpuspeed roofline --device cpu` "
                 "measures this machine's ceilings). " if run.where != "cuda" else
                 "This GPU has no datasheet entry: no bandwidth roof to hold the times against. ")
    L.append(f"Times are medians through gpuspeed.bench (device-resident: inputs already on the device; end to end: "
             f"host arrays in and out, transfers included). Speedups against the original with a 95 % bootstrap CI "
             f"(gpuspeed.compare). Tolerance: {_tol(run)}. Budget {run.params['budget']}, 15 % headroom. "
             f"{roof_text}Max rel err is per element (values near zero "
             "inflate it; atol covers them); rel L2 err is the whole output's. A float32 or TF32 candidate keeps its "
             "resident data in that precision (cast once, when moved); its outputs are cast back to the original's "
             "dtypes on the way out.")
    L.append("")
    L.append("| candidate | status | device-resident | end to end | speedup | e2e speedup | max abs err | max rel err "
             f"| rel L2 err | peak memory |{' % of bw roof |' if roof else ''} note |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if roof else ""))
    for name in table_order(run):
        r = run.results[name]
        note = r.get("reason") or (f"chunk {r['chunk_size']}" if r.get("chunk_size") else "")
        if name == p:
            note = "**primary** " + note
        elif name == alt:
            note = "alternative " + note
        errs = [r.get("max_abs_err"), r.get("max_rel_err")]
        share = f" {_pct(r.get('pct_of_bw_roof'))} |" if roof else ""
        L.append(f"| {name} | {status_word(r)} | {_fmt_t(_t(r))} | "
                 f"{_fmt_t(_t(r, 'e2e_time'))} | {_fmt_x(r.get('speedup'))} | {_fmt_x(r.get('speedup_e2e'))} | "
                 f"{'-' if errs[0] is None else f'{errs[0]:.2g}'} | {'-' if errs[1] is None else f'{errs[1]:.2g}'} | "
                 f"{'-' if r.get('rel_l2_err') is None else format(r['rel_l2_err'], '.2g')} | "
                 f"{peak_text(r)} |{share} {(note or '').replace('|', '/')[:160]} |")
    if run.chunking:
        L += ["", f"Chunking: {run.chunking.get('note')}."]
    noted = candidate_notes(run)
    if noted:
        L += ["", "### Candidate notes", ""] + [f"- {names}: {'; '.join(notes)}" for names, notes in noted]
    L += ["", "### Plan", "", "| backend | decision | why |", "|---|---|---|"]
    for row in run.plan_rows:
        L.append(f"| {row['backend']} | {row['decision']} | {row['why']} |")
    L += ["", "### Hotspots of the original", ""]
    for imp in run.hot.get("implications", []):
        L.append(f"- {imp}")
    for hl in run.hot.get("hot_lines", [])[:5]:
        share = f"{hl['share']:.0%}" if hl.get("share") is not None else "?"
        L.append(f"- line {hl['line']} ({share} of {hl['function']}): `{hl['code'][:100]}`")
    L += ["", "### Target card", ""]
    L.append(_projection_text(pr))
    L += ["", "## E — How to profile and next tweaks", ""]
    L += _profiling_guide(run, args0)
    if run.notes:
        L += ["", "### Notes", ""] + [f"- {n}" for n in run.notes]
    return "\n".join(L) + "\n"


NOTE_CHARS = 200  # of one candidate note in report.md: the JSON keeps it whole


def candidate_notes(run) -> list[tuple[str, list[str]]]:
    """Each candidate's own notes (a function left on NumPy, a serial fallback, a probe not made) for report.md:
    the primary's and the original's first, then the table's order; each note its first line, cut to NOTE_CHARS,
    once; none report.md says elsewhere (the run's notes, the caveats, the original's nondeterminism). Candidates
    with the same notes share one entry: (their names, the notes)."""
    primary = run.choice.get("primary")
    said = set(run.notes) | {r.get("nondeterministic") for r in run.results.values()}
    caveats = " ".join(run.choice.get("caveats") or [])
    order = [n for n in dict.fromkeys([primary, "original", *table_order(run)]) if n in run.results]
    grouped: dict[tuple, list[str]] = {}
    for name in order:
        kept = []
        for note in map(str, run.results[name].get("notes") or []):
            if note in said or not note.strip():
                continue
            # the caveat gives the two times of a candidate that caches its results
            if note.startswith("faster on inputs it has already seen") and f"{name} caches" in caveats:
                continue
            kept.append(_one_line(note))
        kept = list(dict.fromkeys(kept))
        if kept:
            grouped.setdefault(tuple(kept), []).append(name)
    return [(", ".join(names), list(notes)) for notes, names in grouped.items()]


def _one_line(note: str) -> str:
    first = note.strip().splitlines()[0].strip()
    return first if len(first) <= NOTE_CHARS else first[:NOTE_CHARS - 3].rstrip() + "..."


def _device_name(run):
    from gpuspeed import device as _device

    return _device.get_device(run.where).name if run.where == "cuda" else None


def _tol(run):
    w = run.wl
    if w.rtol is None and w.atol is None:
        return "dtype defaults of gpuspeed.verify (float64 rtol 1e-12, float32 1e-5)"
    rtol = "rtol by dtype (float64 1e-12, float32 1e-5)" if w.rtol is None else f"rtol {w.rtol:g}"  # an atol alone
    return f"{rtol}, atol {w.atol if w.atol is not None else 'rtol x RMS(ref)'} ({w.tolerance_source})"


def _projection_text(pr) -> str:
    if not pr.get("memory_bound_s"):
        return f"{pr.get('target')}: {pr.get('note', 'no projection')}."
    if pr.get("projected_s"):
        s = (f"{pr['target']} ({pr['label']}): ~{format_time(pr['projected_s'])} per call. The primary runs "
             f"{pr['achieved_TFLOPs']:.3g} TFLOP/s here, {pr['pct_of_roof_here']:.0f} % of the roof at its intensity "
             f"({pr['ai']:.2f} FLOP/B, {pr['unit']}); the target's roof there is {pr['roof_target_TFLOPs']:.3g} "
             f"TFLOP/s ({pr['bound_target']}-bound). {pr.get('note', '')}.")
    else:
        s = (f"{pr['target']} ({pr['label']}): ~{format_time(pr['memory_bound_s'])} at the same fraction of its memory "
             f"roof ({pr['bandwidth_ratio']:.1f}x less bandwidth than here). {pr.get('note', '')}.")
    if pr.get("fits_target_memory") is False:
        s += " Its peak memory exceeds the budget less 15 % headroom: it needs the chunked path there."
    return s


def profile_command(wl, args) -> str | None:
    """`gpuspeed profile --function` on the original, with --input specs of the run's argument forms (the run's own
    --input specs where it had them), quoted for the shell; None where an argument has no --input form."""
    import numbers

    from gpuspeed.inputs import DTYPES
    from gpuspeed.optimize.backends.common import kind_of

    library = "torch" if wl.kind == "torch" else "numpy"
    specs = list(wl.input_specs)
    if not specs:
        import inspect

        try:
            params = list(inspect.signature(wl.original).parameters.values())
        except (TypeError, ValueError):
            return None
        named = params[:len(args)]  # --input passes each by its name: *args and positional-only ones cannot be
        if len(named) < len(args) or any(q.kind is not q.POSITIONAL_OR_KEYWORD for q in named):
            return None
        for q, x in zip(named, args, strict=True):
            dtype = str(getattr(x, "dtype", "")).replace("torch.", "")
            if hasattr(x, "shape") and dtype in DTYPES and kind_of(x) == library:
                specs.append(f"{q.name}={dtype}[{','.join(str(int(d)) for d in x.shape)}]")
            elif isinstance(x, numbers.Integral) and not isinstance(x, bool):
                specs.append(f"{q.name}=int:{int(x)}")
            elif isinstance(x, numbers.Real) and not isinstance(x, bool):
                specs.append(f"{q.name}=float:{float(x)!r}")
            else:  # a list, a string, a bool, another library's array: --input makes none of these
                return None
    words = ["gpuspeed", "profile", "--function", f"{wl.path}:{wl.func}", "--backend", library]
    if library == "torch":  # on the device the run's tensors were on: an original that makes CPU tensors needs CPU ones
        words += ["--device", "cuda" if any(getattr(x, "is_cuda", False) for x in args) else "cpu"]
    for spec in specs:
        words += ["--input", spec]
    return shlex.join(words)


def _profiling_guide(run, args) -> list[str]:
    wl = run.wl
    p = run.choice.get("primary") or ""
    # quoted for the shell where a name has a space in it: the commands are pasted as they are
    script, name = (shlex.quote(t) for t in (f"optimized_{wl.name}.py", wl.name))
    backend = run.results[p]["recipe"]["backend"] if p else ""
    command = profile_command(wl, args)
    # the script's primary runs on the CPU (no GPU here, or a CPU route won): GPU timers and kernel tools find nothing
    on_gpu = run.where == "cuda" and ((run.results.get(p) or {}).get("device_time") or {}).get("mode") != "cpu"
    L = ["Commands:", "",
         (f"- The original, line by line and call by call: `{command}` (its arguments' dtypes and shapes, seeded "
          "random values)" if command else
          f"- The original: `gpuspeed profile --function` takes arrays and numbers as --input, and {wl.func}'s "
          "arguments are not all of those: profile a script that calls it"),
         f"- The script on the CPU, function by function: `python -m cProfile -s cumtime {script} --cpu` (its CPU "
         "fallback and its check against the original)",
         f"- The optimized script's own benchmark (warm-up, median; CUDA events on a GPU): `python {script} --bench`"]
    if on_gpu:
        L += ["- torch timing by hand: `s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing="
              "True); s.record(); f(x); e.record(); torch.cuda.synchronize(); s.elapsed_time(e)`",
              "- CuPy timing by hand: `cupyx.profiler.benchmark(f, (x,), n_repeat=100)` or `cupy.cuda.Event()` pairs",
              f"- Timeline: `nsys profile -t cuda,nvtx,osrt -o {name} python {script} --bench`",
              f"- Kernels: `ncu --set full -k regex:. -c 20 python {script} --bench` (memory throughput, occupancy)",
              f"- gpuspeed: `gpuspeed profile {script} --bench` (GPU busy/idle, launch gaps, syncs, transfers)"]
    else:
        L += [f"- gpuspeed: `gpuspeed profile {script} --bench` (Python hotspots and CPU ops, each at its source line)",
              "- The script's primary runs on the CPU: GPU timers, nsys and ncu would find no kernels in it"
              + ("; the same optimize run on a GPU machine tries the GPU candidates" if run.where != "cuda" else "")]
    L += ["", "The levers that matter here:", ""]
    levers = []
    if run.hot.get("float64"):
        levers.append("**precision**: float64 -> float32 halves the bytes and avoids the FP64 cliff of consumer cards "
                      "(RTX 4070: 1/64 rate); kept only within the stated tolerance")
    if run.chunking.get("axes") is not None or any(r.get("chunk_size") for r in run.results.values()):
        levers.append("**chunk size**: the largest chunk under budget x 0.85 keeps kernels large; two streams hide the "
                      "transfers behind compute")
    e2e = run.choice.get("speedup_e2e")
    if e2e is not None and (run.choice.get("speedup") or 0) > 1.5 * e2e:
        levers.append("**data residency**: end to end is transfer-bound; keep arrays on the GPU between calls, pin "
                      "host buffers, overlap copies on a second stream")
    if backend in ("torch_compile", "torch"):
        levers.append("**compile mode / CUDA graphs**: reduce-overhead (graph replay) for small launch-bound calls, "
                      "max-autotune for large reductions")
    hottest = max(run.hot.get("hot_loops") or [{}], key=lambda lp: lp.get("share") or 0)
    if run.hot.get("sequential"):  # its iterations are ordered: one thread per iteration would be a wrong answer
        levers.append(f"**the loop** (line {hottest.get('line')}) is sequential: its iterations cannot be GPU threads; "
                      "Numba on the CPU runs it compiled, and a rewrite as a scan (cumsum, associative_scan) is the "
                      "GPU route where the step is associative")
    elif run.hot.get("loop_bound") and hottest.get("kind") == "reduction":  # its threads combine results: no map
        levers.append(f"**the loop** (line {hottest.get('line')}) is a reduction: {hottest.get('verdict')}; a hand "
                      "kernel in `variants` reduces within each block, then across blocks; `gpuspeed kernel` reports "
                      "its occupancy and roof position")
    elif run.hot.get("loop_bound"):
        levers.append("**the loop**: a hand kernel (Triton / Numba CUDA, one thread per outer iteration, 128-256 "
                      "threads per block) in `variants`; `gpuspeed kernel` reports its occupancy and roof position")
    levers.append("**fusion**: one kernel per expression instead of one per NumPy op (torch.compile, "
                  "cupy.fuse / ElementwiseKernel) cuts memory traffic")
    L += [f"{i + 1}. {lv}" for i, lv in enumerate(levers[:3])]
    return L


def plot(run, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    # timed as the run ranked them; bars are speedups over the original on a linear axis: the fastest reads longest
    key = "e2e_time" if run.params.get("rank_by") == "e2e" else "device_time"
    names, times, colors, refused = [], [], [], []
    for name, r in run.results.items():
        t = _t(r, key)
        if t:
            names.append(name)
            times.append(t)
            # timed, then refused (over the budget): red, so it is not read as one the choice passed over
            refused.append("" if r.get("status") == "ok" else f" ({status_word(r)})")
            colors.append("tab:red" if refused[-1] else "tab:green" if name == run.choice.get("primary") else
                          "tab:gray" if name == "original" else "tab:blue")
    fig, axes = plt.subplots(1, 2, figsize=(12, max(3, 0.4 * len(names) + 1.5)))
    ax = axes[0]
    base = times[names.index("original")] if "original" in names else None
    # no original time to divide: calls per second, which also grows with speed
    values = [base / t if base else 1 / t for t in times]
    label = "speedup_e2e" if key == "e2e_time" else "speedup"
    said = list(refused)
    for i, name in enumerate(names):  # a speedup replaced by its confirmation (or rescaled by it): the bar the report states
        sp = run.results[name].get(label) or {}
        if base and (sp.get("confirmed") or sp.get("rescaled")):
            values[i] = sp["speedup"]
            said[i] += " (timed alternately)" if sp.get("confirmed") else " (rescaled)"
    if names:
        ax.barh(names, values, color=colors)
        if base:
            ax.axvline(1.0, color="black", linestyle=":", linewidth=1)
        for y, (v, t, why) in enumerate(zip(values, times, said, strict=True)):
            ax.text(v, y, (f" {v:.3g}x, {format_time(t)}" if base else f" {format_time(t)}") + why, va="center",
                    fontsize=8)
        ax.set_xlim(0, max(values) * (1.6 if any(said) else 1.35))  # room for the longest bar's label
    timed = "end to end, casts included" if key == "e2e_time" else "device-resident"
    ax.set_xlabel(f"speedup over the original ({timed}; longer is faster)" if base else
                  f"calls per second ({timed}; longer is faster)")
    ax.set_title(f"{run.wl.name}: candidates (primary green" + (", refused red)" if any(refused) else ")"))
    ax.invert_yaxis()
    ax2 = axes[1]
    pr = run.projection
    from gpuspeed import device as _device

    here = _device.get_device(run.where).datasheet if run.where == "cuda" else None
    target = _device.datasheet_for(run.params["target_gpu"])
    import numpy as np

    unit = pr.get("unit", "fp32")
    ai = np.logspace(-2, 3, 100)
    for sheet, style in ((here, "-"), (target, "--")):
        if sheet:
            peak = (sheet.peak(unit) or sheet.fp32_TFLOPs) * 1e3  # GFLOP/s
            ax2.plot(ai, np.minimum(ai * sheet.mem_GBps, peak), style, label=f"{sheet.name} ({unit}, datasheet)")
    if pr.get("ai"):
        ax2.plot([pr["ai"]], [pr["achieved_TFLOPs"] * 1e3], "o", color="tab:green", label="primary, measured here")
        if pr.get("projected_s"):
            ax2.plot([pr["ai"]], [pr["flops"] / pr["projected_s"] / 1e9], "s", color="tab:orange",
                     label="primary on the target (projection)")
    else:
        ax2.text(0.05, 0.9, "FLOPs not counted: no point placed", transform=ax2.transAxes, fontsize=8)
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("arithmetic intensity (FLOP/byte of least traffic)")
    ax2.set_ylabel("GFLOP/s")
    ax2.set_title("the primary on the roofline")
    ax2.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    try:
        fig.savefig(tmp, dpi=100)
        tmp.replace(path)  # a failed save leaves no half-written plot
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return path


def results_doc(run) -> dict:
    from gpuspeed.results import make_results

    ch = run.choice
    prim = run.results.get(ch.get("primary") or "", {})
    orig = run.results.get("original", {})
    summary = {
        "primary": ch.get("primary"), "alternative": ch.get("alternative"), "best_dropin": ch.get("best_dropin"),
        "original_s": _t(orig), "primary_s": _t(prim) if prim else None,
        "primary_e2e_s": _t(prim, "e2e_time") if prim else None, "speedup": ch.get("speedup"),
        "speedup_ci_low": (ch.get("speedup_ci") or [None, None])[0],
        "speedup_ci_high": (ch.get("speedup_ci") or [None, None])[1], "speedup_e2e": ch.get("speedup_e2e"),
        "speedup_established": None if not prim or ch.get("kept_original") else not ch.get("caveats"),
        "over_best_dropin": ch.get("over_best_dropin"),
        "correct": None if prim.get("nondeterministic") else bool(prim),  # None: not verifiable
        # a CPU candidate on a GPU machine holds no GPU memory; without a GPU nothing was held against the budget
        "within_budget": None if not prim or run.where != "cuda" else prim.get("fits_budget") is not False,
        "peak_bytes": prim.get("peak_bytes") if prim else None,
        "max_abs_err": prim.get("max_abs_err") if prim else None,
        "max_rel_err": prim.get("max_rel_err") if prim else None,
        "candidates": len(run.results) - 1,
        "candidates_correct": sum(1 for n, r in run.results.items() if n != "original" and r.get("status") == "ok"),
        "minutes": run.elapsed_s / 60,  # the whole run, its report and script included
        "within_time_budget": run.elapsed_s <= run.params.get("time_budget_s", float("inf")),
        "projected_target_s": run.projection.get("projected_s") or run.projection.get("memory_bound_s"),
    }
    conf = ch.get("confirmation") or {}
    # the speedup timed alternately with the original in one process (None: nothing to confirm)
    # where the original stays, the confirmation is of the candidate that lost its place to it: named, so a "confirmed"
    # is not read as the primary's
    summary |= {"confirmed": conf.get("status") == "ok" if conf else None, "confirmation_candidate": conf.get("candidate"),
                "confirmation_rounds": conf.get("rounds"), "confirmation_ratio": conf.get("ratio"),
                "confirmation_low": conf.get("low"), "confirmation_high": conf.get("high"),
                "confirmation_original_s": conf.get("original_s"), "confirmation_primary_s": conf.get("candidate_s"),
                "confirmation_agreed": conf.get("agreed"), "confirmation_replaced": conf.get("replaced")}
    rows = table_rows(run)
    study = study_name(run.wl.name)
    return make_results(study, params=run.params, summary=summary, rows=rows,
                        notes=run.notes + [f"plan: {r['backend']}: {r['decision']} ({r['why']})" for r in run.plan_rows]
                        + [f"why below 2x: {w}" for w in ch.get("why_not_2x", [])]
                        + ([f"why not on a GPU: {ch['why_not_gpu']}"] if ch.get("why_not_gpu") else []), device=run.where) | {
        "hotspots": run.hot, "plan": run.plan_rows, "choice": ch, "projection": run.projection,
        "chunking": run.chunking, "confirmation": ch.get("confirmation")}


def study_name(name: str) -> str:
    """The results study of a workload: named in letters, digits, _ and -, so a workload file named `my-work.v2.py` or
    `my work.py` is still one (its report and script keep the file's own name)."""
    return "optimize_" + re.sub(r"[^\w-]", "_", name)


def outputs(name: str) -> list[str]:
    """The files a finished run writes in its folder, beside the candidates it ran: what a new run there removes
    first (a rerun stopped half-way leaves none of the last run's results beside its own)."""
    return ["report.md", f"{study_name(name)}.json", f"optimize_{name}.png", f"optimized_{name}.py"]


def write(run) -> dict:
    from gpuspeed.results import write_results

    from gpuspeed.results import write_text_atomic
    from gpuspeed.errors import one_line

    out = run.out_dir
    try:
        png = plot(run, out / f"optimize_{run.wl.name}.png")
    except Exception as exc:  # a full disk, a broken backend: the report and the numbers must not be lost over a plot
        png = None
        (out / f"optimize_{run.wl.name}.png").unlink(missing_ok=True)  # an earlier run's would be read as this one's
        run.notes.append(f"plot failed: {one_line(exc)}; optimize_{run.wl.name}.png was not drawn (the numbers are in "
                         "report.md and the JSON)")
    doc = results_doc(run)
    jpath = write_results(doc, out)
    md = out / "report.md"
    run.paths["script"] = str(out / f"optimized_{run.wl.name}.py")
    write_text_atomic(md, markdown(run))
    return {"report": str(md), "json": str(jpath), "png": str(png) if png else None}
