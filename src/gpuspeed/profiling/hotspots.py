"""Python hotspots of the host side: cProfile's top functions, line times, where the time goes, hot loops.

Line times come from line_profiler when it is installed, else from a small sys.settrace line timer of
our own (same meaning: a line's time includes the calls it makes; the timer's own cost per line event is
measured on lines that do nothing and taken off). These time host Python code, not GPU work, so they use
the host clock by design. A script's module-level code is timed too (its code object comes from the
callable's `code_root`, see profiling.script). Each loop nest of a hot function gets its share of time,
its dependences between iterations and a verdict (profiling.loops).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import os
import pstats
import re
import sys
import threading
import time
import types
import warnings
from collections import defaultdict
from pathlib import Path

from gpuspeed.profiling.loops import loop_nests, mark_on_arrays
from gpuspeed.profiling.sites import is_user_file

__all__ = ["analyze", "cprofile", "line_times", "loop_nests"]

LIBRARIES = ("numpy", "torch", "scipy", "cupy", "jax", "numba", "pandas", "triton")
_ALLOC = re.compile(r"\b(zeros|ones|empty|full|array|asarray|ascontiguousarray|copy|concatenate|stack|hstack|"
                    r"vstack|cat|clone|tensor|zeros_like|ones_like|empty_like|full_like|arange|linspace|"
                    r"tile|repeat|pad)\b")
# builtins that block the thread (sleep, a pipe, a socket, a file, a child process, a lock): waiting, not bytecode
_WAITS = re.compile(r"^<built-in method (?:time\.sleep|select\.\w+|(?:posix|nt)\.(?:read|readv|pread|write|writev|"
                    r"waitpid|wait|wait3|wait4|waitid)|_winapi\.WaitFor\w+)>$|"
                    r"^<method '(?:acquire|acquire_lock|wait|poll|select|control|recv|recv_into|recvfrom|recvmsg|"
                    r"accept|connect|send|sendall|read|readinto|readline|readlines|readall|write)' of "
                    r"'(?:_thread\.\w+|select\.\w+|_socket\.socket|_io\.(?!StringIO|BytesIO)\w+|_multiprocessing\.\w+|"
                    r"_queue\.\w+)' objects>$")
# starting a process or a thread is the OS's work, not bytecode: 'other', never 'interpreter'
_STARTS = re.compile(r"^<built-in method (?:posix\.(?:fork|forkpty|posix_spawnp?|spawnv\w*)|_posixsubprocess\.fork_exec|"
                     r"_thread\.start_new_thread|_thread\.start_joinable_thread|_winapi\.CreateProcess)>$")
HOT_SHARE = 0.10  # a loop nest with at least this share of the run is reported


def _category(key, name: str) -> str:
    """'interpreter', 'library', 'allocation', 'waiting' or 'other' for one cProfile entry."""
    filename = key[0]
    lib = any(re.search(rf"\b{lib}\b", name) for lib in LIBRARIES) or any(
        f"/{lib}/" in filename for lib in LIBRARIES)
    if lib and _ALLOC.search(name.split("of")[0] if filename == "~" else key[2]):
        return "allocation"
    if lib:
        return "library"
    if filename == "~" and _WAITS.match(name):
        return "waiting"
    if filename == "~" and _STARTS.match(name):
        return "other"
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
    # imported here, not with gpuspeed: a profile.py in the user's folder (first on sys.path) would break the import
    import cProfile

    prof = cProfile.Profile()
    prof.runcall(fn, *args, **(kwargs or {}))
    stats = _call_tree(pstats.Stats(prof).stats, fn)  # key -> (cc, nc, tottime, cumtime, callers)
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
        rows.append({"function": _label(key), "name": key[2], "file": key[0] if key[0] != "~" else None,
                     "line": key[1] or None, "calls": nc, "tottime_s": tt, "cumtime_s": ct,
                     "share": tt / total, "user": key[0] != "~" and is_user_file(key[0]),
                     "category": _category(key, key[2])})
        if len(rows) >= top:
            break
    shares = {k: split[k] / total for k in ("interpreter", "library", "allocation", "waiting", "other")}
    return {"total_s": total, "top": rows, "shares": shares, "verdict": _verdict(shares), "allocation_calls": alloc_calls,
            "hot_user": [(r["file"], r["line"], r["name"]) for r in rows if r["user"]][:3]}


def _verdict(shares: dict) -> str:
    verdict = {"interpreter": "interpreter-bound", "library": "library-bound", "allocation": "allocation-heavy",
               "waiting": "waiting (blocked in sleep, I/O, a lock or another process)",
               "other": "other"}[max(shares, key=shares.get)]
    if verdict != "allocation-heavy" and shares["allocation"] >= 0.25:
        verdict += ", allocation-heavy"
    return verdict


ARRAY_LINE_S = 20e-6  # a line this slow a run is not bytecode (~0.1 us a line) but work in a library it calls
OWN_SHARE_OF_SLOW = 0.05  # slow lines whose own time is less than this share of theirs are calls, not operators


def _rebook_array_lines(cp: dict, lt: dict) -> None:
    """cProfile books an array operator (x * 2.0 on a torch tensor or a NumPy array: no Python call) on the line
    that uses it, so vectorized code read as interpreter time. The line times tell: a line taking over 20 us a
    run is library work: that share of each user function's line time, applied to its own cProfile time (the two
    come from different runs), moves to 'library'. A slow line's time includes the functions it calls, which cProfile
    books to them: only what the function's own cProfile time leaves over, once its callees are taken off, counts."""
    rows = {_fn_key(r["file"], r["line"], r["name"]): r for r in cp["top"] if r["file"] and r["category"] == "interpreter"}
    moved = 0.0
    for f in lt.get("functions", []):
        lines = f.get("lines", [])
        timed = sum(ln["time_s"] for ln in lines)
        slow = [ln for ln in lines if ln.get("hits") and ln["time_s"] / ln["hits"] >= ARRAY_LINE_S]
        heavy = sum(ln["time_s"] for ln in slow)
        row = rows.get(_fn_key(f["file"], f["line"], f["function"]))
        if timed > 0 and row is not None and row["tottime_s"] > 0:
            # a line's time includes its calls, which cProfile books to the callees: a slow line is taken as calls
            # first, up to the function's callee share, and the rest as array operators only where that is itself
            # slow work, not call overhead (a main() that only calls others read "library (array operators)")
            own = timed * min(row["tottime_s"] / row["cumtime_s"], 1.0) if row["cumtime_s"] > 0 else timed
            heavy_own = min(max(heavy - (timed - own), 0.0), own)
            if heavy_own < max(ARRAY_LINE_S * sum(ln["hits"] for ln in slow), OWN_SHARE_OF_SLOW * heavy):
                heavy_own = 0.0
            moved += row["tottime_s"] * heavy_own / own
            if heavy_own > 0.5 * own:  # its row says what the headline's split says of its time
                row["category"] = "library (array operators)"
    total = cp["total_s"]
    if moved <= 0 or total <= 0:
        return
    shift = min(moved / total, cp["shares"]["interpreter"])
    cp["shares"] = dict(cp["shares"], interpreter=cp["shares"]["interpreter"] - shift,
                        library=cp["shares"]["library"] + shift)
    cp["verdict"] = _verdict(cp["shares"])
    cp["rebooked_share"] = shift  # of the total: array operators' time, read from the line times


