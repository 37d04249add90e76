"""Hotspots of the original and what they imply for the plan: loop-bound -> Numba or a kernel;
op-bound -> an array backend; float64 -> a precision candidate; a sequential loop -> no GPU speedup.

Uses gpuspeed.profiling.hotspots (cProfile, line times, loop nests); line times are skipped when the
original is too slow to run under a line timer in the time allowed.
"""

from __future__ import annotations

import numpy as np

from gpuspeed.optimize.backends.common import kind_of, leaves

MANY_ITERATIONS = 256  # a loop of array calls run this often launches too many small GPU kernels
LINE_TIMER_MAX_S = 0.5  # a line timer slows Python loops tens of times: only over a quick call
LINE_BUDGET_S = 0.2  # a workload taking `scale` is profiled at the scale where one call takes about this
MIN_HOTSPOT_SCALE = 0.01
# a loop step this quick on the CPU is no quicker on a GPU: one kernel launch and its Python dispatch cost
# about as much (~7 us per eager launch on the H200), so a sequential loop of such steps cannot gain there
STEP_LAUNCH_S = 10e-6


def hotspot_args(wl, args, original_s: float | None) -> tuple[tuple, str]:
    """Arguments for the hotspot pass: smaller ones when the workload takes `scale` and a call is slow
    (a line timer slows Python loops tens of times), so the pass costs about LINE_BUDGET_S per call."""
    if not wl.scale_used or not original_s or original_s <= LINE_BUDGET_S:
        return args, ""
    import numpy.random as npr

    from gpuspeed.trees import nbytes

    scale = wl.scale * max(MIN_HOTSPOT_SCALE, LINE_BUDGET_S / original_s)
    out = wl.module.inputs(npr.default_rng(0), scale=scale)
    out = out if isinstance(out, tuple) else tuple(out) if isinstance(out, list) else (out,)
    if nbytes(out) >= nbytes(args):  # inputs() ignores its scale: these are the slow call's own inputs
        return args, ""
    return out, f"hotspots measured at scale {scale:.3g} (one call at full size takes {original_s:.2f} s)"


