"""Launch overhead: the tiny-kernel sweep, the 1000-op chain, the fusion study, the fit; their report.

Sweep: K = 1..4096 tiny kernels in a row. Eager cost is host wall time from a synchronize to a
synchronize (torch op, Triton kernel, CuPy kernel); graph cost is a replayed capture() timed with
bench() on CUDA events. Both are fitted to T(K) = fixed + per_launch * K by weighted least squares.
Fusion: a chain of K elementwise ops over N elements, eager vs torch.compile (default, reduce-overhead)
vs hand capture() of each, against one device-to-device copy of N elements (the copy roof).
Everything is timed through gpuspeed.timing and checked through gpuspeed.verify.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from gpuspeed import device as _device
from gpuspeed import graphs, timing, verify
from gpuspeed.errors import UserError

GPU_KS = tuple(2**i for i in range(13))  # 1 .. 4096
CPU_KS = tuple(2**i for i in range(9))  # 1 .. 256
GPU_NS = (1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000)
CPU_NS = (1_000, 10_000, 100_000, 1_000_000)
VARIANTS = ("eager", "compiled", "reduce-overhead", "captured", "captured-compiled")
TINY_N = 1024  # elements of a "tiny" kernel: launch cost, not work
CHAIN_TINY = 1000  # ops in the chain whose graph speedup the issue asks for
CHECK_ELEMENTS = 1_000_000  # fusion outputs are checked on an evenly strided subsample this big

Progress = Callable[[str], None]


# ---------------------------------------------------------------------------------------------------
# The fit: T(K) = fixed + per * K
# ---------------------------------------------------------------------------------------------------


@dataclass
class Fit:
    fixed_s: float
    per_s: float
    fixed_err_s: float
    per_err_s: float
    r2: float
    n: int

    def to_dict(self) -> dict:
        d = asdict(self)
        d |= {"fixed_us": self.fixed_s * 1e6, "per_us": self.per_s * 1e6, "fixed_err_us": self.fixed_err_s * 1e6,
              "per_err_us": self.per_err_s * 1e6}
        return d


def fit_linear(ks, times, relative: bool = True) -> Fit:
    """Weighted least squares of times = fixed + per * ks, with standard errors of both.

    relative=True weighs each point by 1/time^2 (its noise grows with its size), so K = 1 counts as
    much as K = 4096. Errors: sqrt(diag(s^2 (X^T W X)^-1)), s^2 = weighted RSS / (n - 2).
    """
    k = np.asarray(ks, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if k.shape != t.shape or k.ndim != 1:
        raise UserError("fit_linear needs two 1-D sequences of the same length")
    ok = np.isfinite(t) & np.isfinite(k)
    k, t = k[ok], t[ok]
    if k.size < 2 or np.unique(k).size < 2:
        raise UserError("fit_linear needs at least two distinct K values")
    if relative and np.any(t <= 0):
        raise UserError("fit_linear(relative=True) needs positive times")
    w = 1.0 / t**2 if relative else np.ones_like(t)
    x = np.stack([np.ones_like(k), k], axis=1)
    xtw = x.T * w
    cov_unscaled = np.linalg.inv(xtw @ x)
    beta = cov_unscaled @ (xtw @ t)
    resid = t - x @ beta
    dof = k.size - 2
    s2 = float(np.sum(w * resid**2) / dof) if dof > 0 else float("nan")
    err = np.sqrt(np.diag(cov_unscaled) * s2) if dof > 0 else np.array([math.nan, math.nan])
    tw_mean = np.sum(w * t) / np.sum(w)
    ss_tot = float(np.sum(w * (t - tw_mean) ** 2))
    r2 = 1.0 - float(np.sum(w * resid**2)) / ss_tot if ss_tot > 0 else float("nan")
    return Fit(fixed_s=float(beta[0]), per_s=float(beta[1]), fixed_err_s=float(err[0]), per_err_s=float(err[1]),
               r2=r2, n=int(k.size))


# ---------------------------------------------------------------------------------------------------
# Host wall time of K launches
# ---------------------------------------------------------------------------------------------------


def wall_time(launch: Callable[[], object], k: int, sync: Callable[[], None], repeats: int) -> list[float]:
    """Host wall seconds of `k` back-to-back launches, from a synchronize to a synchronize.

    Not bench(): the issue defines eager launch cost as this host wall time (issue + queue + the final
    wait), while bench() times device events, which would hide host-side launch cost behind queued work.
    """
    for _ in range(k):  # warm: JIT, caches, allocator
        launch()
    sync()
    out = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(k):
            launch()
        sync()
        out.append(time.perf_counter() - t0)
    return out


def _repeats(k: int, per_launch_s: float, budget_s: float) -> int:
    return int(max(5, min(31, budget_s / max(k * per_launch_s, 1e-9))))


def _tiny_backends(where: str, notes: list[str]) -> dict:
    """name -> (launch, sync) for one tiny kernel each: torch op, Triton kernel, CuPy kernel."""
    import torch

    if where != "cuda":
        x = torch.randn(TINY_N)
        notes.append("no CUDA device: the sweep times CPU torch ops (dispatcher cost); "
                     "Triton, CuPy and graph rows are skipped")
        return {"torch": (lambda: x.add_(1.0), lambda: None)}
    x = torch.randn(TINY_N, device="cuda")
    out = {"torch": (lambda: x.add_(1.0), torch.cuda.synchronize)}
    try:
        kernel = _triton_add()
        y = torch.randn(TINY_N, device="cuda")
        out["triton"] = (lambda: kernel[(1,)](y, TINY_N, BLOCK=TINY_N), torch.cuda.synchronize)
    except Exception as exc:
        notes.append(f"Triton row skipped: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    try:
        import cupy

        c = cupy.random.standard_normal(TINY_N, dtype=cupy.float32)
        dev = cupy.cuda.Device()
        out["cupy"] = (lambda: cupy.add(c, 1.0, out=c), dev.synchronize)
    except Exception as exc:
        notes.append(f"CuPy row skipped: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    return out


_TRITON_KERNEL = None


def _triton_add():
    """A one-block Triton kernel that adds 1 in place (built once, lazily: triton is optional)."""
    global _TRITON_KERNEL
    if _TRITON_KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def tiny_add(x_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)

        _TRITON_KERNEL = tiny_add
    return _TRITON_KERNEL


def _adds(k: int):
    """k in-place adds on x: the graph sweep's body."""
    def body(x):
        for _ in range(k):
            x.add_(1.0)
        return x
    body.__name__ = f"adds_{k}"
    return body