def _fn_key(file: str, line: int, name: str) -> tuple:
    """A user function as (real path, first line, bare name): cProfile's rows and the line timer's functions meet on
    it. The name tells a script's module code from a def on its line 1."""
    return str(Path(file).resolve()), line, name.rsplit(".", 1)[-1]


def _root_code(fn):
    """The code object a call of fn runs: a function's own, or a script's module code (profiling.script: the
    runner's own bookkeeping around it, pathlib and os.chdir, is gpuspeed's, not the script's)."""
    root = getattr(fn, "code_root", None)
    if isinstance(root, types.CodeType):
        return root
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(inspect.unwrap(fn), "__code__", None)


def _call_tree(stats: dict, fn) -> dict:
    """The entries of `fn`'s own call tree: from Python 3.12 cProfile sees every thread, and what another
    thread ran while the call had released the GIL is not the call's."""
    code = _root_code(fn)
    root = (code.co_filename, code.co_firstlineno, code.co_name) if code is not None else None
    if root not in stats:
        return stats  # a builtin or a callable object: nothing to anchor the tree on
    children = defaultdict(set)
    for key, entry in stats.items():
        for caller in entry[4]:
            children[caller].add(key)
    keep, todo = {root}, [root]
    while todo:
        for child in children.pop(todo.pop(), ()):
            if child not in keep:
                keep.add(child)
                todo.append(child)
    return {k: v for k, v in stats.items() if k in keep}