def analyze(wl, args, original_s: float | None, gpu: bool = True) -> dict:
    from gpuspeed.profiling import hotspots

    notes = []

    def profile(call_args, call_s):
        if call_s is not None and call_s > LINE_TIMER_MAX_S:
            notes.append(f"line times skipped: one call takes {call_s:.1f} s")
            return {"cprofile": hotspots.cprofile(wl.original, call_args), "lines": {"functions": []},
                    "hot_loops": []}
        return hotspots.analyze(wl.original, call_args)

    try:
        small = None  # the smaller inputs, once inputs() has made them
        try:
            small, note = hotspot_args(wl, args, original_s)
            res = profile(small, None if note else original_s)
            notes += [note] if note else []
        except Exception as exc:
            if small is args:  # the run's own inputs failed: nothing else to measure on
                raise
            # an original that refuses inputs that small (a minimum length, a fixed shape): the run's own ones
            said = (str(exc).strip().splitlines() or [""])[0]
            notes.append(f"hotspots at a smaller scale failed ({type(exc).__name__}: {said}): measured on the run's "
                         "inputs")
            res = profile(args, original_s)
    except Exception as exc:  # the analysis is advice: a failure leaves the plan to its defaults
        return {"verdict": "unknown", "implications": [], "notes": [f"hotspot analysis failed: {exc}"],
                "float64": _has_float64(args), "loop_bound": False, "sequential": False, "stepwise": False,
                "hot_lines": []}
    cp = res["cprofile"]
    loops = res.get("hot_loops", [])
    interp = cp["shares"].get("interpreter", 0.0)
    # NumPy operators on arrays do not show in cProfile (their time lands on the calling line), so the
    # interpreter share alone cannot tell loops from array code: hot loop nests decide
    timed = bool(res.get("lines", {}).get("functions"))
    hits = {(f["file"], ln["line"]): ln.get("hits") or 0 for f in res.get("lines", {}).get("functions", [])
            for ln in f.get("lines", [])}
    for lp in loops:
        lp["iterations"] = max(hits.get((lp.get("file"), lp.get("line")), 1) - 1, 0)
    # A hot loop nest over elements (nested, or per-element arithmetic) is loop-bound. A single loop of
    # array steps (time steps, a few rows) is op-bound: each step runs on the GPU; it becomes loop-bound
    # only when it runs so many times that per-iteration launches dominate. Likewise a sequential loop
    # stops a GPU only when it walks elements (many iterations), not when it orders a few array steps.
    def many(lp):
        return lp["iterations"] >= MANY_ITERATIONS

    def elementwise(lp):
        return (lp.get("depth") or 1) >= 2 or (lp.get("verdict") or "").startswith("move into a GPU kernel")

    for lp in loops:  # the loop's time per iteration (line-timed, at the hotspot pass's inputs)
        lp["step_s"] = (lp.get("time_s") or 0.0) / lp["iterations"] if lp["iterations"] else None

    def element_steps(lp):
        """Each step of this loop is element-sized: it works on scalars or array elements (no slices nor
        array calls), or its array work takes less than a kernel launch; and no inner loop is a parallel
        map or reduction (that one would be a kernel per step, which a GPU runs well)."""
        if any(i.get("kind") in ("parallel-map", "reduction") for i in lp.get("inner") or []):
            return False
        on_arrays = lp.get("on_arrays", "array work on the GPU" in (lp.get("verdict") or ""))
        return not on_arrays or (lp["step_s"] is not None and lp["step_s"] < STEP_LAUNCH_S)

    def is_sequential(lp):
        return lp.get("kind") == "sequential-loop" or "sequential" in (lp.get("verdict") or "")

    if timed:
        hot = [lp for lp in loops if (lp.get("share") or 0) >= 0.3]
        loop_bound = any(elementwise(lp) or many(lp) for lp in hot)
        seq_loops = [lp for lp in hot if is_sequential(lp)]
        # sequential (a GPU cannot help): a hot loop-carried recurrence walked step by step over many element-sized
        # steps; one that orders array steps (time steps of a stencil) is stepwise: each step's work runs on the GPU
        sequential = any(many(lp) and element_steps(lp) for lp in seq_loops)
    else:
        # no line times: the loops as their source reads, in the original and the user functions cProfile found
        # hottest (a helper it calls); a loop over elements is loop-bound only where Python code takes most of the
        # time (NumPy's operators land on the interpreter's share too: a loop of whole-array steps is not one)
        loops = _static_loops(wl.original, cp.get("hot_user") or [])
        element = [lp for lp in loops if elementwise(lp) or not lp.get("on_arrays")]
        loop_bound = interp >= 0.5 and bool(element)
        seq_loops = [lp for lp in loops if is_sequential(lp)]
        sequential = loop_bound and any(element_steps(lp) for lp in seq_loops)
    stepwise = bool(seq_loops) and not sequential
    per_element = _per_element_helpers(cp, wl.original)
    loop_bound = loop_bound or bool(per_element)
    f64 = _has_float64(args)
    implications = []
    if per_element:
        named = ", ".join(f"`{name}` {calls} times" for name, calls in per_element)
        implications.append(f"Python run once per element or row ({named} in one call of the original): np.vectorize, "
                            "np.frompyfunc, np.apply_along_axis, map or a comprehension calls it from Python, which no "
                            "array backend runs as array operations")
    if stepwise:
        implications.append("a loop of dependent steps over array work (e.g. time steps): the steps stay in order, "
                            "each step's array work runs on the GPU")
    if sequential:
        implications.append("a loop carries a dependence from one iteration to the next (sequential): a GPU "
                            "cannot run its iterations in parallel; Numba compiles it on the CPU")
    if loop_bound:
        # without line times no loop has a share of its own: cProfile's share of Python code is what was measured
        took = (f"a Python loop nest takes {max(lp.get('share') or 0 for lp in loops):.0%} of the time"
                if timed and loops else "Python functions called per element, above" if per_element else
                f"Python code takes {interp:.0%} of the time, by cProfile; line times skipped")
        implications.append(f"loop-bound ({took}): Numba njit or a hand kernel; array drop-ins would launch GPU work "
                            "per iteration")
    else:
        implications.append("op-bound (array operations, no hot Python loop): an array backend on the GPU (CuPy, "
                            "torch.compile) runs the same ops, fused where it can")
    if f64:
        implications.append("float64 data: a float32 candidate is tried where the tolerance allows it")
    if gpu:  # without a GPU nothing is moved: both times are the same call's
        implications.append("transfers: device-resident and end-to-end times are both measured; keep data on the "
                            "GPU between calls when the transfer dominates")
    hot_lines = []
    for f in res.get("lines", {}).get("functions", [])[:2]:
        for ln in sorted(f.get("lines", []), key=lambda r: -(r.get("time_s") or 0))[:5]:
            hot_lines.append({"function": f["function"], "line": ln["line"], "share": ln.get("share"),
                              "time_s": ln.get("time_s"), "code": ln.get("code", "").strip()})
    return {"verdict": cp.get("verdict"), "shares": cp.get("shares"), "loop_bound": loop_bound,
            "sequential": sequential, "stepwise": stepwise, "float64": f64, "implications": implications, "hot_lines": hot_lines,
            "hot_loops": [{k: lp.get(k) for k in ("line", "end_line", "depth", "share", "kind", "on_arrays", "verdict",
                                                  "function", "iterations", "step_s")}
                          for lp in loops], "top": cp.get("top", [])[:8], "notes": notes}


PER_ELEMENT_SHARE = 0.3  # a helper called per element must take this share of the call to make it loop-bound


