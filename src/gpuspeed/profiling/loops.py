"""Loop nests of a hot function: depth, share of time, the dependences between iterations, and a verdict.

Each outermost loop gets a machine-readable `kind` (the optimize planner reads it) and a sentence:
  sequential-loop  an iteration needs the one before it (`x = x * 0.5 + 1`, `a[i] = a[i - 1] + ...`):
                   not one GPU thread per iteration; compile it, make it a scan, or parallelize inside
  vectorize        the loop calls array functions on each iteration: batch them into one call
  reduction        iterations independent except for accumulators (`s += a[i]`): a parallel reduction; an
                   array element as accumulator (`h[b[i]] += 1`, `out[i] += ...` under `for k`) is marked
                   `elements` (indirect / same): prange as written would race on it; an argmax written with
                   `if` (`if x[i] > m: m = x[i]; k = i`) is one over (value, index) pairs, with its tie rule
  parallel-map     independent iterations of element-wise array work: one GPU thread per iteration (a copy or a
                   gather `out[i] = a[idx[i]]`, and a swap of a[i] and a[n - 1 - i] over range(n // 2) too: no
                   element belongs to two iterations); a scatter `out[idx[i]] = v` is one where idx has no repeats
  control-flow     Python control flow without array arithmetic: restructure before moving it

Dependences come from the source alone. A name assigned in the loop and read in an iteration before that
iteration assigns it is carried from the previous iteration. A carried name updated only as
`s op= expr` / `s = s op expr` / `s = max(s, expr)` / `if expr > s: s = expr` (op one of + - * | & ^, expr
not reading s) and read nowhere else is a reduction; one stepped by a loop-invariant amount (`i += 1`) is an induction variable;
any other carried name is a recurrence. An array written at one index and read at another in the same
loop is a recurrence too (under two names bound to one array, `b = a`, as well), unless the indices differ only
in variables of inner loops (then the inner loop carries it). An element whose index uses only inner-loop variables
is the same element in every iteration of the outer loop: only added into (`out[i] += ...` under `for k`), it is a
reduction over the outer loop; read before it is written in an iteration, a recurrence; written first, the
iteration's own scratch. `a[i] = a[i] op v` is `a[i] op= v`.
"""

from __future__ import annotations

import ast
import textwrap
from collections import defaultdict

