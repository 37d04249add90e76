"""Python hotspots of the host side: cProfile's top functions, line times, where the time goes, hot loops.

Line times come from line_profiler when it is installed, else from a small sys.settrace line timer of
our own (same meaning: a line's time includes the calls it makes). These time host Python code, not GPU
work, so they use the host clock by design. Each loop nest of a hot function gets its share of time and
a verdict: a loop over array elements doing arithmetic is a candidate for a GPU kernel or Numba.
"""

from __future__ import annotations

import ast
import cProfile
import gc
import inspect
import pstats
import re
import sys
import textwrap
import time
import types
import warnings
from collections import defaultdict
from pathlib import Path

from gpuspeed.profiling.sites import is_user_file

LIBRARIES = ("numpy", "torch", "scipy", "cupy", "jax", "numba", "pandas", "triton")
_ALLOC = re.compile(r"\b(zeros|ones|empty|full|array|asarray|ascontiguousarray|copy|concatenate|stack|hstack|"
                    r"vstack|cat|clone|tensor|zeros_like|ones_like|empty_like|full_like|arange|linspace|"
                    r"tile|repeat|pad)\b")
HOT_SHARE = 0.10  # a loop nest with at least this share of the run is reported


def _category(key, name: str) -> str:
    """'interpreter', 'library' or 'allocation' for one cProfile entry."""
    filename = key[0]
    lib = any(re.search(rf"\b{lib}\b", name) for lib in LIBRARIES) or any(
        f"/{lib}/" in filename for lib in LIBRARIES)
    if lib and _ALLOC.search(name.split("of")[0] if filename == "~" else key[2]):
        return "allocation"
    if lib:
        return "library"
    if filename == "~" or is_user_file(filename):
        return "interpreter"
    return "other"


def _label(key) -> str:
    filename, line, name = key
    if filename == "~":
        return name
    return f"{Path(filename).name}:{line}({name})"


def cprofile(fn, args=(), kwargs=None, top: int = 15) -> dict:
    """One call under cProfile: top functions and the interpreter/library/allocation split of the time."""
    prof = cProfile.Profile()
    prof.runcall(fn, *args, **(kwargs or {}))
    stats = pstats.Stats(prof).stats  # key -> (cc, nc, tottime, cumtime, callers)
    total = sum(v[2] for v in stats.values()) or 1e-12
    split = defaultdict(float)
    alloc_calls = 0
    for key, (_cc, nc, tt, _ct, _) in stats.items():
        cat = _category(key, key[2])
        split[cat] += tt
        if cat == "allocation":
            alloc_calls += nc
    skip = ("cProfile", "_lsprof", "<method 'disable'")
    rows = []
    for key, (_cc, nc, tt, ct, _) in sorted(stats.items(), key=lambda kv: -kv[1][2]):
        if any(s in key[2] for s in skip):
            continue
        rows.append({"function": _label(key), "file": key[0] if key[0] != "~" else None,
                     "line": key[1] or None, "calls": nc, "tottime_s": tt, "cumtime_s": ct,
                     "share": tt / total, "user": key[0] != "~" and is_user_file(key[0]),
                     "category": _category(key, key[2])})
        if len(rows) >= top:
            break
    shares = {k: split[k] / total for k in ("interpreter", "library", "allocation", "other")}
    verdict = {"interpreter": "interpreter-bound", "library": "library-bound",
               "allocation": "allocation-heavy", "other": "other"}[max(shares, key=shares.get)]
    if verdict != "allocation-heavy" and shares["allocation"] >= 0.25:
        verdict += ", allocation-heavy"
    return {"total_s": total, "top": rows, "shares": shares, "verdict": verdict, "allocation_calls": alloc_calls,
            "hot_user": [(r["file"], r["line"], r["function"]) for r in rows if r["user"]][:3]}


def _code_objects(targets) -> list:
    """The live code objects of user functions named (file, firstlineno) by cProfile."""
    want = {(str(Path(f).resolve()), line) for f, line, _ in targets if f}
    found = {}
    with warnings.catch_warnings():  # isinstance() on lazy module attributes can warn
        warnings.simplefilter("ignore")
        # type(), unlike isinstance(), never dereferences a dead weakproxy
        objs = [o for o in gc.get_objects() if type(o) is types.FunctionType]
    for obj in objs:
        if isinstance(obj, types.FunctionType):
            code = obj.__code__
            k = (str(Path(code.co_filename).resolve()), code.co_firstlineno)
            if k in want and k not in found:
                found[k] = (obj, code)
    return list(found.values())


def _line_times_settrace(codes, fn, args, kwargs) -> dict:
    """{(file, line): [hits, seconds]} from a sys.settrace line timer (fallback for line_profiler)."""
    targets = set(codes)
    acc: dict = defaultdict(lambda: [0, 0.0])
    clock = time.perf_counter

    def local(frame, event, arg):
        now = clock()
        key = id(frame)
        last = _last.get(key)
        if last is not None:  # the time since the last event belongs to the line that was running
            acc[(frame.f_code.co_filename, last[0])][1] += now - last[1]
        if event == "line":
            acc[(frame.f_code.co_filename, frame.f_lineno)][0] += 1
            _last[key] = (frame.f_lineno, clock())
        elif event == "return":
            _last.pop(key, None)
        elif last is not None:
            _last[key] = (last[0], clock())
        return local

    _last: dict = {}

    def glob(frame, event, arg):
        return local if frame.f_code in targets else None

    old = sys.gettrace()
    sys.settrace(glob)
    try:
        fn(*args, **(kwargs or {}))
    finally:
        sys.settrace(old)
    return acc