def launch_sweep(ks, where: str, budget_s: float, progress: Progress, notes: list[str]) -> tuple[list, dict]:
    """Rows and fits of the tiny-kernel sweep."""
    import torch

    rows: list[dict] = []
    fits: dict = {}
    est = 10e-6 if where == "cuda" else 3e-6
    for name, (launch, sync) in _tiny_backends(where, notes).items():
        ks_ok, meds = [], []
        for k in ks:
            progress(f"sweep {name} K={k}")
            row = {"study": "sweep", "variant": f"eager-{name}", "K": k, "clock": "host wall"}
            try:
                samples = wall_time(launch, k, sync, _repeats(k, est, budget_s))
                med = float(np.median(samples))
                row |= {"time_s": med, "us_per_launch": med / k * 1e6, "n": len(samples),
                        "rel_iqr": float(np.subtract(*np.percentile(samples, [75, 25])) / med)}
                ks_ok.append(k)
                meds.append(med)
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            rows.append(row)
        if len(ks_ok) >= 2:
            fits[f"eager-{name}"] = fit_linear(ks_ok, meds)
    if where != "cuda":
        return rows, fits

    ks_ok, meds = [], []
    x = torch.randn(TINY_N, device="cuda")
    for k in ks:
        progress(f"sweep graph K={k}")
        row = {"study": "sweep", "variant": "graph", "K": k, "clock": "cuda events"}
        try:
            g = graphs.capture(_adds(k), x)
            m = timing.bench(g.replay, name=f"graph K={k}", device="cuda", mode="events", flush=False,
                             budget_s=budget_s)
            row |= {"time_s": m.median, "us_per_launch": m.median / k * 1e6, "n": m.n, "rel_iqr": m.rel_iqr,
                    "rel_noise": m.rel_noise, "throttled": m.throttled}
            ks_ok.append(k)
            meds.append(m.median)
            del g
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        rows.append(row)
    if len(ks_ok) >= 2:
        fits["graph"] = fit_linear(ks_ok, meds)
    return rows, fits