_REDUCE_OPS = {ast.Add: "+", ast.Sub: "+", ast.Mult: "*", ast.BitOr: "|", ast.BitAnd: "&", ast.BitXor: "^"}
_ARRAY_MODULES = ("np", "numpy", "torch", "cp", "cupy", "jnp")
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def loop_nests(source: str, first_line: int, times: dict, total: float, module: bool = False) -> list:
    """Outermost loops of a function (or of a module's top level, module=True) with their depth, time
    share, dependences and verdict. `times` maps a file line to its time; `first_line` is the file line of
    the source's first line."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return []
    lines = source.splitlines()
    top = tree
    if not module and tree.body and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        top = tree.body[0]
    out = []
    aliases = name_aliases(top)
    for loop in _outer_loops(top):
        lo, hi = loop.lineno + first_line - 1, loop.end_lineno + first_line - 1
        t = sum(v for ln, v in times.items() if lo <= ln <= hi)  # the header too: next() on its iterator is loop time
        info = analyze_loop(loop, first_line, lines, aliases)
        share = t / total if total > 0 else None
        out.append({"line": lo, "end_line": hi, "time_s": t, "share_of_function": share} | info)
    return out


def name_aliases(node) -> dict:
    """name -> one name for every name bound to another (`b = a`, anywhere in node): the same array under two names."""
    parent: dict = {}

    def root(n):
        while parent.get(n, n) != n:
            n = parent[n]
        return n

    for n in ast.walk(node):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) \
                and isinstance(n.value, ast.Name):
            a, b = root(n.targets[0].id), root(n.value.id)
            if a != b:
                parent[a] = b
    return {n: root(n) for n in parent}


def analyze_loop(loop, first_line: int = 1, lines: list | None = None, aliases: dict | None = None) -> dict:
    """Depth, counts, dependences, kind and verdict of one loop node (line numbers shifted by first_line);
    `inner` gives the kind of each loop directly inside it; aliases: name_aliases() of the code around it."""
    info = _facts(loop, first_line, lines, aliases)
    inner = [{"line": child.lineno + first_line - 1, "kind": _facts(child, first_line, lines, aliases)["kind"]}
             for child in _outer_loops(loop)]
    on_arrays = bool(info["lib_calls"]) or any(isinstance(n, ast.Slice) for n in ast.walk(loop))
    return info | {"inner": inner, "on_arrays": on_arrays,
                   "verdict": _verdict(info["kind"], info["dependences"], on_arrays, info["depth"], inner)}


def mark_on_arrays(loop: dict) -> None:
    """A loop seen running array ops on its lines (profile's trace) works on whole arrays, whatever its source looks
    like (`x = x * 0.5 + 1` on a tensor): on_arrays, and the verdict that goes with it."""
    loop["on_arrays"] = True
    loop["verdict"] = _verdict(loop["kind"], loop["dependences"], True, loop["depth"], loop["inner"])


def _facts(loop, first_line: int, lines: list | None, aliases: dict | None = None) -> dict:
    body = list(ast.walk(loop))
    subscripts = sum(isinstance(n, ast.Subscript) for n in body)
    arith = sum(isinstance(n, (ast.BinOp, ast.AugAssign)) for n in body)
    calls = sorted({_call_name(n) for n in body if isinstance(n, ast.Call)} - {None})
    lib_calls = [c for c in calls if c.split(".")[0] in _ARRAY_MODULES]
    d = _depth(loop)
    deps = dependences(loop, first_line, lines, aliases)
    return {"depth": d, "subscripts": subscripts, "arithmetic": arith, "calls": calls[:8], "lib_calls": lib_calls,
            "kind": _kind(deps, lib_calls, d, subscripts, arith), "dependences": deps}


def _kind(deps: dict, lib_calls: list, depth: int, subscripts: int, arith: int) -> str:
    if deps["recurrences"]:
        return "sequential-loop"
    if lib_calls and depth == 1:
        return "vectorize"
    if deps["reductions"] and (arith or subscripts):
        return "reduction"
    if subscripts and (arith or deps.get("permutations") or deps.get("element_stores")):  # a gather or copy too
        return "parallel-map"
    return "control-flow"


def _verdict(kind: str, deps: dict, on_arrays: bool, depth: int, inner: list) -> str:
    """The sentence for a kind; on_arrays: each iteration works on whole arrays (array calls or slices)."""
    if kind == "sequential-loop":
        first = deps["recurrences"][0]
        what = f"{first['name']} (`{first['code']}`, line {first['line']})" if first["code"] else \
            f"{first['name']} (line {first['line']})"
        how = ("keep the iterations in order and run each one's array work on the GPU (capture the loop in a "
               "CUDA graph, or torch.compile it)" if on_arrays else "compile it as a loop (Numba @njit on the CPU)")
        text = (f"sequential: each iteration needs the previous one's {what}, so it cannot be one GPU thread "
                f"per iteration; {how}, rewrite it as a scan if the step is associative (cumsum, cumprod, "
                "associative_scan), or restructure it")
        par = [i for i in inner if i["kind"] in ("parallel-map", "reduction")]
        if par:
            text += (f"; the inner loop at line {par[0]['line']} is {par[0]['kind']}: make it the kernel, one "
                     "launch per outer iteration")
        return text
    if kind in ("parallel-map", "reduction", "control-flow") and deps.get("last_writes"):
        last = deps["last_writes"][0]
        what = f"{last['name']} (`{last['code']}`, line {last['line']})" if last.get("code") else \
            f"{last['name']} (line {last['line']})"
        return (f"every iteration writes the same element, {what}: in order the last iteration's value stays, in "
                "parallel any thread's may; compute that element once from the last iteration, outside the loop, "
                "then run the rest as one GPU thread per iteration (or a reduction, if the element was meant to "
                "gather every iteration's value)")
    if kind == "vectorize":
        return "vectorize: the loop calls array functions per iteration; batch them into one call"
    if kind == "reduction":
        arg = next((r for r in deps["reductions"] if r["op"] in ("argmax", "argmin") and "of" not in r), None)
        if arg is not None:
            return _arg_verdict(arg, deps)
        names = ", ".join(f"{r['name']} ({r['op']})" for r in deps["reductions"][:3])
        same = [r for r in deps["reductions"] if r.get("elements") == "same"]
        par = [i for i in inner if i["kind"] == "parallel-map"]
        if same:  # threads over this loop would all add into the same elements: the inner loop is the kernel
            text = (f"reduction over this loop into {names}: every iteration adds into the same elements, so "
                    "its iterations are not independent (threads over them would race)")
            return text + (f"; the inner loop at line {par[0]['line']} is parallel-map: make it the kernel, one "
                           "thread per element, and run this loop inside each thread, summing in a register"
                           if par else "; swap the loops so that each thread owns its elements")
        if any(r.get("elements") == "indirect" for r in deps["reductions"]):
            return (f"parallel reduction into {names}: iterations may add into the same element; a GPU kernel "
                    "with atomic adds (or torch.bincount / index_add_), not prange as written (its iterations "
                    "would race)")
        text = (f"parallel reduction into {names}: iterations are otherwise independent; a GPU reduction "
                "(torch.sum, or partial sums per thread and a tree reduction in a kernel) or Numba "
                "@njit(parallel=True) with prange")
        cond = next((r for r in deps["reductions"] if r.get("form") == "if"), None)
        if cond is not None:  # Numba's prange reduces `m = max(m, v)` but not an `if`: each thread's result is lost
            text += (f" once it is written `{cond['name']} = {cond['op']}({cond['name']}, ...)` (prange does not "
                     "reduce a conditional update)")
        return text
    if kind == "parallel-map" and deps.get("permutations"):
        pair = deps["permutations"][0]["name"]
        return (f"parallel permutation: each iteration exchanges its own pair ({pair}), and over half the range no "
                "element belongs to two iterations, so the iterations are independent: one GPU thread per pair or "
                "Numba @njit with prange (a whole array reversed in place is `a[:] = a[::-1]` in NumPy)")
    if kind == "parallel-map" and deps.get("scatters"):
        at = deps["scatters"][0]
        return (f"parallel scatter into {at['name']} (line {at['line']}): one GPU thread per iteration (or Numba "
                "prange) gives the loop's answer only where the index has no repeats: two iterations with one index "
                "write one element, which in order the last one wins and in parallel any thread may")
    if kind == "parallel-map":
        text = (f"move into a GPU kernel (one thread per {'outer ' if depth > 1 else ''}iteration) or Numba "
                f"@njit{'(parallel=True)' if depth > 1 else ''}: element-wise work on arrays, iterations "
                "independent")
        ahead = deps.get("reads_ahead")
        if ahead:  # a[i] = a[i + 1] ...: each read sees the original array, but a thread may overwrite it first
            text += (f" once the results go to a new array: in place, {ahead[0]['name']} reads an element that a "
                     "later iteration overwrites, so threads would race (NumPy's a[:-1] = a[1:] ... copies first)")
        return text
    return "Python control flow: restructure before moving it off the interpreter"


def _arg_verdict(arg: dict, deps: dict) -> str:
    """The sentence for an argmax / argmin written with `if`: a reduction over (value, index) pairs with its tie rule."""
    along = [r["name"] for r in deps["reductions"] if r.get("of") == arg["name"]]
    op, larger = arg["op"], "larger" if arg["op"] == "argmax" else "smaller"
    first = arg["ties"] == "first"
    library = (f"; over an ascending range that is np.{op} / torch.{op} (they return the first index of the extreme, "
               "but a NaN where the comparison skips it)") if first else ""
    return (f"parallel {op} reduction into {arg['name']} with {', '.join(along)} (line {arg['line']}): a GPU reduction "
            f"over (value, index) pairs that keeps the {larger} value and on a tie the {'first' if first else 'last'} "
            f"iteration's index, as the {'strict comparison' if first else 'comparison with equality'} does{library}; "
            "not Numba prange as written (it does not reduce a conditional update: the threads' results would be lost)")


def dependences(loop, first_line: int = 1, lines: list | None = None, aliases: dict | None = None) -> dict:
    """{'recurrences': [...], 'reductions': [...], 'inductions': [...]} carried from one iteration of
    `loop` to the next, each with its name, file line and the code of that line; aliases (name_aliases()): names
    of one array, whose elements are compared as one array's."""
    variant = _assigned_names(loop)
    scan = _Scan(variant)
    if isinstance(loop, (ast.For, ast.AsyncFor)):
        scan.target(loop.target)
        scan.block(loop.body)
    else:  # while: the test runs at the start of every iteration
        scan.expr(loop.test)
        scan.block(loop.body)
    inner_vars = {n for node in ast.walk(loop) if node is not loop and isinstance(node, (ast.For, ast.AsyncFor))
                  for n in _target_names(node.target)}

    def at(line: int) -> dict:
        ln = line + first_line - 1
        code = lines[line - 1].strip() if lines and 0 < line <= len(lines) else None
        return {"line": ln, "code": code}

    first, kinds, updates, assigned = {}, defaultdict(set), defaultdict(list), {}
    for key, kind, line, extra in scan.events:
        first.setdefault(key, (kind, line))
        kinds[key].add(kind)
        if kind != "read":
            assigned.setdefault(key, line)
        if kind == "update":
            updates[key].append(extra)
    recurrences, reductions, inductions, last_writes = [], [], [], []
    for key, (kind, line) in first.items():
        if kind == "write" and "[" in key and key.split("[")[0] not in variant:
            # `out[0] = ...`: one element of an array from outside, written by every iteration; in order the last
            # iteration's value stays, in parallel any thread's may (a scalar name is the iteration's own instead)
            last_writes.append({"name": key} | at(line))
        if not kinds[key] & {"write", "update"} or kind == "write":
            continue  # only read, or assigned before it is read in each iteration: private to the iteration
        ups = updates[key]
        if "write" not in kinds[key] and ups and all(u["op"] == "+" and u["step"] for u in ups):
            inductions.append({"name": key} | at(line) | {"read": "read" in kinds[key]})
        elif kinds[key] == {"update"} and len({u["op"] for u in ups}) == 1:
            reductions.append({"name": key, "op": ups[0]["op"]} | at(ups[0]["line"])
                              | {k: ups[0][k] for k in ("form", "ties", "of") if k in ups[0]})
        else:  # placed where the carried value is assigned; read_line is where an iteration first reads it
            recurrences.append({"name": key} | at(assigned[key]) | {"read_line": line + first_line - 1})
    aliases = aliases or {}

    def same(x, y):
        return aliases.get(x, x) == aliases.get(y, y)

    own = {ast.dump(ast.Name(id=v, ctx=ast.Load())) for v in _target_names(loop.target)} \
        if isinstance(loop, (ast.For, ast.AsyncFor)) else set()
    reads_ahead, permutations, scatters = [], [], []
    for store in scan.stores:
        # `a[i]` and `a[i, 0]`, i this loop's own variable: the same iteration's row, no other iteration's element
        clash = [ld for ld in scan.loads if same(ld["base"], store["base"]) and ld["dims"] != store["dims"]
                 and not any(x[0] == y[0] and x[0] in own for x, y in zip(ld["dims"], store["dims"], strict=False))]
        if clash:
            if _only_inner(store["dims"], clash[0]["dims"], inner_vars):
                continue
            if all(_mirrored(loop, ld, store) for ld in clash):  # a swap of a[i] and a[n - 1 - i] over half the range
                permutations.append({"name": f"{store['base']}[{store['index']}] and {store['base']}"
                                             f"[{clash[0]['index']}]"} | at(store["line"]))
                continue
            if all(_ahead(loop, ld, store) for ld in clash):  # every read sees the array as it was before the loop
                reads_ahead.append({"name": f"{store['base']}[{store['index']}] from {clash[0]['base']}"
                                            f"[{clash[0]['index']}]"} | at(store["line"]))
                continue
            recurrences.append({"name": f"{store['base']}[{store['index']}] from {clash[0]['base']}"
                                        f"[{clash[0]['index']}]"} | at(store["line"]))
        elif store["aug"] and store["indirect"] and store["op"]:
            reductions.append({"name": f"{store['base']}[{store['index']}]", "op": store["op"],
                               "elements": "indirect"} | at(store["line"]))
        elif store["indirect"] and not store["aug"]:  # out[idx[i]] = v: two iterations with one idx write one element
            scatters.append({"name": f"{store['base']}[{store['index']}]"} | at(store["line"]))
    _same_elements(scan, variant - inner_vars, recurrences, reductions, at)
    return {"recurrences": recurrences, "reductions": reductions, "inductions": inductions, "reads_ahead": reads_ahead,
            "permutations": permutations, "scatters": scatters, "last_writes": last_writes,
            # elements written at indices that vary, over a range (not a dict's keys): a copy or gather is work on arrays
            "element_stores": len(scan.stores) if _range_step(loop) is not None else 0}


def mirrored_index(loop, index, base: str | None = None) -> bool:
    """Whether `index` is the mirror of the loop's own variable v over a loop that walks half the range, so that no
    iteration's v is another's mirror: `n - 1 - v` (`n - v - 1`, `n - (v + 1)`) under `for v in range(n // 2)`
    (start a literal >= 0, step 1), or `-1 - v` (`-v - 1`, `~v`) where n is len(base) or base.shape[0]."""
    if _range_step(loop) != 1 or len(loop.iter.args) > 2:
        return False
    args = loop.iter.args
    start, stop = (args[0], args[1]) if len(args) == 2 else (None, args[0])
    if start is not None and not (isinstance(start, ast.Constant) and type(start.value) is int and start.value >= 0):
        return False
    if not (isinstance(stop, ast.BinOp) and isinstance(stop.op, ast.FloorDiv) and isinstance(stop.right, ast.Constant)
            and stop.right.value == 2):
        return False
    if _names(stop.left) & _assigned_names(loop):  # n changed inside the loop: its mirror moves
        return False
    half, v = ast.dump(stop.left), loop.target.id

    def is_v(node):
        return isinstance(node, ast.Name) and node.id == v

    def one(node):
        return isinstance(node, ast.Constant) and type(node.value) is int and node.value == 1

    n = None
    if isinstance(index, ast.BinOp) and isinstance(index.op, ast.Sub):
        left, right = index.left, index.right
        if isinstance(left, ast.BinOp) and isinstance(left.op, ast.Sub) and (
                (one(left.right) and is_v(right)) or (is_v(left.right) and one(right))):
            n = left.left  # n - 1 - v, n - v - 1
        elif isinstance(right, ast.BinOp) and isinstance(right.op, ast.Add) and (
                (is_v(right.left) and one(right.right)) or (one(right.left) and is_v(right.right))):
            n = left  # n - (v + 1)
        if isinstance(left, ast.UnaryOp) and isinstance(left.op, ast.USub) and one(left.operand) and is_v(right):
            n = "negative"  # -1 - v
        elif isinstance(left, ast.UnaryOp) and isinstance(left.op, ast.USub) and is_v(left.operand) and one(right):
            n = "negative"  # -v - 1
    elif isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.Invert) and is_v(index.operand):
        n = "negative"  # ~v
    if n is None:
        return False
    if n != "negative":
        return ast.dump(n) == half
    lengths = (f"len({base})", f"{base}.shape[0]") if base else ()
    return ast.unparse(stop.left) in lengths