def _code_objects(targets, roots=(), home=None) -> list:
    """(function or None, code) for the user code named (file, firstlineno) by cProfile: code objects under
    `roots` first (a script's module code and everything defined in it), then live functions, those of the
    module `home` (the profiled function's globals) before any other: a file loaded twice leaves two live
    functions at the same file and line, and timing the stale one's code sees no hits (the gc order decided
    which was taken: an optimize test failed one run in three so)."""
    want = defaultdict(set)  # (file, first line) -> names: a script's module code and a def can share line 1
    for f, line, name in targets:
        if f:
            want[(str(Path(f).resolve()), line)].add(name)

    lines = {line for _, line in want}
    bases = {os.path.basename(f) for f, _ in want}
    resolved: dict = {}

    def wanted(code):
        # the cheap tests first: gc holds tens of thousands of functions once torch is imported
        if code.co_firstlineno not in lines or os.path.basename(code.co_filename) not in bases:
            return None
        if code.co_filename not in resolved:
            resolved[code.co_filename] = str(Path(code.co_filename).resolve())
        names = want.get((resolved[code.co_filename], code.co_firstlineno), ())
        if any(n == code.co_name or n.endswith("." + code.co_name) for n in names):
            return (code.co_filename, code.co_firstlineno, code.co_name)
        return None

    found = {}
    todo = [r for r in roots if isinstance(r, types.CodeType)]
    while todo:
        code = todo.pop()
        k = wanted(code)
        if k and k not in found:
            found[k] = (None, code)
        todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    with warnings.catch_warnings():  # isinstance() on lazy module attributes can warn
        warnings.simplefilter("ignore")
        # type(), unlike isinstance(), never dereferences a dead weakproxy
        objs = [o for o in gc.get_objects() if type(o) is types.FunctionType]
    if home is not None:
        objs.sort(key=lambda o: o.__globals__ is not home)  # stable: the home module's functions first
    for obj in objs:
        if isinstance(obj, types.FunctionType):
            k = wanted(obj.__code__)
            if k and k not in found:
                found[k] = (obj, obj.__code__)
    return list(found.values())


def tracer_costs() -> float:
    """Seconds the settrace timer charges a line for each of its own hits: the fastest of a few rounds over a
    loop that does nothing (noise from other processes only ever adds); ~25 ms.

    Measured beside each run it corrects, never once per process: a line's own work (tens of ns) is a small
    part of the timer's ~300 ns a hit, so a calibration taken in a slower moment than the run subtracted
    more than the hit cost and wiped out the hottest line (seen once in a full test suite)."""
    def idle(n):
        for _ in range(n):
            pass

    code = idle.__code__
    per_hit = []
    for _ in range(5):
        acc = _line_times_settrace([code], idle, (2000,), {})
        hits, t = acc.get((code.co_filename, code.co_firstlineno + 2), (0, 0.0, 0))[:2]
        if hits:
            per_hit.append(t / hits)
    return min(per_hit) if per_hit else 0.0


LONG_INTERVAL_S = 100e-6  # a line interval this long may hold time spent waiting for a CPU: look it up


def _run_delay_reader():
    """A function giving this thread's time spent runnable but waiting for a CPU so far (seconds; Linux
    schedstat), and the file descriptor to close; (None, None) where the kernel does not say."""
    try:
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    except OSError:
        return None, None

    def read() -> float:
        return int(os.pread(fd, 128, 0).split()[1]) * 1e-9

    try:
        read()
    except (OSError, IndexError, ValueError):
        os.close(fd)
        return None, None
    return read, fd