# ---------------------------------------------------------------------------------------------------
# Elementwise chains
# ---------------------------------------------------------------------------------------------------


def make_chain(k: int) -> Callable:
    """x -> K elementwise ops, alternating *1.001 and -0.001: one kernel and one HBM round trip each."""
    if k < 1:
        raise UserError("a chain needs at least one op")

    def chain(x):
        for i in range(k):
            x = x * 1.001 if i % 2 == 0 else x - 0.001
        return x

    chain.__name__ = f"chain{k}"
    return chain


def chain_rtol(k: int) -> float:
    """fp32 tolerance for a K-op chain: rounding grows at most ~1 ulp per op (2^-24 each), x2 margin."""
    return max(verify.TOLERANCES["float32"], 2 * k * 2.0**-24 * 4)


def _check_chain(out, x, k: int) -> verify.CheckResult:
    """Check out == chain(x) against a float64 reference on an evenly strided subsample."""
    step = max(1, x.numel() // CHECK_ELEMENTS)
    ref = make_chain(k)(x[::step].detach().double().cpu())
    return verify.check(out[::step], ref, rtol=chain_rtol(k), dtype="float32")


def _err_text(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def tiny_chain(k: int, where: str, budget_s: float, progress: Progress, notes: list[str]) -> tuple[list, dict]:
    """Eager vs a replayed capture() of a K-op chain on TINY_N elements, both timed with bench()."""
    import torch

    rows: list[dict] = []
    fn = make_chain(k)
    dev = "cuda" if where == "cuda" else "cpu"
    x = torch.randn(TINY_N, device=dev)
    times: dict = {}
    for variant in ("eager", "captured"):
        progress(f"chain{k} {variant}")
        row = {"study": "chain", "variant": variant, "K": k, "N": TINY_N}
        try:
            if variant == "eager":
                run = lambda: fn(x)  # noqa: E731
                out = fn(x)
            else:
                if where != "cuda":
                    row["skipped"] = "no CUDA device to capture on"
                    rows.append(row)
                    continue
                g = graphs.capture(fn, x)
                verify.poison(g.static_outputs)
                out = g(x)
                run = g.replay
            res = _check_chain(out, x, k)
            row |= {"check_passed": res.passed, "rel_l2_err": res.rel_l2_err}
            m = timing.bench(run, name=f"chain{k} {variant}", device=dev, mode="events" if dev == "cuda" else "cpu",
                             flush=False, budget_s=budget_s)
            row |= {"time_s": m.median, "us_per_op": m.median / k * 1e6, "n": m.n, "rel_noise": m.rel_noise,
                    "mode": m.mode, "throttled": m.throttled}
            times[variant] = m.median
            if where == "cuda":
                # what one call costs its caller: host wall time from a synchronize to a synchronize
                wall = float(np.median(wall_time(run, 1, torch.cuda.synchronize, 15)))
                row["wall_s"] = wall
                times[f"{variant}_wall"] = wall
            if variant == "captured":
                row["identical_to_eager"] = bool(torch.equal(out, fn(x)))
        except Exception as exc:
            row["error"] = _err_text(exc)
        rows.append(row)
    both = "eager" in times and "captured" in times
    # the headline compares like with like and is the conservative one: host wall time of one call,
    # synchronize to synchronize, on both sides (bench()'s events ratio is kept beside it)
    walls = "eager_wall" in times and "captured_wall" in times
    speedup = times["eager_wall"] / times["captured_wall"] if walls else None
    speedup_events = times["eager"] / times["captured"] if both else None
    return rows, {"eager_s": times.get("eager"), "eager_wall_s": times.get("eager_wall"),
                  "captured_s": times.get("captured"), "captured_wall_s": times.get("captured_wall"),
                  "speedup": speedup, "speedup_events": speedup_events}


def _rotation(n: int, where: str) -> int:
    """Input copies to cycle through so each call reads cold data: ~2x L2 in all, at most 64."""
    if where != "cuda":
        return 1
    return int(min(64, max(1, math.ceil(2 * _device.l2_bytes() / (4 * n)))))


def _cycler(fns: list, xs: list) -> Callable:
    i = [0]

    def run():
        j = i[0] % len(xs)
        i[0] += 1
        return fns[j % len(fns)](xs[j])

    return run


def fusion_study(ns, k: int, variants, where: str, budget_s: float, progress: Progress,
                 notes: list[str]) -> list[dict]:
    """Each variant of a K-op chain at each N, plus one copy of N elements; rows with time, bytes, GB/s."""
    import torch

    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise UserError(f"unknown variant(s) {', '.join(unknown)}: choose from {', '.join(VARIANTS)}")
    dev = "cuda" if where == "cuda" else "cpu"
    fn = make_chain(k)
    rows: list[dict] = []
    if where != "cuda" and any(v.startswith("captured") for v in variants):
        notes.append("no CUDA device: captured variants run eagerly (capture() falls back)")
    for n in ns:
        # fresh compiles per N: static shapes give one kernel per N, and dynamo's per-function recompile
        # limit (8) must not silently send later N back to eager (an H200 run at f8db08d did exactly that)
        torch._dynamo.reset()
        compiled: dict = {}
        r = _rotation(n, where)
        xs = [torch.randn(n, device=dev) for _ in range(r)]
        progress(f"fusion N={n:.0e} copy")
        dst = torch.empty(n, device=dev)
        row = {"study": "fusion", "variant": "copy", "N": n, "K": k, "rotate": r, "bytes": 2 * 4 * n}
        try:
            m = timing.bench(_cycler([dst.copy_], xs), name=f"copy N={n}", device=dev,
                             mode="events" if dev == "cuda" else "cpu", flush=False, budget_s=budget_s)
            row |= _timing_fields(m, row["bytes"])
        except Exception as exc:
            row["error"] = _err_text(exc)
        rows.append(row)
        dst = None
        for variant in variants:
            progress(f"fusion N={n:.0e} {variant}")
            fused = variant != "eager" and variant != "captured"
            # bytes by design: eager reads and writes N per op; fused once; reduce-overhead also copies
            # its (non-static) input into the graph's static buffer
            passes = 2 * k if not fused else (4 if variant == "reduce-overhead" else 2)
            row = {"study": "fusion", "variant": variant, "N": n, "K": k, "rotate": r, "bytes": passes * 4 * n}
            try:
                call, first = _build_variant(variant, fn, xs, compiled, where)
                res = _check_chain(first(), xs[0], k)
                row |= {"check_passed": res.passed, "rel_l2_err": res.rel_l2_err}
                m = timing.bench(call, name=f"{variant} N={n}", device=dev,
                                 mode="events" if dev == "cuda" else "cpu", flush=False, budget_s=budget_s)
                row |= _timing_fields(m, row["bytes"])
            except Exception as exc:
                row["error"] = _err_text(exc)
            rows.append(row)
            call = first = None
        del xs
        if dev == "cuda":
            torch.cuda.empty_cache()
    _add_roof(rows)
    return rows


def _timing_fields(m: timing.Measurement, nbytes: int) -> dict:
    return {"time_s": m.median, "median_us": m.median_us, "n": m.n, "rel_noise": m.rel_noise, "mode": m.mode,
            "throttled": m.throttled, "GBps": nbytes / m.median / 1e9}


def _build_variant(variant: str, fn, xs, compiled: dict, where: str):
    """(timed callable cycling through xs, a callable giving one checked output for xs[0])."""
    import torch

    def compiled_fn(mode: str):
        if mode not in compiled:
            # dynamic=False: one kernel specialized per N, as a user with fixed shapes gets; the H200 run
            # at e9b3288 (automatic dynamic shapes after the 2nd N) reached only ~40 % of the copy roof
            compiled[mode] = torch.compile(fn, mode=None if mode == "default" else mode, dynamic=False)
        return compiled[mode]

    if variant == "eager":
        return _cycler([fn], xs), lambda: fn(xs[0])
    if variant == "compiled":
        cf = compiled_fn("default")
        return _cycler([cf], xs), lambda: cf(xs[0]).clone()
    if variant == "reduce-overhead":
        rf = compiled_fn("reduce-overhead")

        def step(x):
            torch.compiler.cudagraph_mark_step_begin()  # an inference loop: the last outputs are dead
            return rf(x)
        return _cycler([step], xs), lambda: step(xs[0]).clone()
    inner = fn if variant == "captured" else compiled_fn("default")
    if where != "cuda":
        return _cycler([inner], xs), lambda: inner(xs[0])
    gs = [graphs.capture(inner, x) for x in xs]  # one graph per input copy: passed in place, no copy-in

    def first():
        verify.poison(gs[0].static_outputs)
        return gs[0](xs[0]).clone()
    return _cycler(gs, xs), first


def _add_roof(rows: list[dict]) -> None:
    """% of the copy roof (best copy GB/s over all N) and time over one copy at the same N."""
    copies = {r["N"]: r for r in rows if r["variant"] == "copy" and "time_s" in r}
    roof = max((r["GBps"] for r in copies.values()), default=None)
    for r in rows:
        if "GBps" in r and roof:
            r["pct_copy_roof"] = 100.0 * r["GBps"] / roof
        c = copies.get(r["N"])
        if c and "time_s" in r:
            r["over_copy"] = r["time_s"] / c["time_s"]


# ---------------------------------------------------------------------------------------------------
# The study
# ---------------------------------------------------------------------------------------------------

TARGETS = {"graph_us_per_kernel": ("<=", 1.1), "chain1000_graph_speedup": (">=", 6.0),
           "compiled_chain_over_copy_at_1e8": ("<=", 1.10)}


def count_steps(ks, ns, variants, where: str) -> int:
    backends = 1 if where != "cuda" else 3
    graph = len(ks) if where == "cuda" else 0
    return len(ks) * backends + graph + 2 + len(ns) * (1 + len(variants))


def check_params(ks, ns, chain_k: int, tiny_k: int, budget_s: float | None, variants) -> None:
    """Raise UserError on a bad request before anything is measured."""
    if any(k < 1 for k in ks or ()) or any(n < 1 for n in ns or ()) or chain_k < 1 or tiny_k < 1:
        raise UserError("K, N and chain lengths must be positive")
    if budget_s is not None and budget_s <= 0:
        raise UserError("budget must be positive")
    bad = [v for v in (variants or ()) if v not in VARIANTS]
    if bad:
        raise UserError(f"unknown variant {bad[0]!r}: choose from {', '.join(VARIANTS)}")


def run_launch(device: str = "auto", ks=None, ns=None, chain_k: int = 8, tiny_k: int = CHAIN_TINY,
               variants=None, budget_s: float | None = None, progress: Progress | None = None) -> dict:
    """The whole study: sweep, 1000-op chain, fusion. Returns the results document (not yet written)."""
    from gpuspeed.results import make_results

    where = _device.resolve_device(device)
    gpu = where == "cuda"
    ks = tuple(int(k) for k in (ks or (GPU_KS if gpu else CPU_KS)))
    ns = tuple(int(n) for n in (ns or (GPU_NS if gpu else CPU_NS)))
    variants = tuple(variants or VARIANTS)
    budget_s = budget_s if budget_s is not None else (0.5 if gpu else 0.2)
    check_params(ks, ns, chain_k, tiny_k, budget_s, variants)
    progress = progress or (lambda what: None)
    notes: list[str] = []
    if not gpu:
        notes.append("no CUDA device: CPU run at small sizes (launch numbers are CPU dispatcher costs)")

    sweep_rows, fits = launch_sweep(ks, where, budget_s, progress, notes)
    chain_rows, chain = tiny_chain(tiny_k, where, budget_s, progress, notes)
    fusion_rows = fusion_study(ns, chain_k, variants, where, budget_s, progress, notes)

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
        f"chain{tiny_k}_eager_us": chain["eager_s"] * 1e6 if chain["eager_s"] else None,
        f"chain{tiny_k}_graph_us": chain["captured_s"] * 1e6 if chain["captured_s"] else None,
        f"chain{tiny_k}_eager_wall_us": chain["eager_wall_s"] * 1e6 if chain["eager_wall_s"] else None,
        f"chain{tiny_k}_graph_speedup": chain["speedup"],
        f"chain{tiny_k}_graph_wall_us": chain["captured_wall_s"] * 1e6 if chain["captured_wall_s"] else None,
        f"chain{tiny_k}_graph_speedup_events": chain["speedup_events"],
        "compiled_chain_over_copy_at_1e8": (comp_1e8["time_s"] / copy_1e8["time_s"]
                                            if comp_1e8 and copy_1e8 and "time_s" in comp_1e8
                                            and "time_s" in copy_1e8 else None),
        "copy_roof_GBps": copy_roof,
        "checks_passed": all(r.get("check_passed", True) for r in chain_rows + fusion_rows),
        "errors": sum(1 for r in sweep_rows + chain_rows + fusion_rows if "error" in r),
    }
    for key, (op, target) in TARGETS.items():
        v = summary.get(key)
        summary[f"{key}_target_met"] = None if v is None else (v <= target if op == "<=" else v >= target)
    params = {"device": where, "ks": list(ks), "ns": list(ns), "chain_k": chain_k, "tiny_k": tiny_k,
              "tiny_n": TINY_N, "variants": list(variants), "budget_s": budget_s, "dtype": "float32",
              "targets": {k: f"{op} {t}" for k, (op, t) in TARGETS.items()},
              "fits": {k: f.to_dict() for k, f in fits.items()}}
    notes.append("eager sweep: host wall time from synchronize to synchronize over K launches, median of "
                 "repeats; graph sweep and chains: bench() with CUDA events, warm cache (flush=False) so the "
                 "L2 flush cannot hide launch gaps; fusion inputs rotate through ~2x L2 of copies instead")
    notes.append(f"chain{tiny_k}_graph_speedup: host wall time of one call (synchronize to synchronize), eager "
                 f"over replay; chain{tiny_k}_graph_speedup_events: the same ratio from bench() on CUDA events")
    notes.append("fit: weighted least squares (weights 1/T^2) of T(K) = fixed + per_launch*K, standard errors")
    notes.append(f"checks: float64 reference on the host, rtol {chain_rtol(chain_k):.1e} for the {chain_k}-op "
                 f"chain and {chain_rtol(tiny_k):.1e} for the {tiny_k}-op chain (~1 ulp per op)")
    return make_results("launch", params=params, summary=summary, rows=sweep_rows + chain_rows + fusion_rows,
                        notes=notes, device=where)


# ---------------------------------------------------------------------------------------------------
# Report: Markdown and plot
# ---------------------------------------------------------------------------------------------------


def _fmt(v, spec=".3g") -> str:
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
        lines.append(f"| {key} | {_fmt(val)} | {t}{mark} |")
    lines += ["", "## Fits: T(K) = fixed + per_launch * K", "", "| series | fixed us | per launch us | R^2 |",
              "|---|---|---|---|"]
    for name, f in p.get("fits", {}).items():
        lines.append(f"| {name} | {f['fixed_us']:.2f} ± {f['fixed_err_us']:.2f} | "
                     f"{f['per_us']:.3f} ± {f['per_err_us']:.3f} | {f['r2']:.4f} |")
    lines += ["", "## Tiny-kernel sweep (us per launch)", ""]
    sweep = [r for r in doc["rows"] if r["study"] == "sweep"]
    series = list(dict.fromkeys(r["variant"] for r in sweep))
    lines += ["| K | " + " | ".join(series) + " |", "|---" * (len(series) + 1) + "|"]
    for k in p["ks"]:
        cells = []
        for sname in series:
            r = next((r for r in sweep if r["variant"] == sname and r["K"] == k), None)
            cells.append(_fmt(r.get("us_per_launch")) if r and "error" not in r else "err")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines += ["", f"## {p['tiny_k']}-op chain on {p['tiny_n']} elements", "",
              "| variant | time us | us/op | check | error |", "|---|---|---|---|---|"]
    for r in (r for r in doc["rows"] if r["study"] == "chain"):
        lines.append(f"| {r['variant']} | {_fmt(r.get('time_s') and r['time_s'] * 1e6)} | {_fmt(r.get('us_per_op'))} "
                     f"| {_fmt(r.get('check_passed'))} | {r.get('error', '')} |")
    lines += ["", f"## Fusion: {p['chain_k']} elementwise ops over N fp32 elements", "",
              "| N | variant | time us | bytes | GB/s | % copy roof | x copy | check | error |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in (r for r in doc["rows"] if r["study"] == "fusion"):
        lines.append(f"| {r['N']:.0e} | {r['variant']} | {_fmt(r.get('median_us'))} | {r['bytes']:.3g} | "
                     f"{_fmt(r.get('GBps'))} | {_fmt(r.get('pct_copy_roof'), '.1f')} | {_fmt(r.get('over_copy'))} "
                     f"| {_fmt(r.get('check_passed'))} | {r.get('error', '')} |")
    lines += ["", "## Notes", ""] + [f"- {n}" for n in doc["notes"]]
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: str | Path) -> Path:
    """Left: latency against K per series, with fits. Right: fusion time against N per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    sweep = [r for r in doc["rows"] if r["study"] == "sweep" and "time_s" in r]
    fits = doc["params"].get("fits", {})
    for name in dict.fromkeys(r["variant"] for r in sweep):
        pts = [(r["K"], r["time_s"] * 1e6) for r in sweep if r["variant"] == name]
        ks, ts = zip(*pts, strict=True)
        line, = a.loglog(ks, ts, "o", label=name)
        f = fits.get(name)
        if f:
            kk = np.geomspace(min(ks), max(ks), 50)
            a.loglog(kk, f["fixed_us"] + f["per_us"] * kk, "-", color=line.get_color(), alpha=0.6,
                     label=f"{name} fit: {f['fixed_us']:.1f} + {f['per_us']:.2f}·K us")
    a.set_xlabel("K kernels in a row")
    a.set_ylabel("time for K launches (us)")
    a.set_title("launch overhead")
    a.grid(True, which="both", alpha=0.3)
    a.legend(fontsize=7)
    fusion = [r for r in doc["rows"] if r["study"] == "fusion" and "time_s" in r]
    for name in dict.fromkeys(r["variant"] for r in fusion):
        pts = sorted((r["N"], r["time_s"] * 1e6) for r in fusion if r["variant"] == name)
        ns, ts = zip(*pts, strict=True)
        b.loglog(ns, ts, "k--" if name == "copy" else "o-", label=name)
    b.set_xlabel("N elements (fp32)")
    b.set_ylabel("time per call (us)")
    b.set_title(f"{doc['params']['chain_k']}-op elementwise chain: flat = launch-bound, sloped = bandwidth-bound")
    b.title.set_fontsize(9)
    b.grid(True, which="both", alpha=0.3)
    b.legend(fontsize=7)
    fig.suptitle(f"gpuspeed launch on {doc['device'].get('name', '?')}")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)  # atomic: never a half-written plot
    return path


def write_artifacts(doc: dict, out: str | Path) -> list[Path]:
    """launch.json (through gpuspeed.results), launch.md and launch.png under `out`."""
    from gpuspeed.results import write_results

    out = Path(out)
    paths = [write_results(doc, out)]
    md = out / "launch.md"
    tmp = out / ".launch.md.tmp"
    tmp.write_text(to_markdown(doc))
    tmp.replace(md)
    paths.append(md)
    try:
        paths.append(plot(doc, out / "launch.png"))
    except Exception as exc:  # a plot failure must not lose the numbers
        doc["notes"].append(f"plot failed: {_err_text(exc)}")
    return paths


def explain_target(target: str, inputs: str | None = None):
    """explain() on 'file.py:function', with inputs from --inputs or the module's make_inputs()."""
    import inspect

    from gpuspeed.loading import load_function, load_module

    fn = load_function(target)
    if inputs:
        make = load_function(inputs)
    else:
        mod = load_module(target.rpartition(":")[0])
        make = getattr(mod, "make_inputs", None)
    if make is not None:
        args = make()
        args = args if isinstance(args, tuple) else (args,)
    else:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if params:
            raise UserError(f"{target} needs arguments: define make_inputs() in its file or pass --inputs "
                            f"file.py:make_inputs")
        args = ()
    return graphs.explain(fn, *args)
