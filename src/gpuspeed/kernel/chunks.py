"""Launches of one kernel handed the same memory at other offsets or scalars: a chunked launcher (each launch works
on a part of the buffers, handed whole with an offset, or as views from it: x[start:]) or repeated sweeps (an
iteration index, Floyd-Warshall's k).

Each launch's array arguments counted once (capture.arg_bytes) charge a chunked launcher's buffers once per chunk: k
chunks read as k times the traffic, and a % of roof k times too high. Which of the two it is cannot be seen from the
arguments; the launch's size can tell it where it is known: a Numba launch's threads (grid x block), a Triton launch's
programs x its BLOCK constexprs (the elements a program covers). Launches each smaller than the largest buffer whose
sizes add up to it (each a part of it, the last one's block maybe overhanging) are a chunked launcher's: the memory they
are handed counts once. Each covering the whole buffer: sweeps, each counted. Sizes not known (no BLOCK constexpr), or
that tell neither (adding up to less than the buffer, as a grid-stride loop's do, or far more, as masked rows'):
each counted, and said.
"""

from __future__ import annotations

import math

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
    programs x the product of its BLOCK constexprs; None where that is not known (a Triton kernel with none)."""
    programs = math.prod(launch.grid)
    if launch.backend == "numba" and launch.block:
        return programs * math.prod(launch.block)
    blocks = [v for k, v in launch.meta.items() if "BLOCK" in k.upper() and isinstance(v, int) and v > 0]
    return programs * math.prod(blocks) if blocks else None


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