def _line_times_settrace(codes, fn, args, kwargs) -> dict:
    """{(file, line): [hits, seconds, callee hits]} from a sys.settrace line timer (fallback for line_profiler).

    Every interval between two events goes to the line running in the innermost traced frame (untraced code a
    line calls is that line's time). A line that calls traced code is charged, besides its own intervals, the
    time of the callee's lines and of what they call, and `callee hits` counts the line events in there: the
    caller takes off the timer's cost per hit for its own hits and for those, as the callee's lines do, so a
    calling line holds what its callee's lines hold (an estimate of the timer's work in the callee from its
    event count, taken off the wall time across the call, was off by the error per event times hundreds of
    thousands of events: the line `sys.exit(main())` read 0 s, or three times main's own lines).
    Time the thread spent waiting for a CPU while other processes ran (Linux run_delay) is not charged to
    the line that happened to be running: on a busy machine it would otherwise land on any line."""
    targets = set(codes)
    acc: dict = defaultdict(lambda: [0, 0.0, 0])
    clock = time.perf_counter
    read_delay, fd = _run_delay_reader()
    stack: list = []  # one entry a traced frame being run: [frame, its line or None, seconds, hits], innermost last
    last = [clock(), read_delay() if read_delay else 0.0]  # when the previous event ended, run_delay then

    def charge(now):
        """The interval since the previous event, to the innermost traced frame's running line."""
        dt = now - last[0]
        if dt > LONG_INTERVAL_S and read_delay is not None:
            delay = read_delay()
            dt -= min(max(delay - last[1], 0.0), dt)
            last[1] = delay
        if stack:
            top = stack[-1]
            top[2] += dt
            if top[1] is not None:
                acc[(top[0].f_code.co_filename, top[1])][1] += dt

    def local(frame, event, arg):
        charge(clock())
        if not stack or stack[-1][0] is not frame:  # not seen called (cannot happen): time it from here
            stack.append([frame, None, 0.0, 0])
        top = stack[-1]
        if event == "line":
            top[1] = frame.f_lineno
            top[3] += 1
            acc[(frame.f_code.co_filename, top[1])][0] += 1
        elif event == "return":  # also on a yield, and on leaving by an exception
            stack.pop()
            if stack:  # the callee's whole time and hits go to the line that called it
                caller = stack[-1]
                caller[2] += top[2]
                caller[3] += top[3]
                if caller[1] is not None:
                    entry = acc[(caller[0].f_code.co_filename, caller[1])]
                    entry[1] += top[2]
                    entry[2] += top[3]
        last[0] = clock()
        return local

    def glob(frame, event, arg):
        if frame.f_code not in targets:
            return None
        charge(clock())
        stack.append([frame, None, 0.0, 0])
        last[0] = clock()
        return local

    old = sys.gettrace()
    sys.settrace(glob)
    try:
        fn(*args, **(kwargs or {}))
    finally:
        sys.settrace(old)
        if fd is not None:
            os.close(fd)
    return acc


def _line_times_lp(funcs, fn, args, kwargs) -> dict:
    from line_profiler import LineProfiler

    lp = LineProfiler()
    with warnings.catch_warnings():  # a decorator's wrapper is timed on purpose: cProfile found its own code hot
        warnings.filterwarnings("ignore", message="Adding a function with a `.__wrapped__` attribute")
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
    pairs = _code_objects(targets, roots=[getattr(fn, "code_root", None)], home=getattr(fn, "__globals__", None))
    if not pairs:
        return {"backend": None, "functions": [], "note": "no user Python functions to time line by line"}
    note = None
    use_lp = backend in ("auto", "line_profiler")
    if use_lp and any(f is None for f, _ in pairs):
        use_lp = False  # line_profiler times functions; a script's module-level code needs the settrace timer
        note = "a script's module-level code is timed by gpuspeed's settrace timer"
    if use_lp:
        try:
            import line_profiler  # noqa: F401
        except ImportError:
            use_lp = False
            note = "line_profiler is not installed: line times come from gpuspeed's settrace timer"
    if use_lp:
        acc, used = _line_times_lp([f for f, _ in pairs], fn, args, kwargs), "line_profiler"
    else:
        per_hit = tracer_costs()
        acc, used = _line_times_settrace([c for _, c in pairs], fn, args, kwargs), "settrace"
        per_hit = min(per_hit, tracer_costs())  # and after: if the run was faster, subtract no more than it paid
        for v in acc.values():  # the timer's cost for the line's own hits and for its traced callees' hits
            v[1] = max(v[1] - (v[0] + v[2]) * per_hit, 0.0)
    functions = []
    for _func, code in pairs:
        module = code.co_name == "<module>"
        try:
            if module:  # the whole file: getsourcelines would give the first statement only
                src, start = Path(code.co_filename).read_text().splitlines(keepends=True), 1
            else:
                src, start = inspect.getsourcelines(code)
        except (OSError, TypeError, UnicodeDecodeError):
            continue
        path = str(Path(code.co_filename).resolve())
        own = {ln for _, _, ln in code.co_lines() if ln}  # not the lines of functions defined inside it
        lines = []
        for off, text in enumerate(src):
            ln = start + off
            if ln not in own:
                continue
            hits, t = acc.get((code.co_filename, ln), (0, 0.0))[:2]
            if hits or t:
                lines.append({"line": ln, "hits": hits, "time_s": t, "code": text.rstrip()})
        total = sum(r["time_s"] for r in lines)
        for r in lines:
            r["share"] = r["time_s"] / total if total > 0 else None
        hot = max(lines, key=lambda r: r["time_s"]) if lines else None
        functions.append({"function": code.co_name, "file": path, "line": code.co_firstlineno, "time_s": total,
                          "lines": lines, "hot_line": hot["line"] if hot else None,
                          "loops": loop_nests("".join(src), start, {r["line"]: r["time_s"] for r in lines},
                                              total, module=module)})
    functions.sort(key=lambda f: -f["time_s"])
    return {"backend": used, "functions": functions, "note": note}


