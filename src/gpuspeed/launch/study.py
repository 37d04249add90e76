"""The launch study: the tiny-kernel sweep, the 1000-op chain and the fusion study, as one results document.

Sweep, chain and fusion live in their own modules (sweep.py, chains.py, fusion.py); the fit in fit.py;
the Markdown and PNG in report.py. Everything is timed through gpuspeed.timing and checked through
gpuspeed.verify.
"""

from __future__ import annotations

import contextlib
import math
import numbers

from gpuspeed import device as _device
from gpuspeed.errors import UserError
from gpuspeed.launch import fusion
from gpuspeed.launch.chains import chain_rtol, tiny_chain
from gpuspeed.launch.fit import fit_linear
from gpuspeed.launch.fusion import VARIANTS, fusion_study
from gpuspeed.launch.sweep import TINY_N, Progress, launch_sweep

GPU_KS = tuple(2**i for i in range(13))  # 1 .. 4096
CPU_KS = tuple(2**i for i in range(9))  # 1 .. 256
GPU_NS = (1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000)
CPU_NS = (1_000, 10_000, 100_000, 1_000_000)
CHAIN_TINY = 1000  # ops in the chain whose graph speedup the issue asks for
MAX_KERNELS = 65536  # K, --tiny-k: a captured graph of this many kernels already takes seconds to build
MAX_CHAIN = 1024  # --chain-k: torch.compile traces every op of the chain, per N (minutes past this)
MAX_N = 10**10  # --ns: 40 GB per fp32 copy, past any GPU's memory with the study's copies (check_fits says more)
MAX_BUDGET_S = 3600.0  # --budget: seconds per measurement; an hour is already far past any noise target

TARGETS = {"graph_us_per_kernel": ("<=", 1.1), "chain1000_graph_speedup": (">=", 6.0),
           "compiled_chain_over_copy_at_1e8": ("<=", 1.10)}


def count_steps(ks, ns, variants, where: str) -> int:
    backends = 1 if where != "cuda" else 3
    graph = len(ks) if where == "cuda" else 0
    return len(ks) * backends + graph + 2 + fusion.steps(ns, variants)


def _whole_numbers(flag: str, values) -> list:
    """The values as ints; a fraction (K=2.5 ran as K=2), a non-number or a value given twice (K measured twice,
    and the fit failed after the whole sweep) is one line naming the flag."""
    try:
        values = list(values)
    except TypeError:
        values = [values]
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise UserError(f"{flag} takes whole numbers, got {v!r}")
        if not math.isfinite(v) or v != int(v):
            raise UserError(f"{flag} takes whole numbers, got {v!r}")
        out.append(int(v))
    twice = next((v for i, v in enumerate(out) if v in out[:i]), None)
    if twice is not None:
        raise UserError(f"{flag} names {twice} more than once")
    return out


