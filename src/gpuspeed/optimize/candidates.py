"""The plan: every backend considered, with why it is tried or skipped, and the candidate recipes.

A recipe is a small dict a worker can rebuild in its own process: backend, precision, compile mode,
variant name, CUDA-graph capture, chunking. Base recipes come first (in priority order, the drop-ins
the targets compare against leading); derived ones (compile modes on the better precision, graph
capture, chunked re-runs) follow once the base results are in.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re


COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead")
FP32_MIN_RTOL = 1e-6  # float32 keeps ~7 digits: below this rtol a float32 candidate cannot pass
TF32_MIN_RTOL = 3e-4  # TF32 matmuls keep a 10-bit mantissa (gpuspeed.verify's tf32 row)
_MATMUL = re.compile(r"matmul|dot|einsum|tensordot|linear|Linear|bmm|mm|inner")  # matmul functions (nn.Linear too)
BACKEND_NAMES = {"cupy": "CuPy drop-in", "torch_compile": "torch.compile on the NumPy code",
                 "torch": "PyTorch on the GPU (eager / compiled / graph)", "numba": "Numba njit(parallel=True), CPU",
                 "jax": "JAX jit", "numpy": "NumPy float32 on the CPU", "variant": "user variants",
                 "triton": "Triton", "numba_cuda": "Numba CUDA", "tensorrt": "TensorRT / ONNX Runtime"}
ALL_BACKENDS = ("cupy", "torch_compile", "torch", "numba", "jax", "numpy", "variant")


def installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def recipe(name, backend, precision="as-written", **kw) -> dict:
    return {"name": name, "backend": backend, "precision": precision} | {k: v for k, v in kw.items() if v is not None}


def fp32_allowed(wl, float64: bool) -> tuple[bool, str]:
    if not float64:
        return False, "no float64 arrays among the inputs to demote"
    if wl.rtol is None and wl.atol is not None:  # the atol stated, rtol left to the dtype's default
        return False, (f"atol {wl.atol:g} is stated ({wl.tolerance_source}) but rtol is float64's default (1e-12): "
                       "state rtol too (TOLERANCE's or --rtol) to let a float32 candidate compete")
    if wl.rtol is None:
        return False, ("the tolerance is float64's default (rtol 1e-12): state TOLERANCE or --rtol to let a float32 "
                       "candidate compete")
    if wl.rtol < FP32_MIN_RTOL:
        return False, f"rtol {wl.rtol:g} is below what float32 can meet (~{FP32_MIN_RTOL:g})"
    return True, f"float64 data and rtol {wl.rtol:g}: float32 demotion tried, kept only if within tolerance"


def tf32_allowed(wl, float64: bool) -> bool:
    """float32 matmuls (no float64 data) and a tolerance TF32 can meet."""
    if float64 or wl.rtol is None or wl.rtol < TF32_MIN_RTOL:
        return False
    try:
        tree = ast.parse(inspect.getsource(wl.module))
    except (OSError, TypeError, SyntaxError):
        return False
    return any(_is_matmul(node) for node in ast.walk(tree))


def _is_matmul(node) -> bool:
    """`a @ b`, or a name or attribute of a matmul function (`np.dot`, `F.linear`): code, not a comment's words."""
    if isinstance(node, (ast.BinOp, ast.AugAssign)):
        return isinstance(node.op, ast.MatMult)
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name is not None and bool(_MATMUL.fullmatch(name))


def fuse_applies(fn) -> tuple[bool, str]:
    """Whether cupy.fuse can trace fn, read from its source: it fuses elementwise operations and reductions
    over whole arrays, not indexing or slicing, nor Python loops over array values."""
    import ast
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return False, "its source is not available to read"
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            return False, f"it indexes or slices arrays (line {node.lineno}), which cupy.fuse does not trace"
        if isinstance(node, (ast.For, ast.While, ast.comprehension)):
            return False, f"it loops in Python (line {getattr(node, 'lineno', '?')}), which cupy.fuse would unroll"
    return True, "elementwise operations and reductions only"