def _line_targets(hot_user: list, fn) -> list:
    """The user functions to time line by line: the hottest by cProfile's self time, and the called function (a
    script's module code) when it is user code, though library calls fill cProfile's top rows: it is where the
    user reads where the call's time goes."""
    targets = list(hot_user)
    code = _root_code(fn)
    if code is not None and is_user_file(code.co_filename):
        here = (str(Path(code.co_filename).resolve()), code.co_firstlineno, code.co_name)
        if all(_fn_key(f, line, name) != here for f, line, name in targets if f):  # a def on line 1 is not it
            targets.append((code.co_filename, code.co_firstlineno, code.co_name))
    return targets


def analyze(fn, args=(), kwargs=None, line_backend: str = "auto") -> dict:
    """cProfile pass, then a line-timing pass over the hottest user functions and the called function itself (a
    script's module code) when it is the user's; hot loop nests flagged."""
    with threads_started() as threads:
        cp = cprofile(fn, args, kwargs)
    cp["threads_started"] = len(threads)
    lt = line_times(_line_targets(cp["hot_user"], fn), fn, args, kwargs, backend=line_backend)
    _rebook_array_lines(cp, lt)
    total = cp["total_s"]
    # keyed by name too: a script's module code and a def on its line 1 share the file and the line
    cum = {_fn_key(r["file"], r["line"], r["name"]): r["cumtime_s"] for r in cp["top"] if r["file"]}
    code = _root_code(fn)
    root = _fn_key(code.co_filename, code.co_firstlineno, code.co_name) if code is not None else None
    if root in cum:  # the called function is the whole call; the others' shares are of its cProfile time
        total = cum[root]
    loops = []
    for f in lt["functions"]:
        # line timers inflate times: scale the loop's share of its function by the function's cProfile share
        key = _fn_key(f["file"], f["line"], f["function"])
        f_share = 1.0 if key == root else min(cum.get(key, 0.0) / total, 1.0) if total > 0 else 0.0
        for loop in f["loops"]:
            share = (loop["share_of_function"] or 0.0) * f_share
            if share >= HOT_SHARE:
                loops.append(loop | {"file": f["file"], "function": f["function"], "share": min(share, 1.0)})
    loops.sort(key=lambda loop: -loop["time_s"])
    if threads:  # cProfile and the line timers see the calling thread only
        note = (f"the call started {len(threads)} thread(s): cProfile and the line timer follow the calling thread "
                "only, so the work done in them shows as time on the line that waits for them (a join(), a "
                "result()), not on their own lines")
        lt["note"] = note if not lt.get("note") else f"{lt['note']}; {note}"
    return {"cprofile": cp, "lines": lt, "hot_loops": loops}


def mark_array_loops(hs: dict, op_lines: set) -> None:
    """Loops on whose lines the trace placed ATen ops ((realpath, line) pairs) work on arrays: their verdicts say
    so, in the functions' loop lists and in hot_loops alike (the source alone read a tensor's operators as scalars)."""
    def ran_ops(path: str, loop: dict) -> bool:
        path = os.path.realpath(path)
        return not loop.get("on_arrays") and any((path, ln) in op_lines
                                                 for ln in range(loop["line"], loop["end_line"] + 1))

    for f in hs["lines"].get("functions", []):
        for loop in f.get("loops", []):
            if ran_ops(f["file"], loop):
                mark_on_arrays(loop)
    for loop in hs.get("hot_loops", []):
        if ran_ops(loop["file"], loop):
            mark_on_arrays(loop)


OWN_THREAD_PREFIX = "gpuspeed-"  # gpuspeed's own threads (the stdin pump of a script's runs) are no thread of the code's


@contextlib.contextmanager
def threads_started():
    """One entry per thread the threading module starts inside the block (threading.setprofile's hook runs first
    thing in each new thread; it removes itself there, so their work runs unprofiled as before). Idents, which a
    later thread may reuse, are listed, not counted as a set."""
    seen: list[int] = []
    before = threading.getprofile() if hasattr(threading, "getprofile") else None

    def hook(frame, event, arg):
        if not threading.current_thread().name.startswith(OWN_THREAD_PREFIX):  # a script's piped stdin: not its own
            seen.append(threading.get_ident())  # list.append is atomic: threads may start at once
        sys.setprofile(before)  # the user's own threading.setprofile hook, if any, takes over

    threading.setprofile(hook)
    try:
        yield seen
    finally:
        threading.setprofile(before)