def _line_times_lp(funcs, fn, args, kwargs) -> dict:
    from line_profiler import LineProfiler

    lp = LineProfiler()
    for f in funcs:
        lp.add_function(f)
    lp.runcall(fn, *args, **(kwargs or {}))
    st = lp.get_stats()
    acc = {}
    for (filename, _, _), lines in st.timings.items():
        for lineno, hits, t in lines:
            acc[(filename, lineno)] = [hits, t * st.unit]
    return acc


def line_times(targets, fn, args=(), kwargs=None, backend: str = "auto") -> dict:
    """Line-level times for the user functions `targets` [(file, line, name)] over one call of fn."""
    pairs = _code_objects(targets)
    if not pairs:
        return {"backend": None, "functions": [], "note": "no user Python functions to time line by line"}
    note = None
    use_lp = backend in ("auto", "line_profiler")
    if use_lp:
        try:
            import line_profiler  # noqa: F401
        except ImportError:
            use_lp = False
            note = "line_profiler is not installed: line times come from gpuspeed's settrace timer"
    if use_lp:
        acc, used = _line_times_lp([f for f, _ in pairs], fn, args, kwargs), "line_profiler"
    else:
        acc, used = _line_times_settrace([c for _, c in pairs], fn, args, kwargs), "settrace"
    functions = []
    for _func, code in pairs:
        try:
            src, start = inspect.getsourcelines(code)
        except (OSError, TypeError):
            continue
        path = str(Path(code.co_filename).resolve())
        lines = []
        for off, text in enumerate(src):
            ln = start + off
            hits, t = acc.get((code.co_filename, ln), (0, 0.0))
            if hits or t:
                lines.append({"line": ln, "hits": hits, "time_s": t, "code": text.rstrip()})
        total = sum(r["time_s"] for r in lines)
        for r in lines:
            r["share"] = r["time_s"] / total if total > 0 else None
        hot = max(lines, key=lambda r: r["time_s"]) if lines else None
        functions.append({"function": code.co_name, "file": path, "line": code.co_firstlineno, "time_s": total,
                          "lines": lines, "hot_line": hot["line"] if hot else None,
                          "loops": loop_nests("".join(src), start, {r["line"]: r["time_s"] for r in lines},
                                              total)})
    functions.sort(key=lambda f: -f["time_s"])
    return {"backend": used, "functions": functions, "note": note}


def loop_nests(source: str, first_line: int, times: dict, total: float) -> list:
    """Outermost loops of a function with their depth, time share and a verdict on where they could go."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return []
    out = []

    def depth(node) -> int:
        inner = [depth(c) for c in ast.walk(node) if c is not node and isinstance(c, (ast.For, ast.While))]
        return 1 + (max(inner) if inner else 0)

    def outer_loops(node, inside=False):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.For, ast.While)) and not inside:
                yield child
            elif not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                yield from outer_loops(child, inside)

    top = tree.body[0] if tree.body and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) else tree
    for loop in outer_loops(top):
        lo, hi = loop.lineno + first_line - 1, loop.end_lineno + first_line - 1
        t = sum(v for ln, v in times.items() if lo <= ln <= hi and ln != lo) or times.get(lo, 0.0)
        body = list(ast.walk(loop))
        subscripts = sum(isinstance(n, ast.Subscript) for n in body)
        arith = sum(isinstance(n, (ast.BinOp, ast.AugAssign)) for n in body)
        calls = sorted({_call_name(n) for n in body if isinstance(n, ast.Call)} - {None})
        lib_calls = [c for c in calls if c.split(".")[0] in ("np", "numpy", "torch", "cp", "jnp")]
        d = depth(loop)
        if lib_calls and d == 1:
            verdict = "vectorize: the loop calls array functions per iteration; batch them into one call"
        elif subscripts and arith:
            verdict = (f"move into a GPU kernel (one thread per {'outer ' if d > 1 else ''}iteration) or "
                       f"Numba @njit{'(parallel=True)' if d > 1 else ''}: element-wise arithmetic on arrays")
        else:
            verdict = "Python control flow: restructure before moving it off the interpreter"
        share = t / total if total > 0 else None
        out.append({"line": lo, "end_line": hi, "depth": d, "time_s": t, "share_of_function": share,
                    "subscripts": subscripts, "arithmetic": arith, "calls": calls[:8], "verdict": verdict})
    return out


def _call_name(node: ast.Call):
    f = node.func
    parts = []
    while isinstance(f, ast.Attribute):
        parts.append(f.attr)
        f = f.value
    if isinstance(f, ast.Name):
        parts.append(f.id)
        return ".".join(reversed(parts))
    return None


def analyze(fn, args=(), kwargs=None, line_backend: str = "auto") -> dict:
    """cProfile pass, then a line-timing pass over the hottest user functions; hot loop nests flagged."""
    cp = cprofile(fn, args, kwargs)
    lt = line_times(cp["hot_user"], fn, args, kwargs, backend=line_backend)
    total = cp["total_s"]
    cum = {(str(Path(r["file"]).resolve()), r["line"]): r["cumtime_s"] for r in cp["top"] if r["file"]}
    loops = []
    for f in lt["functions"]:
        # line timers inflate times: scale the loop's share of its function by the function's cProfile share
        f_share = min(cum.get((f["file"], f["line"]), 0.0) / total, 1.0) if total > 0 else 0.0
        for loop in f["loops"]:
            share = (loop["share_of_function"] or 0.0) * f_share
            if share >= HOT_SHARE:
                loops.append(loop | {"file": f["file"], "function": f["function"], "share": min(share, 1.0)})
    loops.sort(key=lambda loop: -loop["time_s"])
    return {"cprofile": cp, "lines": lt, "hot_loops": loops}