def plan(wl, where: str, hot: dict, requested=None) -> tuple[list[dict], list[dict]]:
    """(rows: one per backend with decision and why, base recipes in priority order)."""
    requested = set(requested or ALL_BACKENDS)
    gpu = where == "cuda"
    rows: list[dict] = []
    recipes: list[dict] = []
    f64 = hot.get("float64", False)
    fp32_ok, fp32_why = fp32_allowed(wl, f64)
    tf32_ok = gpu and tf32_allowed(wl, f64)
    loop_bound, sequential = hot.get("loop_bound", False), hot.get("sequential", False)
    torch_wl = wl.kind == "torch"
    in_place = bool(getattr(wl, "in_place", None))  # the original writes its result into its arguments
    uses_scipy = any("scipy" in (getattr(v, "__name__", "") or "") or
                     "scipy" in (getattr(v, "__module__", "") or "") for v in vars(wl.module).values())

    def row(backend, decision, why):
        rows.append({"backend": BACKEND_NAMES.get(backend, backend), "key": backend, "decision": decision, "why": why})

    def gate(backend, needs_gpu=True, module=None, applicable=True, why_not="", seq_why=None):
        if backend not in requested:
            row(backend, "skipped", "not in --backends")
            return False
        if sequential and seq_why:  # the reason that holds on any machine comes first (not "no GPU here")
            row(backend, "skipped", seq_why)
            return False
        if module and not installed(module):
            row(backend, "skipped", f"{module} is not installed")
            return False
        if needs_gpu and not gpu:
            row(backend, "skipped", "no GPU here" + ("" if where == "cpu" else ""))
            return False
        if not applicable:
            row(backend, "skipped", why_not)
            return False
        return True

    loop_note = " (loop-bound: expect one launch per iteration; given a short time limit)" if loop_bound else ""
    seq_why = ("not useful: the hot loop is a sequential recurrence over elements (each step needs the previous "
               "one), so an element-by-element drop-in would run it one tiny GPU operation per step, slower than "
               "the CPU; Numba compiles the loop on the CPU instead")
    if sequential and "numba" in requested and not torch_wl:
        _numba(rows, recipes, row, gate, wl, gpu, loop_bound, sequential, requested)  # the fast route: tried first
    if not torch_wl:
        cupy_ok = gate("cupy", module="cupy", seq_why=seq_why)
        if cupy_ok:
            row("cupy", "tried", "np rebound to CuPy, SciPy to cupyx.scipy; inputs moved once" + loop_note)
            recipes.append(recipe("cupy", "cupy"))
            fusable, fuse_why = (False, "the function writes into its arguments: cupy.fuse returns new arrays") \
                if in_place else fuse_applies(wl.original)
            rows.append({"backend": "cupy.fuse", "key": "fuse", "decision": "tried" if fusable else "skipped",
                         "why": ("on the faster CuPy precision: " if fusable else "") + fuse_why})
        compile_ok = gate("torch_compile", applicable=not uses_scipy, seq_why=seq_why,
                          why_not="the code calls SciPy, which torch.compile does not trace")
        if compile_ok:
            row("torch_compile", "tried", "torch.compiler.wrap_numpy + torch.compile on CUDA tensors, modes "
                f"{', '.join(COMPILE_MODES)}" + loop_note)
            recipes.append(recipe("torch-compile", "torch_compile", mode="default"))
        if fp32_ok:
            if cupy_ok:
                recipes.append(recipe("cupy-fp32", "cupy", "float32"))
            if compile_ok:
                recipes.append(recipe("torch-compile-fp32", "torch_compile", "float32", mode="default"))
        if tf32_ok and compile_ok:
            recipes.append(recipe("torch-compile-tf32", "torch_compile", "tf32", mode="default"))
        row("torch", "skipped", "the original is NumPy code (the torch.compile row covers PyTorch)")
    else:
        row("cupy", "skipped", "the original is PyTorch code")
        row("torch_compile", "skipped", "the original is PyTorch code: compiled directly (next row)")
        if not gpu and gate("torch", needs_gpu=False):
            # no GPU: Inductor's C++/OpenMP code on the CPU is the one thing to try (eager on the CPU is the original)
            row("torch", "tried", "no GPU: torch.compile on the CPU (Inductor fuses the elementwise work into "
                "C++/OpenMP loops; matmuls stay on the CPU's BLAS)")
            recipes.append(recipe("torch-compile-cpu", "torch", mode="default", device="cpu"))
            if fp32_ok:
                recipes.append(recipe("torch-compile-cpu-fp32", "torch", "float32", mode="default", device="cpu"))
        elif gate("torch"):
            row("torch", "tried", "tensors moved once, created on the GPU by default; eager, compiled, captured")
            recipes.append(recipe("torch-cuda", "torch", mode="eager"))
            recipes.append(recipe("torch-compile", "torch", mode="default"))
            if fp32_ok:
                recipes.append(recipe("torch-cuda-fp32", "torch", "float32", mode="eager"))
                recipes.append(recipe("torch-compile-fp32", "torch", "float32", mode="default"))
            if tf32_ok:
                recipes.append(recipe("torch-compile-tf32", "torch", "tf32", mode="default"))
    if wl.variants:
        if "variant" in requested:
            row("variant", "tried", f"{len(wl.variants)} from the workload: {', '.join(wl.variants)}")
            for vname in wl.variants:
                # a variant declaring float32 (fn.precision) is a demoted candidate: the recipe says so, so the
                # projection's unit and the emitted script's casts follow it
                precision = getattr(wl.variants[vname], "precision", "as-written")
                recipes.append(recipe(f"variant:{vname}", "variant", precision, variant=vname))
        else:
            row("variant", "skipped", "not in --backends")
    else:
        row("variant", "skipped", "the workload defines no variants")
    # on a GPU the array backends take array code; the CPU compilers are timed (slowly, holding the machine)
    # only where they can win: Python loops (loop-bound or sequential code)
    cpu_wins = loop_bound or sequential or not any(r["backend"] in ("cupy", "torch_compile", "torch") for r in recipes)
    if not any(r["key"] == "numba" for r in rows):
        _numba(rows, recipes, row, gate, wl, gpu, loop_bound, sequential, requested, cpu_wins)
    if gate("jax", needs_gpu=False, module="jax", applicable=not torch_wl and not loop_bound and not in_place,
            seq_why=None if torch_wl else "not useful: the hot loop is a sequential recurrence over elements: jax.jit "
            "would unroll every step of the Python loop (a rewrite as lax.scan or associative_scan is the JAX route)",
            why_not="PyTorch code" if torch_wl else "loop-bound code: jit would unroll the Python loops" if loop_bound
            else "the function writes into its arguments, and JAX arrays cannot be written"):
        row("jax", "tried", "np rebound to jax.numpy, jax.jit" + ("" if gpu else " on the CPU") +
            " (XLA's platform allocator, so its peak memory is seen)")
        recipes.append(recipe("jax", "jax"))
        if fp32_ok:
            recipes.append(recipe("jax-fp32", "jax", "float32"))
    if not torch_wl and "numpy" in requested:
        if fp32_ok and gpu and not cpu_wins:
            row("numpy", "skipped", "a GPU run: float32 is tried on the GPU backends (the CPU float32 run is tried "
                "for loop-bound code, or without a GPU)")
        elif fp32_ok:
            row("numpy", "tried", "the original's NumPy in float32 on the CPU: " + fp32_why)
            recipes.append(recipe("numpy-fp32", "numpy", "float32"))
        else:
            row("numpy", "skipped", fp32_why)
    elif not torch_wl:
        row("numpy", "skipped", "not in --backends")
    rows.append({"backend": "float64 -> float32", "key": "precision", "decision": "tried" if fp32_ok else "skipped",
                 "why": fp32_why})
    rows.append({"backend": "TF32 matmuls", "key": "tf32", "decision": "tried" if tf32_ok else "skipped",
                 "why": f"float32 matmuls and rtol {wl.rtol:g} >= {TF32_MIN_RTOL:g}" if tf32_ok else
                 "needs float32 matmuls, a GPU and rtol >= 3e-4"})
    rows.append({"backend": BACKEND_NAMES["triton"] + " / " + BACKEND_NAMES["numba_cuda"], "key": "kernels",
                 "decision": "via variants", "why": "hand kernels are not generated: write them in the workload's "
                 "`variants` (gpuspeed kernel reports their tuning)"})
    rows.append({"backend": "CUDA graphs", "key": "graphs", "decision": "tried" if gpu else "skipped",
                 "why": ("torch.compile reduce-overhead on the fastest compiled candidate; capture() of an eager torch "
                         "candidate under 1 ms; CuPy work is not captured (its pool's blocks are not tied to a graph)")
                 if gpu else "no GPU here"})
    rows.append({"backend": BACKEND_NAMES["tensorrt"], "key": "tensorrt", "decision": "skipped",
                 "why": "only for a pure neural-network inference graph"})
    if sequential:
        rows.append({"backend": "any GPU backend", "key": "sequential", "decision": "note",
                     "why": "a sequential recurrence: a GPU runs it one step at a time, each step a launch or a "
                            "single thread, so it cannot beat a compiled CPU loop; only a rewrite as a parallel scan "
                            "(when the step is associative, e.g. a linear recurrence) would use the GPU"})
    return rows, recipes