def _mirrored(loop, load: dict, store: dict) -> bool:
    """The load and the store differ in one dimension, where one is the loop's own variable and the other its mirror
    (mirrored_index): what one iteration touches no other does."""
    if len(load["dims"]) != len(store["dims"]) or not isinstance(getattr(loop, "target", None), ast.Name):
        return False
    differ = [p for p, (x, y) in enumerate(zip(load["dims"], store["dims"], strict=True)) if x[0] != y[0]]
    if len(differ) != 1:
        return False
    sides = [ast.parse(e["sources"][differ[0]], mode="eval").body for e in (load, store)]
    v = loop.target.id
    base = store["base"] if differ[0] == 0 else None
    return any(isinstance(a, ast.Name) and a.id == v and mirrored_index(loop, b, base)
               for a, b in (sides, sides[::-1]))


def _ahead(loop, load: dict, store: dict) -> bool:
    """The load reads an element that only a later iteration stores (`a[i + 1]` beside `a[i] = ...` going up):
    indices equal but in one dimension, there `v + k` of the loop's own range variable v, k a literal; the load's
    k lies ahead of the store's in the direction of a literal step."""
    step = _range_step(loop)
    if step is None or len(load["dims"]) != len(store["dims"]):
        return False
    differ = [p for p, (x, y) in enumerate(zip(load["dims"], store["dims"], strict=True)) if x[0] != y[0]]
    if len(differ) != 1:
        return False
    k_load, k_store = (_offset(ast.parse(e["sources"][differ[0]], mode="eval").body, loop.target.id)
                       for e in (load, store))
    return k_load is not None and k_store is not None and (k_load - k_store) * step > 0