def check_params(ks, ns, chain_k: int, tiny_k: int, budget_s: float | None, variants) -> tuple:
    """Raise UserError on a bad request before anything is measured; returns (ks, ns) as lists of ints (None
    stays None: the defaults)."""
    ks, ns = (None if v is None else _whole_numbers(flag, v) for flag, v in (("--ks", ks), ("--ns", ns)))
    (chain_k,), (tiny_k,) = _whole_numbers("--chain-k", [chain_k]), _whole_numbers("--tiny-k", [tiny_k])
    for flag, values in (("--ks", ks or ()), ("--ns", ns or ()), ("--chain-k", [chain_k]), ("--tiny-k", [tiny_k])):
        low = next((v for v in values if v < 1), None)
        if low is not None:  # name the flag: "K, N and chain lengths must be positive" left the user to guess
            raise UserError(f"{flag} must be 1 or more, got {low}")
    if max(ks or (1,)) > MAX_KERNELS or tiny_k > MAX_KERNELS:  # --ks 1e12 ran for ever, showing nothing
        raise UserError(f"K and --tiny-k go up to {MAX_KERNELS} kernels (each is launched and captured into a "
                        f"graph), got {max(max(ks or (1,)), tiny_k)}")
    if chain_k > MAX_CHAIN:
        raise UserError(f"--chain-k goes up to {MAX_CHAIN} ops (torch.compile traces each one), got {chain_k}")
    if max(ns or (1,)) > MAX_N:  # --ns 1e30 was refused by check_fits with a 23-digit GiB figure
        raise UserError(f"--ns goes up to {MAX_N:.0e} elements (fp32 vectors the fusion study copies several "
                        f"times), got {fusion.format_n(max(ns))}")
    if budget_s is not None and not 0 < budget_s < math.inf:  # NaN too
        raise UserError(f"budget must be a positive number of seconds, got {budget_s}")
    if budget_s is not None and budget_s > MAX_BUDGET_S:  # 1e30 ran on, each measurement to its sample cap
        raise UserError(f"--budget is seconds per measurement, at most {MAX_BUDGET_S:.0f}, got {budget_s:g}")
    bad = [v for v in (variants or ()) if v not in VARIANTS]
    if bad:
        raise UserError(f"unknown variant {bad[0]!r}: choose from {', '.join(VARIANTS)}")
    variants = list(variants or ())
    twice = next((v for i, v in enumerate(variants) if v in variants[:i]), None)
    if twice is not None:  # each variant would be built and timed twice
        raise UserError(f"--variants names {twice} more than once")
    return ks, ns


def check_fits(n: int, where: str) -> None:
    """A one-line error before anything runs when the fusion study's largest N cannot fit: its rotated input
    copies, the output and the variants' buffers (fp32), and the float64 reference on the host."""
    from gpuspeed.inputs import gpu_available_bytes, host_available_bytes

    device_bytes = (fusion._rotation(n, where) + 6) * 4 * n
    need = [("host", 3 * 8 * n + (device_bytes if where != "cuda" else 0), host_available_bytes())]
    if where == "cuda":
        need.append(("GPU", device_bytes, gpu_available_bytes("cuda")))
    for what, needed, free in need:
        if free is not None and needed > free:
            raise UserError(f"the fusion study at N={fusion.format_n(n)} needs ~{needed / 2**30:.1f} GiB of {what} memory, "
                            f"{free / 2**30:.1f} GiB is free: pass smaller --ns")