def _numba(rows, recipes, row, gate, wl, gpu, loop_bound, sequential, requested, cpu_wins=True) -> None:
    """Numba's plan row and recipes: for a sequential recurrence first of all (the fast route), else after the
    GPU backends where CPU code can win (Python loops, or no GPU array backend applies)."""
    torch_wl = wl.kind == "torch"
    if not gate("numba", needs_gpu=False, module="numba", applicable=not torch_wl and (not gpu or cpu_wins),
                why_not="the original is PyTorch code" if torch_wl else
                "array code on a GPU run: the GPU array backends take it (Numba's CPU compile is tried for "
                "loop-bound code, or without a GPU)"):
        return
    if sequential:
        why = ("sequential recurrence: the loop compiled as it is, on the CPU: the fast route for code whose "
               "steps depend on each other (tried first; no prange, the iterations are ordered)")
    elif loop_bound:
        why = "loop-bound: compiles the Python loops"
    else:
        why = "array code: parallel array expressions"
    row("numba", "tried", why)
    recipes.append(recipe("numba", "numba"))
    if loop_bound or sequential:  # parallel=True forks threads for each small array expression inside the loop
        recipes.append(recipe("numba-serial", "numba", parallel=False))
    # without a GPU, a loop of array steps (op-bound) is the CPU's to split too: one thread per iteration, not per
    # array expression
    if (loop_bound or not gpu) and not sequential and range_loops(wl.original):
        race = prange_race(wl.original)
        if race is None:
            recipes.append(recipe("numba-prange", "numba", prange=True))
        else:  # said in the plan: a candidate that passes its checks by luck on few cores is not planned
            rows[-1]["why"] += f"; no prange candidate: {race}"