def _range_step(loop):
    """The literal step of `for v in range(...)` (1 when not given), else None."""
    if not isinstance(loop, ast.For) or not isinstance(loop.target, ast.Name) or not isinstance(loop.iter, ast.Call) \
            or _call_name(loop.iter) != "range" or loop.iter.keywords or not 1 <= len(loop.iter.args) <= 3:
        return None
    if len(loop.iter.args) < 3:
        return 1
    step = loop.iter.args[2]
    if isinstance(step, ast.UnaryOp) and isinstance(step.op, ast.USub):
        step, sign = step.operand, -1
    else:
        sign = 1
    return sign * step.value if isinstance(step, ast.Constant) and type(step.value) is int and step.value else None


def _offset(node, v: str):
    """k for an index `v`, `v + k`, `k + v` or `v - k` (k an int literal), else None."""
    if isinstance(node, ast.Name) and node.id == v:
        return 0
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        a, b = node.left, node.right
        if isinstance(a, ast.Name) and a.id == v and isinstance(b, ast.Constant) and type(b.value) is int:
            return b.value if isinstance(node.op, ast.Add) else -b.value
        if isinstance(node.op, ast.Add) and isinstance(b, ast.Name) and b.id == v and isinstance(a, ast.Constant) \
                and type(a.value) is int:
            return a.value
    return None


