"""Launches of one kernel handed the same memory at other offsets or scalars: a chunked launcher (each launch works on a
part of the buffers, handed whole with an offset, or as views from it: x[start:]) or repeated sweeps (an iteration
index, Floyd-Warshall's k).

Each launch's array arguments counted once (capture.arg_bytes) charge a chunked launcher's buffers once per chunk: k
chunks read as k times the traffic, and a % of roof k times too high. Which of the two it is cannot be seen from the
arguments; the launch's size can tell it where it is known: a Numba launch's threads (grid x block), a Triton launch's
programs x its BLOCK constexprs (the elements a program covers), less those a loop of the kernel steps by (a tiled
matmul's BLOCK_K walks the K axis: no program covers more of its output for it). Launches each smaller than the
largest buffer whose sizes add up to it (each a part of it, the last one's block maybe overhanging) are a chunked
launcher's: the memory they are handed counts once. Each covering the whole buffer: sweeps, each counted. Sizes not
known (no BLOCK constexpr), or that tell neither (adding up to less than the buffer, as a grid-stride loop's do, or
far more, as masked rows'): each counted, and said.
"""

from __future__ import annotations

import ast
import inspect
import math
import textwrap

import numpy as np

from gpuspeed import trees


def layout(values, constexprs=()) -> dict | None:
    """What tells chunks of one buffer apart, for one launch's arguments: the memory of its arrays (None where one
    cannot be located: then nothing is said), its scalar arguments (constexprs left out) and its largest array's
    elements."""
    try:
        return _layout(values, constexprs)
    except (TypeError, ValueError, AttributeError, RuntimeError):  # an argument of a kind not foreseen: nothing said
        return None


def _layout(values, constexprs) -> dict | None:
    from gpuspeed.roofline.place import _extent

    regions, scalars, elements = [], [], 0
    for name, v in values:
        if name in constexprs:
            continue
        for leaf in trees.leaves(v):
            if isinstance(leaf, (bool, int, float, complex, str, np.generic)) or leaf is None:
                scalars.append(repr(leaf))
            elif hasattr(leaf, "shape"):  # a 0-d tensor too: its address, not its value (no sync to read it)
                e = _extent(leaf)
                if e is None and math.prod(leaf.shape):
                    return None  # an array of no address here (the simulator's device arrays): no region to compare
                if e is not None:
                    regions.append(e)
                    elements = max(elements, math.prod(leaf.shape))
    return {"regions": tuple(sorted(regions)), "scalars": tuple(scalars), "elements": elements} if regions else None


def covered(launch) -> int | None:
    """The elements one launch's threads or programs cover: a Numba launch's grid x block threads, a Triton launch's
    programs x the product of its BLOCK constexprs but those a loop steps by (`loop_steps`); None where that is not
    known (a Triton kernel with none)."""
    programs = math.prod(launch.grid)
    if launch.backend == "numba" and launch.block:
        return programs * math.prod(launch.block)
    blocks = [v for k, v in launch.meta.items()
              if "BLOCK" in k.upper() and k not in launch.loop_steps and isinstance(v, int) and v > 0]
    return programs * math.prod(blocks) if blocks else None


def loop_steps(kernel) -> frozenset:
    """The names a Triton kernel's `for` loops step by: a range's step (`range(0, K, BLOCK_K)`) or a divisor in its
    bounds (`range(tl.cdiv(K, BLOCK_K))`, `range(K // BLOCK_K)`). A BLOCK constexpr so used is how far a program
    moves along an axis it walks whole, not more of the output it covers. Empty where the source cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(kernel, "fn", kernel))))
    except (TypeError, OSError, SyntaxError):  # defined in a string or a notebook cell without source: nothing known
        return frozenset()
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and _is_range(node.iter.func):
            found |= _steps_of(node.iter)
    return frozenset(found)


def _is_range(func) -> bool:
    """Whether a call's callee is range, tl.range or tl.static_range."""
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in ("range", "static_range")


def _steps_of(call: ast.Call) -> set:
    """Names a range call steps by: those of its step argument, and divisors within any of its arguments."""
    step = call.args[2:3] + [kw.value for kw in call.keywords if kw.arg == "step"]
    found = {n.id for arg in step for n in ast.walk(arg) if isinstance(n, ast.Name)}
    for arg in [*call.args, *(kw.value for kw in call.keywords)]:
        for n in ast.walk(arg):
            if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Div, ast.FloorDiv)):
                found |= {m.id for m in ast.walk(n.right) if isinstance(m, ast.Name)}
            elif isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", "")) == "cdiv":
                found |= {m.id for a in n.args[1:2] for m in ast.walk(a) if isinstance(m, ast.Name)}
    return found


def launch_bytes(launches: list) -> tuple[int, str]:
    """(bytes of the launches' array arguments, each launch's once except a chunked launcher's buffers, once for all
    its launches; what was found about launches over the same buffers at other offsets, '' if none)."""
    from gpuspeed.roofline.place import _merged_bytes

    groups: dict = {}
    for la in launches:
        groups.setdefault((la.kernel, la.backend) if la.layout else id(la), []).append(la)
    total, said = 0, []
    for same in groups.values():
        each = sum(la.arg_bytes for la in same)
        if len(same) < 2 or len({(la.layout["regions"], la.layout["scalars"]) for la in same}) < 2:
            total += each  # one launch, or the same launch again: sweeps (a stencil's steps, ping-pong buffers alike)
            continue
        union = _merged_bytes([r for la in same for r in la.layout["regions"]])
        if union >= each:  # apart (x[0:256], x[256:512], ... or other buffers): nothing counted twice
            total += each
            continue
        sizes = [covered(la) for la in same]
        whole, kernel = max(la.layout["elements"] for la in same), same[0].kernel
        if in_parts(sizes, whole):
            total += union
            said.append(f"the {len(same)} launches of {kernel} cover their buffers' {whole} elements in parts "
                        "(other offsets): the memory they are handed counted once")
            continue
        total += each
        if not sweeps(sizes, [la.layout["elements"] for la in same]):
            said.append(f"the {len(same)} launches of {kernel} are handed the same memory at other offsets or "
                        "scalars: counted each time; if each works on a part of it, pass --bytes")
    return total, "; ".join(said)


def in_parts(sizes: list, whole: int) -> bool:
    """Whether launches of these sizes (elements each covers; None: not known) cover a buffer of `whole` elements in
    parts: none covers all of it alone (that is a sweep), and together they cover it, no more than one launch's
    worth over (the last one's block may overhang). Sizes that add up to less say nothing of the buffer: a grid-stride
    loop, or a program looping over a row, covers more than its grid."""
    if None in sizes:
        return False
    return max(sizes) < whole <= sum(sizes) <= whole + max(sizes)


def sweeps(sizes: list, elements: list) -> bool:
    """Whether each launch covers all of what it is handed (its largest array's `elements`: steps of an iteration over
    one buffer, or one kernel run on x and then on x[:half]): each moves its arguments, nothing to say."""
    return None not in sizes and all(size >= n for size, n in zip(sizes, elements, strict=True))