# the methods that grow, shrink or reorder a list, set, dict or deque in place
_GROWING = {"append", "extend", "insert", "pop", "remove", "clear", "add", "update", "discard", "setdefault",
            "popitem", "appendleft", "extendleft", "popleft", "sort", "reverse"}


def prange_race(fn) -> str | None:
    """Why running fn's outermost `for v in range(...)` loops as numba.prange would race, or None: an iteration that
    writes an element of an array it shares with the others (not made inside the loop) at an index that is not v
    itself (`out[i] += ...` under `for k`, `sums[ids[i]] += v`) adds into what another thread writes at once, a
    lost update now and then, which 3 checks on a machine of few cores need not catch; `a[n - 1 - i]` under
    `for i in range(n // 2)` is no other iteration's element. Scalar reductions Numba handles (`s +=`, `s *=`,
    `m = max(m, v)`) and whole-array ones are fine; a value carried from one iteration to the next, a conditional
    update (`if v > m: m = v`, an argmax), an `|=` and a counter read in the loop are not: prange would change the
    answer. Unknown source: None (range_loops assumes a loop, the checks decide)."""
    import ast

    from gpuspeed.profiling.loops import dependences, mirrored_index, name_aliases

    fdef = _function_def(fn)
    if fdef is None:
        return None
    for loop in fdef.body:
        if not (_range_loop(loop) and isinstance(loop.target, ast.Name)):
            continue
        var = loop.target.id
        # arrays an iteration makes for itself (`tmp = np.zeros(3)`); a name bound to a subscript or another name
        # may be a view of a shared array, so it is not one of them
        own = {t.id for n in ast.walk(loop) if isinstance(n, ast.Assign)
               and not isinstance(n.value, (ast.Subscript, ast.Name, ast.Attribute)) for t in n.targets
               if isinstance(t, ast.Name)}
        for n in ast.walk(loop):  # `out.append(v)` on a list the iterations share: threads appending at once
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _GROWING \
                    and isinstance(n.func.value, ast.Name) and n.func.value.id not in own:
                return (f"iterations of the loop at line {loop.lineno + fn.__code__.co_firstlineno - 1} over {var} "
                        f"call `{ast.unparse(n.func)}` on a container they share (parallel, they would race, and "
                        "in another order)")
        for n in ast.walk(loop):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AugAssign) else []
            for t in targets:
                if not isinstance(t, ast.Subscript):
                    continue
                dims, base = [], t
                while isinstance(base, ast.Subscript):
                    dims[:0] = base.slice.elts if isinstance(base.slice, ast.Tuple) else [base.slice]
                    base = base.value
                if isinstance(base, ast.Name) and base.id in own:
                    continue
                if not any(isinstance(d, ast.Name) and d.id == var or
                           mirrored_index(loop, d, base.id if isinstance(base, ast.Name) and p == 0 else None)
                           for p, d in enumerate(dims)):
                    return (f"iterations of the loop at line {loop.lineno + fn.__code__.co_firstlineno - 1} over "
                            f"{var} write `{ast.unparse(t)}`, an element other iterations write too (parallel, they "
                            "would race)")
        where = f"iterations of the loop at line {loop.lineno + fn.__code__.co_firstlineno - 1} over {var}"
        deps = dependences(loop, fn.__code__.co_firstlineno, aliases=name_aliases(fdef))
        ahead = deps["reads_ahead"]  # `a[i] = a[i + 1] ...`: a thread may overwrite what another reads
        if ahead:
            return f"{where} read {ahead[0]['name']}, an element a later iteration overwrites (parallel, they would race)"
        if deps["recurrences"]:
            return f"{where} carry {deps['recurrences'][0]['name']} from one to the next (parallel, it would be lost)"
        for red in deps["reductions"]:
            if red.get("elements"):
                continue  # an element reduction: the stores above decide
            if red.get("form") == "if" or red["op"] not in ("+", "*", "max", "min"):
                how = "an argmax written with `if`" if red["op"] in ("argmax", "argmin") else \
                    "a conditional update" if red.get("form") == "if" else f"a `{red['op']}=` reduction"
                return (f"{where} update {red['name']} in {how}, which Numba's prange does not reduce (each thread's "
                        "result would be lost)")
        for ind in deps["inductions"]:
            if ind.get("read"):
                return (f"{where} read the counter {ind['name']}, which prange would count per thread (each "
                        "iteration would see another value)")
        # `ok = False` under an `if`, read after the loop: prange keeps each thread's value to itself, and the name
        # after the loop holds what it held before it (an is-sorted flag stayed True)
        reduced = {r["name"] for r in deps["reductions"]} | {i["name"] for i in deps["inductions"]}
        written = {n.id for n in ast.walk(loop) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        after = {n.id for st in fdef.body[fdef.body.index(loop) + 1:] for n in ast.walk(st)
                 if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        kept = sorted(written - reduced - {var} & after)
        if kept:
            return (f"{where} assign {kept[0]}, which the code reads after the loop: prange keeps no iteration's value "
                    "of it (after the loop it would hold what it held before)")
    return None


def range_loops(fn) -> bool:
    """Whether fn's body has an outermost `for ... in range(...)`: the only loops the prange candidate rewrites
    (numba_cpu._with_prange), so without one it would compile and time the plain njit candidate a second time
    (`for g, v in zip(ids, values)`, a loop inside `with` or `if`). Unknown source: assumed to have one."""
    fdef = _function_def(fn)
    if fdef is None:  # a lambda is one expression, no loop to rewrite; a source not read may hold one
        return not _is_lambda(fn)
    return any(_range_loop(node) for node in fdef.body)


def _is_lambda(fn) -> bool:
    """Whether fn is a lambda (its code's name says so): a single expression, no `for` statement in it."""
    return getattr(getattr(fn, "__code__", None), "co_name", None) == "<lambda>"


def _function_def(fn):
    """fn's `def` as an AST node, or None where its source cannot be had or parsed."""
    import ast
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    fdef = tree.body[0] if tree.body else None
    return fdef if isinstance(fdef, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _range_loop(node) -> bool:
    """Whether node is a `for ... in range(...)` loop of step 1 (prange takes no other: numba_cpu._with_prange leaves
    `range(1, n, 2)` as it is)."""
    import ast

    if not (isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and isinstance(node.iter.func, ast.Name)
            and node.iter.func.id == "range"):
        return False
    step = node.iter.args[2] if len(node.iter.args) > 2 else None
    return step is None or isinstance(step, ast.Constant) and step.value == 1


def derived(results: dict, wl, where: str, requested=None, graph_below_s: float = 1e-3) -> list[dict]:
    """Recipes worth trying once base results are in: compile modes on the better precision, CUDA-graph
    capture of a launch-bound eager torch candidate, cupy.fuse on the better CuPy precision."""
    requested = set(requested or ALL_BACKENDS)
    out = []
    if where != "cuda":
        return out

    def ok(name):
        r = results.get(name)
        return r is not None and r.get("status") == "ok"

    def t(name):
        return results[name]["device_time"]["median"]

    compiled = [n for n in ("torch-compile", "torch-compile-fp32", "torch-compile-tf32") if ok(n)]
    if compiled:
        best = min(compiled, key=t)
        r = results[best]["recipe"]
        for mode in COMPILE_MODES[1:]:
            out.append(recipe(f"{best}-{mode}", r["backend"], r["precision"], mode=mode))
    for base in ("torch-cuda-fp32", "torch-cuda"):
        # not for code that writes into its arguments: a replay writes the graph's own copies of them
        if ok(base) and t(base) < graph_below_s and not getattr(wl, "in_place", None):
            r = results[base]["recipe"]
            out.append(recipe(f"{base}-graph", "torch", r["precision"], mode="eager", graph=True))
    cupys = [n for n in ("cupy", "cupy-fp32") if ok(n)]
    if cupys and "cupy" in requested and (wl is None or not getattr(wl, "in_place", None)
                                          and fuse_applies(wl.original)[0]):
        # one fused kernel for elementwise code (cupy.fuse traces the function)
        best = min(cupys, key=t)
        out.append(recipe(f"{best}-fuse", "cupy", results[best]["recipe"]["precision"], fuse=True))
    return out