def run_launch(device: str = "auto", ks=None, ns=None, chain_k: int = 8, tiny_k: int = CHAIN_TINY,
               variants=None, budget_s: float | None = None, progress: Progress | None = None, out=None) -> dict:
    """The whole study: sweep, 1000-op chain, fusion. Returns the results document (not yet written). With `out`, a
    run stopped part-way (Ctrl-C, SIGTERM: gpuspeed.results.stop_signals) writes the rows it measured there, in a
    document marked partial (launch.json, launch.md, launch.png), and one line says so."""

    where = _device.resolve_device(device)
    gpu = where == "cuda"
    # checked before they become ints: int(2.5) ran K=2 without a word; ks=[] or None means the defaults
    ks = (GPU_KS if gpu else CPU_KS) if ks is None or (isinstance(ks, (list, tuple)) and not ks) else ks
    ns = (GPU_NS if gpu else CPU_NS) if ns is None or (isinstance(ns, (list, tuple)) and not ns) else ns
    variants = tuple(variants or VARIANTS)
    budget_s = budget_s if budget_s is not None else (0.5 if gpu else 0.2)
    ks, ns = (tuple(v) for v in check_params(ks, ns, chain_k, tiny_k, budget_s, variants))
    chain_k, tiny_k = int(chain_k), int(tiny_k)
    check_fits(max(ns), where)
    progress = progress or (lambda what: None)
    notes: list[str] = []
    if not gpu:
        notes.append(f"{_device.why_cpu()}: CPU run at small sizes (launch numbers are CPU dispatcher costs)")
        notes.append("CPU fusion study: inputs are not rotated past the CPU's caches, so copy_roof_GBps and the "
                     "% of it are cache bandwidth at these N, not main-memory bandwidth")

    sweep_rows: list[dict] = []
    chain_rows: list[dict] = []
    fusion_rows: list[dict] = []
    done: dict = {}

    def keep():  # stopped part-way: the rows measured so far, in a document marked partial
        if not (sweep_rows or chain_rows or fusion_rows):
            return None
        if "fusion" not in done:
            fusion.flag_non_monotone(fusion_rows)
            fusion.add_roof(fusion_rows)
        stage = next((w for s, w in (("sweep", "sweep"), ("chain", "chain"), ("fusion", "fusion study"))
                      if s not in done), "summary")
        stopped = f"stopped during the {stage} with {len(sweep_rows) + len(chain_rows) + len(fusion_rows)} rows done"
        doc = _document(where, ks, ns, chain_k, tiny_k, variants, budget_s, sweep_rows, chain_rows, fusion_rows,
                        done.get("fits") or _fits_of(sweep_rows), done.get("chain") or {}, notes, partial=stopped)
        from gpuspeed.launch.report import write_artifacts
        from gpuspeed.results import partial_kept_words, partial_stem

        stem = partial_stem(out, "launch")  # a complete launch.json there is kept
        paths = write_artifacts(doc, out, stem)
        return f"{stopped}; they are {partial_kept_words(paths, stem, 'launch', 'plot')}"

    from gpuspeed.results import stop_signals

    with stop_signals(keep) if out is not None else contextlib.nullcontext():
        _, done["fits"] = launch_sweep(ks, where, budget_s, progress, notes, rows=sweep_rows)
        done["sweep"] = True
        _, done["chain"] = tiny_chain(tiny_k, where, budget_s, progress, notes, rows=chain_rows)
        fusion_study(ns, chain_k, variants, where, budget_s, progress, notes, rows=fusion_rows)
        done["fusion"] = True
    return _document(where, ks, ns, chain_k, tiny_k, variants, budget_s, sweep_rows, chain_rows, fusion_rows,
                     done["fits"], done["chain"], notes)


def _fits_of(sweep_rows: list[dict]) -> dict:
    """The per-launch fits of the sweep rows measured so far (a run stopped during the sweep)."""
    fits = {}
    for variant in dict.fromkeys(r["variant"] for r in sweep_rows):
        ok = [r for r in sweep_rows if r["variant"] == variant and "time_s" in r]
        if len(ok) >= 2:
            fits[variant] = fit_linear([r["K"] for r in ok], [r["time_s"] for r in ok])
    return fits