def _per_element_helpers(cp: dict, original) -> list[tuple[str, int]]:
    """[(name, calls)] of the user's own functions, other than the original, that one call of it ran at least
    MANY_ITERATIONS times, where together (with what they call) they took PER_ELEMENT_SHARE of its time: Python
    functions applied element by element through a loop the source does not show (np.vectorize, apply_along_axis,
    map); none where they took less."""
    total = cp.get("total_s") or 0.0
    own = getattr(getattr(original, "__code__", None), "co_name", None)
    rows = [row for row in cp.get("top", []) if row.get("user") and row.get("name") != own
            and (row.get("calls") or 0) >= MANY_ITERATIONS]
    if not total or sum(row.get("cumtime_s") or 0.0 for row in rows) < PER_ELEMENT_SHARE * total:
        return []
    return [(row["name"], row["calls"]) for row in rows]


def _static_loops(fn, hot_user: list) -> list[dict]:
    """The outermost loops of fn and of the user functions cProfile found hottest ((file, first line, name), a helper
    fn calls included), each with its kind and verdict read from its source (gpuspeed.profiling.loops), no times:
    the loops over elements first. A source that cannot be read adds none."""
    import inspect
    import linecache
    import os
    from tokenize import TokenError

    from gpuspeed.profiling.loops import loop_nests

    blocks = {}  # (the file's real path, the function's first line) -> its source, that line
    try:
        lines, first = inspect.getsourcelines(fn)
        blocks[(os.path.realpath(inspect.getsourcefile(fn) or ""), first)] = ("".join(lines), first)
    except (OSError, TypeError):
        pass
    for file, first, name in hot_user:
        if not file or not first or not name.isidentifier() or (os.path.realpath(file), first) in blocks:
            continue  # cProfile's <listcomp> or <lambda> is no function to read
        text = linecache.getlines(file)
        try:
            blocks[(os.path.realpath(file), first)] = ("".join(inspect.getblock(text[first - 1:])), first)
        except (IndexError, SyntaxError, TokenError):
            continue
    found = []
    for source, first in blocks.values():
        found += [lp | {"iterations": None, "step_s": None, "share": None} for lp in loop_nests(source, first, {}, 0.0)]
    return sorted(found, key=lambda lp: bool(lp.get("on_arrays")))


_RANDOM_CALLS = ("np.random.", "numpy.random.", "random.", "cp.random.", "cupy.random.", "torch.rand", "torch.normal",
                 "torch.bernoulli", "torch.multinomial", "torch.poisson", "torch.manual_seed")
_RANDOM_METHODS = {"default_rng", "uniform_", "normal_", "random_", "bernoulli_", "exponential_"}  # tensor.normal_()


def _parsed_source(fn):
    """(fn's source parsed, the line it starts on), or None where its source cannot be read or parsed."""
    import ast
    import inspect
    import textwrap

    try:
        lines, first = inspect.getsourcelines(fn)
        return ast.parse(textwrap.dedent("".join(lines))), first
    except (OSError, TypeError, SyntaxError):
        return None


def random_draws(fn) -> str | None:
    """The first call in fn's own source that draws random numbers (`np.random.standard_normal`, line 7), or None:
    a seeded draw makes the original deterministic, but another backend's generator (Numba's per-thread streams,
    CuPy's, torch's) draws other numbers from the same seed."""
    import ast

    parsed = _parsed_source(fn)
    if parsed is None:
        return None
    tree, first = parsed
    calls = sorted(((node.lineno, ast.unparse(node.func)) for node in ast.walk(tree) if isinstance(node, ast.Call)))
    draws = [(line, name) for line, name in calls
             if name.startswith(_RANDOM_CALLS) or name.split(".")[-1] in _RANDOM_METHODS]
    draws.sort(key=lambda d: d[1].endswith("seed"))  # a draw itself names it better than the seed before it
    return f"`{draws[0][1]}`, line {draws[0][0] + first - 1}" if draws else None


def overlapping_update(fn) -> str | None:
    """The first `a[1:] += a[:-1]` in fn's own source (an in-place update of a slice from another slice of the same
    array), with its line, or None: NumPy buffers overlapping operands, so it adds the old values; Numba and CuPy
    update element by element and read values the update already wrote."""
    import ast

    parsed = _parsed_source(fn)
    if parsed is None:
        return None
    tree, first = parsed
    for node in ast.walk(tree):
        if not (isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Subscript)
                and isinstance(node.target.value, ast.Name)):
            continue
        base, target = node.target.value.id, ast.dump(node.target.slice)
        if not any(isinstance(n, ast.Slice) for n in ast.walk(node.target.slice)):
            continue
        for n in ast.walk(node.value):
            if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == base and \
                    ast.dump(n.slice) != target:
                return f"`{ast.unparse(node)}`, line {node.lineno + first - 1}"
    return None


def _has_float64(args) -> bool:
    for x in leaves(args):
        dt = getattr(x, "dtype", None)
        if dt is not None and str(dt).replace("torch.", "") in ("float64", "complex128"):
            return True
        if kind_of(x) == "builtins" and isinstance(x, float):
            continue
    return any(isinstance(x, np.ndarray) and x.dtype == np.float64 for x in leaves(args))