def _same_elements(scan, outer: set, recurrences: list, reductions: list, at) -> None:
    """Arrays whose stores use no name that changes from one iteration of the loop to the next (`out[i]` under
    `for k`, i an inner loop's): every iteration touches the same elements, carried unless written first."""
    reported = {d["name"].split("[")[0] for d in recurrences + reductions}
    for base in dict.fromkeys(s["base"] for s in scan.stores):
        stores = [s for s in scan.stores if s["base"] == base]
        # a base bound in the loop (`for r in rows`, `tmp = np.zeros(m)`) is another array in each iteration
        if base in reported or base in outer or any(names & outer for s in stores for _, names in s["dims"]):
            continue
        loads = [ld for ld in scan.loads if ld["base"] == base]
        ops = {s["op"] for s in stores}
        if all(s["aug"] for s in stores) and len(ops) == 1 and None not in ops and \
                len(loads) == len(stores) and all(ld.get("aug") for ld in loads):
            first = stores[0]
            reductions.append({"name": f"{base}[{first['index']}]", "op": first["op"], "elements": "same"}
                              | at(first["line"]))
            continue
        first = min(stores + loads, key=lambda e: e["seq"])
        if first in loads:  # read before this iteration writes it: the previous iteration's value
            store = next(s for s in stores if s["seq"] > first["seq"]) if any(
                s["seq"] > first["seq"] for s in stores) else stores[0]
            recurrences.append({"name": f"{base}[{store['index']}] from {base}[{first['index']}]"}
                               | at(store["line"]) | {"read_line": at(first["line"])["line"]})