def _document(where, ks, ns, chain_k, tiny_k, variants, budget_s, sweep_rows, chain_rows, fusion_rows, fits, chain,
              notes, partial: str | None = None) -> dict:
    """The results document of the study's rows; `partial` (how the run was stopped, in words) marks one cut short:
    params partial true, a note first, the summary figures of what did not run null."""
    from gpuspeed.results import make_results

    gpu = where == "cuda"
    notes = list(notes)
    if partial:
        notes.insert(0, f"partial: {partial}; what did not run has no rows and its summary figures are null: rerun "
                        "gpuspeed launch for the whole study")

    def fit_us(name, attr):
        f = fits.get(name)
        return getattr(f, attr) * 1e6 if f else None

    copy_1e8 = next((r for r in fusion_rows if r["variant"] == "copy" and r["N"] == 100_000_000), None)
    comp_1e8 = next((r for r in fusion_rows if r["variant"] == "compiled" and r["N"] == 100_000_000), None)
    copy_roof = max((r["GBps"] for r in fusion_rows if r["variant"] == "copy" and "GBps" in r), default=None)
    summary = {
        "eager_us_per_launch": fit_us("eager-torch", "per_s"),
        "eager_us_per_launch_err": fit_us("eager-torch", "per_err_s"),
        "eager_fixed_us": fit_us("eager-torch", "fixed_s"),
        "triton_us_per_launch": fit_us("eager-triton", "per_s"),
        "cupy_us_per_launch": fit_us("eager-cupy", "per_s"),
        "graph_us_per_kernel": fit_us("graph", "per_s"),
        "graph_us_per_kernel_err": fit_us("graph", "per_err_s"),
        "graph_fixed_us": fit_us("graph", "fixed_s"),
        f"chain{tiny_k}_eager_us": chain["eager_s"] * 1e6 if chain.get("eager_s") else None,
        f"chain{tiny_k}_graph_us": chain["captured_s"] * 1e6 if chain.get("captured_s") else None,
        f"chain{tiny_k}_eager_wall_us": chain["eager_wall_s"] * 1e6 if chain.get("eager_wall_s") else None,
        f"chain{tiny_k}_graph_speedup": chain.get("speedup"),
        f"chain{tiny_k}_graph_wall_us": chain["captured_wall_s"] * 1e6 if chain.get("captured_wall_s") else None,
        f"chain{tiny_k}_graph_speedup_events": chain.get("speedup_events"),
        "compiled_chain_over_copy_at_1e8": (comp_1e8["time_s"] / copy_1e8["time_s"]
                                            if comp_1e8 and copy_1e8 and "time_s" in comp_1e8
                                            and "time_s" in copy_1e8 else None),
        "copy_roof_GBps": copy_roof,
        "checks_passed": all(r.get("check_passed", True) for r in chain_rows + fusion_rows),
        "fusion_unreliable_points": sum(1 for r in fusion_rows if r.get("unreliable")),
        "errors": sum(1 for r in sweep_rows + chain_rows + fusion_rows if "error" in r),
    }
    for key, (op, target) in TARGETS.items():
        if key not in summary:  # a chain of another length (--tiny-k): the 1000-op target does not apply
            notes.append(f"{key}: its target ({op} {target}) is judged at --tiny-k {CHAIN_TINY} only")
            continue
        v = summary[key]
        summary[f"{key}_target_met"] = None if v is None else (v <= target if op == "<=" else v >= target)
    params = {"device": where, "ks": list(ks), "ns": list(ns), "chain_k": chain_k, "tiny_k": tiny_k,
              "tiny_n": TINY_N, "variants": list(variants), "budget_s": budget_s, "dtype": "float32",
              "fusion_rounds": fusion.ROUNDS,
              "targets": {k: f"{op} {t}" for k, (op, t) in TARGETS.items()},
              "fits": {k: f.to_dict() for k, f in fits.items()}}
    if partial:
        params["partial"] = True
    if gpu:
        notes.append("eager sweep: host wall time from synchronize to synchronize over K launches, median of "
                     "repeats; graph sweep and chains: bench() with CUDA events, warm cache (flush=False) so the "
                     "L2 flush cannot hide launch gaps; fusion inputs rotate through ~2x L2 of copies instead")
        notes.append(f"chain{tiny_k}_graph_speedup: host wall time of one call (synchronize to synchronize), eager "
                     f"over replay; chain{tiny_k}_graph_speedup_events: the same ratio from bench() on CUDA events")
    else:  # the CPU run has no events, no L2 flush and no graphs: say what its clock was
        notes.append("eager sweep: host wall time over K launches, median of repeats; chains and fusion: bench() on "
                     "the host clock (perf_counter)")
    flagged = [f"{r['variant']} N={fusion.format_n(r['N'])}" for r in fusion_rows if r.get("unreliable")]
    notes.append(f"fusion: each point is the median of {fusion.ROUNDS} interleaved rounds of bench() after every "
                 "point of its N was built and warmed; a point is flagged unreliable (hollow in the plot) when its "
                 "samples are noisy, its rounds disagree, or it is slower than the same variant at a larger N"
                 + (f"; flagged: {', '.join(flagged)}" if flagged else "; none flagged"))
    notes.append("fit: weighted least squares (weights 1/T^2) of T(K) = fixed + per_launch*K, standard errors")
    notes.append(f"checks: float64 reference on the host, rtol {chain_rtol(chain_k):.1e} for the {chain_k}-op "
                 f"chain and {chain_rtol(tiny_k):.1e} for the {tiny_k}-op chain (~1 ulp per op)")
    return make_results("launch", params=params, summary=summary, rows=sweep_rows + chain_rows + fusion_rows,
                        notes=notes, device=where)