def _only_inner(dims_a: tuple, dims_b: tuple, inner_vars: set) -> bool:
    """True when two index tuples differ only in dimensions that use nothing but inner-loop variables."""
    if len(dims_a) != len(dims_b):
        return False
    for a, b in zip(dims_a, dims_b, strict=True):
        if a[0] != b[0]:
            names = a[1] | b[1]
            if not names or not names <= inner_vars:
                return False
    return True


class _Scan:
    """Reads and writes of one loop body in execution order: events (name, kind, line, extra) with kind
    read / write / update, and array element stores and loads."""

    def __init__(self, variant: set):
        self.variant = variant
        self.nested = 0  # > 0 inside a branch or an inner loop: an update there may not run every iteration
        self.events: list = []
        self.stores: list = []
        self.loads: list = []
        self.order = 0

    def block(self, stmts) -> None:
        for s in stmts:
            self.stmt(s)

    def stmt(self, s) -> None:
        if isinstance(s, _SCOPES):
            return
        if isinstance(s, ast.Assign):
            upd = _self_update(s)
            if upd is not None:
                name, op, other = upd
                self.expr(other)
                self._update(name, op, other, s.lineno)
                return
            elem = _element_self_update(s)
            if elem is not None:  # `a[i] = a[i] + v` is `a[i] += v` written out
                target, op, other = elem
                self.expr(other)
                self.subscript(target, store=True, aug=True, op=op, value=other)
                return
            self.expr(s.value)
            for t in s.targets:
                self.target(t)
        elif isinstance(s, ast.AugAssign):
            op = _REDUCE_OPS.get(type(s.op))
            if isinstance(s.target, ast.Name):
                self.expr(s.value)
                if op and s.target.id not in _names(s.value):
                    self._update(s.target.id, op, s.value, s.lineno)
                else:
                    self.events += [(s.target.id, "read", s.lineno, None), (s.target.id, "write", s.lineno, None)]
            elif isinstance(s.target, ast.Subscript):
                self.expr(s.value)
                self.subscript(s.target, store=True, aug=True, op=op, value=s.value)
            else:
                self.expr(s.value)
                self.expr(s.target)
        elif isinstance(s, ast.AnnAssign):
            if s.value is not None:
                self.expr(s.value)
                self.target(s.target)
        elif isinstance(s, (ast.For, ast.AsyncFor)):
            self.expr(s.iter)
            self.target(s.target)
            self.nested_block(s.body, s.orelse)
        elif isinstance(s, ast.While):
            self.expr(s.test)
            self.nested_block(s.body, s.orelse)
        elif isinstance(s, ast.If):
            extreme = _conditional_extreme(s)
            if extreme is not None:  # `if a[i] > m: m = a[i]` is `m = max(m, a[i])` written out
                name, op, other = extreme
                self.expr(other)
                self._update(name, op, other, s.lineno, form="if")
                return
            arg = _conditional_arg_extreme(s)
            if arg is not None:  # `if a[i] > m: m = a[i]; k = i`: an argmax, its index taken along
                name, op, other, along, ties = arg
                self.expr(other)
                self._update(name, op, other, s.lineno, form="if", ties=ties)
                for target, value in along:
                    self.expr(value)
                    self._update(target, op, value, s.lineno, form="if", ties=ties, of=name)
                return
            self.expr(s.test)
            self.nested_block(s.body, s.orelse)
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            for item in s.items:
                self.expr(item.context_expr)
                if item.optional_vars is not None:
                    self.target(item.optional_vars)
            self.block(s.body)
        elif isinstance(s, ast.Try):
            self.nested_block(s.body, *(h.body for h in s.handlers), s.orelse)
            self.block(s.finalbody)
        else:
            for child in ast.iter_child_nodes(s):
                if isinstance(child, ast.expr):
                    self.expr(child)

    def nested_block(self, *blocks) -> None:
        self.nested += 1
        for b in blocks:
            self.block(b)
        self.nested -= 1

    def _update(self, name: str, op: str, other, line: int, **how) -> None:
        """`name op= other`: a step by a loop-invariant amount on every iteration is an induction step; `how` says
        more of a reduction (form="if": a conditional update; ties and of: an argmax's)."""
        invariant = not (_names(other) & self.variant) and not any(isinstance(n, ast.Call) for n in ast.walk(other))
        self.events.append((name, "update", line, {"op": op, "step": invariant and self.nested == 0, "line": line}
                            | how))

    def expr(self, node) -> None:
        """Record the reads of an expression (all of them happen before its statement's writes)."""
        if node is None:
            return
        todo = [node]
        while todo:
            n = todo.pop(0)
            if isinstance(n, (ast.Lambda, *_COMPREHENSIONS)):
                continue  # their own scope; the names they bind never leak into the loop
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                self.events.append((n.id, "read", n.lineno, None))
            elif isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load):
                if self.subscript(n, store=False):
                    continue
            elif isinstance(n, ast.NamedExpr):
                self.expr(n.value)
                self.events.append((n.target.id, "write", n.lineno, None))
                continue
            todo.extend(ast.iter_child_nodes(n))

    def target(self, t) -> None:
        if isinstance(t, ast.Name):
            self.events.append((t.id, "write", t.lineno, None))
        elif isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                self.target(e)
        elif isinstance(t, ast.Starred):
            self.target(t.value)
        elif isinstance(t, ast.Subscript):
            self.subscript(t, store=True)
        elif isinstance(t, ast.Attribute):
            self.expr(t.value)

    def subscript(self, node, *, store: bool, aug: bool = False, op: str | None = None, value=None) -> bool:
        """Record an element load or store; True when the node was handled whole (the caller skips it)."""
        base, dims, index_nodes = _subscript_parts(node)
        for ix in index_nodes:
            self.expr(ix)
        if base is None:
            self.expr(node.value)
            return True
        self.events.append((base, "read", node.lineno, None))  # the array object itself is read
        index = ", ".join(ast.unparse(ix) for ix in index_nodes)
        if not any(names & self.variant for _, names in dims):  # the same element in every iteration
            key = f"{base}[{index}]"
            if not store:
                self.events.append((key, "read", node.lineno, None))
            elif aug and op and not _reads_key(value, base, dims):
                self._update(key, op, value, node.lineno)
            elif aug:
                self.events += [(key, "read", node.lineno, None), (key, "write", node.lineno, None)]
            else:
                self.events.append((key, "write", node.lineno, None))
            return True
        entry = {"base": base, "dims": dims, "index": index, "line": node.lineno,
                 "sources": [ast.unparse(ix) for ix in index_nodes]}
        if store:
            indirect = any(isinstance(n, (ast.Subscript, ast.Call)) for ix in index_nodes for n in ast.walk(ix))
            if aug:  # `a[i] += v` reads a[i] before it writes it
                self.loads.append(entry | {"aug": True, "seq": self._next()})
            self.stores.append(entry | {"aug": aug, "op": op, "indirect": indirect, "seq": self._next()})
        else:
            self.loads.append(entry | {"seq": self._next()})
        return True

    def _next(self) -> int:
        """Order of element accesses in the loop body."""
        self.order += 1
        return self.order


def _subscript_parts(node):
    """(base name, dims, index nodes) of a[i][j] or a[i, j]: dims is one (ast.dump, names read) per index."""
    index_nodes = []
    while isinstance(node, ast.Subscript):
        sl = node.slice
        index_nodes[:0] = list(sl.elts) if isinstance(sl, ast.Tuple) else [sl]
        node = node.value
    base = node.id if isinstance(node, ast.Name) else (ast.unparse(node) if isinstance(node, ast.Attribute) else None)
    dims = tuple((ast.dump(ix), frozenset(_names(ix))) for ix in index_nodes)
    return base, dims, index_nodes


def _reads_key(value, base: str, dims: tuple) -> bool:
    """Whether an expression reads the element base[dims]."""
    for n in ast.walk(value) if value is not None else ():
        if isinstance(n, ast.Subscript):
            b, d, _ = _subscript_parts(n)
            if b == base and d == dims:
                return True
    return False


def _self_update(s: ast.Assign):
    """(name, op, other) for `s = s op other`, `s = other op s` (op commutative) or `s = max(s, other)`."""
    if len(s.targets) != 1 or not isinstance(s.targets[0], ast.Name):
        return None
    name, v = s.targets[0].id, s.value
    if isinstance(v, ast.BinOp) and type(v.op) in _REDUCE_OPS:
        commutative = not isinstance(v.op, ast.Sub)
        for me, other in ((v.left, v.right), (v.right, v.left) if commutative else (None, None)):
            if isinstance(me, ast.Name) and me.id == name and other is not None and name not in _names(other):
                return name, _REDUCE_OPS[type(v.op)], other
    if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in ("max", "min") and \
            len(v.args) == 2 and not v.keywords:
        for me, other in ((v.args[0], v.args[1]), (v.args[1], v.args[0])):
            if isinstance(me, ast.Name) and me.id == name and name not in _names(other):
                return name, v.func.id, other
    return None


def _conditional_extreme(s: ast.If):
    """(name, "max" or "min", other) for `if other > m: m = other` (>, >=, <, <=, m on either side; no else)."""
    if s.orelse or len(s.body) != 1 or not isinstance(s.body[0], ast.Assign) or len(s.body[0].targets) != 1 or \
            not isinstance(s.body[0].targets[0], ast.Name) or not isinstance(s.test, ast.Compare) or \
            len(s.test.ops) != 1 or not isinstance(s.test.ops[0], (ast.Gt, ast.GtE, ast.Lt, ast.LtE)):
        return None
    name, value = s.body[0].targets[0].id, s.body[0].value
    left, right, greater = s.test.left, s.test.comparators[0], isinstance(s.test.ops[0], (ast.Gt, ast.GtE))
    if isinstance(right, ast.Name) and right.id == name:  # `other > m`: m takes other when other is larger
        other, op = left, "max" if greater else "min"
    elif isinstance(left, ast.Name) and left.id == name:  # `m < other`
        other, op = right, "min" if greater else "max"
    else:
        return None
    if ast.dump(other) != ast.dump(value) or name in _names(other):
        return None
    return name, op, other


def _conditional_arg_extreme(s: ast.If):
    """(name, "argmax" or "argmin", other, [(target, value), ...], ties) for `if other > m: m = other; k = i` (or
    `m, k = other, i`; the other assignments to names, reading neither m nor each other's targets); ties: which
    iteration's index a tie keeps, "first" for a strict comparison, "last" for >= / <=."""
    if s.orelse or not s.body:
        return None
    pairs = []  # (target name, value) of each assignment in the body, a tuple assignment taken apart
    for b in s.body:
        if not isinstance(b, ast.Assign) or len(b.targets) != 1:
            return None
        t, v = b.targets[0], b.value
        if isinstance(t, ast.Name):
            pairs.append((t.id, v))
        elif isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple) and len(t.elts) == len(v.elts) and \
                all(isinstance(e, ast.Name) for e in t.elts):
            pairs += [(e.id, x) for e, x in zip(t.elts, v.elts, strict=True)]
        else:
            return None
    targets = [t for t, _ in pairs]
    if len(pairs) < 2 or len(set(targets)) != len(targets):
        return None
    for t, v in pairs:
        one = ast.Assign(targets=[ast.Name(id=t, ctx=ast.Store())], value=v)
        found = _conditional_extreme(ast.If(test=s.test, body=[one], orelse=[]))
        if found is None:
            continue
        name, op, other = found
        along = [(t2, v2) for t2, v2 in pairs if t2 != t]
        if any(_names(value) & set(targets) for _, value in along):
            return None
        strict = isinstance(s.test.ops[0], (ast.Gt, ast.Lt))
        return name, "arg" + op, other, along, "first" if strict else "last"
    return None


def _element_self_update(s: ast.Assign):
    """(target, op, other) for `a[i] = a[i] op other` or `a[i] = other op a[i]` (op commutative), other not reading a."""
    if len(s.targets) != 1 or not isinstance(s.targets[0], ast.Subscript) or not isinstance(s.value, ast.BinOp) or \
            type(s.value.op) not in _REDUCE_OPS:
        return None
    t, v = s.targets[0], s.value
    base = _subscript_parts(t)[0]
    sides = ((v.left, v.right), (v.right, v.left)) if not isinstance(v.op, ast.Sub) else ((v.left, v.right),)
    for me, other in sides:
        if isinstance(me, ast.Subscript) and ast.dump(me.value) == ast.dump(t.value) and \
                ast.dump(me.slice) == ast.dump(t.slice) and base is not None and base not in _names(other) and \
                not any(isinstance(n, ast.Subscript) and _subscript_parts(n)[0] == base for n in ast.walk(other)):
            return t, _REDUCE_OPS[type(v.op)], other
    return None


def _names(node) -> set:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} if node is not None else set()


def _target_names(t) -> set:
    return {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}


def _assigned_names(loop) -> set:
    """Every name the loop binds (targets, assignments, augmented assignments, walrus), itself included."""
    out = set()
    for n in ast.walk(loop):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
    return out


def _depth(node) -> int:
    inner = [_depth(c) for c in ast.walk(node) if c is not node and isinstance(c, (ast.For, ast.While))]
    return 1 + (max(inner) if inner else 0)


def _outer_loops(node, inside: bool = False):
    """The outermost loops under node (not inside nested function or class definitions)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.For, ast.While)) and not inside:
            yield child
        elif not isinstance(child, _SCOPES):
            yield from _outer_loops(child, inside)


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
