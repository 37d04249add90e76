"""What a kernel's loops are made of: its PTX instructions counted by kind.

The count is static: each instruction of one loop body once, however often it runs -- the largest innermost loop
(a loop whose body holds no other loop; the whole kernel when it has none). A kernel's hot loop is usually its
largest (unrolled, holding the real work), while zeroing and merging loops are short and run once. A loop body is
what a kernel repeats, so its mix says where issue slots go -- the question a kernel "bound by its own
instructions" leaves open. PTX is not SASS:
ptxas folds moves and negations and may unroll, so read the shares, not the counts, as the evidence.
Triton's compiled kernel carries its PTX (`asm["ptx"]`); Numba's gives it from `inspect_asm(cc)`.
"""

from __future__ import annotations

import re
from collections import Counter

# arithmetic and logic stems, classed by the type suffix (fp64 / fp32 / half / integer / predicate)
_ARITH = {"add", "sub", "mul", "mad", "fma", "div", "rem", "min", "max", "abs", "neg", "setp", "set", "and", "or",
          "xor", "not", "shl", "shr", "rcp", "sqrt", "rsqrt", "ex2", "lg2", "sin", "cos", "tanh", "copysign",
          "testp", "slct", "cnot", "lop3", "shf", "sad", "mul24", "mad24", "dp4a", "dp2a", "addc", "subc", "madc"}
_BITS = {"popc", "clz", "brev", "bfe", "bfi", "bfind", "fns", "prmt"}
_LABEL = re.compile(r"^\s*(\$?[\w.$]+):")
_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$?[\w.$]+)\s*;")

FLOAT_KINDS = ("fp64", "fp32", "fp16/bf16")
KINDS = ("fp64", "fp32", "fp16/bf16", "integer/logic", "predicate logic", "select", "bit counting", "warp vote",
         "warp shuffle", "conversion", "global memory", "shared memory", "local memory", "global atomic",
         "shared atomic", "barrier", "tensor core", "branch", "move", "other")


def kind_of(opcode: str) -> str:
    """The kind of one PTX opcode with its modifiers ('fma.rn.f64', 'atom.shared.add.u32', 'vote.sync.ballot.b32')."""
    parts = opcode.split(".")
    stem, mods = parts[0], set(parts[1:])
    if stem in ("atom", "red"):
        return "shared atomic" if "shared" in mods else "global atomic"
    if stem in ("ld", "st", "ldu", "cp", "ldmatrix", "stmatrix", "prefetch", "cvta") or stem.startswith("cp"):
        if stem == "cvta":
            return "move"
        if "shared" in mods or "shared::cta" in mods or "shared::cluster" in mods:
            return "shared memory"
        if "local" in mods:
            return "local memory"
        if "param" in mods:
            return "move"
        return "global memory"
    if stem == "vote":
        return "warp vote"
    if stem == "shfl":
        return "warp shuffle"
    if stem in _BITS:
        return "bit counting"
    if stem == "cvt":
        return "conversion"
    if stem in ("bar", "barrier", "membar", "fence"):
        return "barrier"
    if stem in ("mma", "wgmma", "tcgen05"):
        return "tensor core"
    if stem in ("bra", "ret", "call", "exit", "brx"):
        return "branch"
    if stem == "mov" or (stem in ("neg", "abs") and mods & {"f64", "f32", "f16", "bf16", "f16x2", "bf16x2"}):
        return "move"  # a float negation or absolute value is folded into its consumer's operand by ptxas
    if stem == "selp":
        return "select"
    if stem in _ARITH:
        types = {m for m in mods if re.fullmatch(r"[sufb]\d+(x2)?|pred|bf16(x2)?|f16(x2)?|e\dm\d\w*", m)}
        # setp's first type is the comparison's (setp.lt.f64); and/or/not on .pred are predicate logic
        if "f64" in types:
            return "fp64"
        if "f32" in types:
            return "fp32"
        if types & {"f16", "f16x2", "bf16", "bf16x2"}:
            return "fp16/bf16"
        if "pred" in types:
            return "predicate logic"
        return "integer/logic"
    return "other"


def _instructions(lines: list[str]) -> list[tuple[int, str]]:
    """(line index, opcode) of each instruction: predicates (@%p1) dropped, directives and labels skipped. A line may
    hold several statements (inline PTX: '{ .reg .u32 a; mov.u32 a, x; @p red.shared.add.u32 [a], 1; }')."""
    out = []
    for i, line in enumerate(lines):
        for s in line.split("//", 1)[0].split(";"):
            s = s.strip().lstrip("{}").strip()
            if not s or s.startswith(".") or _LABEL.match(s):
                continue
            if s.startswith("@"):
                s = s.split(None, 1)[1] if " " in s or "\t" in s else ""
            op = s.split(None, 1)[0] if s else ""
            if op and re.match(r"[a-z]", op):
                out.append((i, op))
    return out


def innermost_loops(ptx: str) -> list[tuple[int, int]]:
    """(first line, last line) of each innermost loop: a label that a later branch jumps back to, holding no
    such span inside."""
    lines = ptx.splitlines()
    labels = {}
    spans = []
    for i, line in enumerate(lines):
        m = _LABEL.match(line.split("//", 1)[0])
        if m:
            labels[m.group(1)] = i
        b = _BRANCH.search(line.split("//", 1)[0])
        if b and b.group(1) in labels and labels[b.group(1)] < i:
            spans.append((labels[b.group(1)], i))
    return [s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]


def mix(ptx: str | None) -> dict | None:
    """{"scope", "loops" (innermost loops found), "instructions", "kinds": {kind: count} (largest first),
    "shares": {kind: fraction}, "fma": {floating kind: FMA count}} for the largest innermost loop body of a
    kernel's PTX (the whole kernel when it has no loop); None without PTX."""
    if not ptx:
        return None
    numbered = _instructions(ptx.splitlines())
    loops = innermost_loops(ptx)
    ops = ([op for _, op in numbered] if not loops else
           max(([op for i, op in numbered if a < i <= b] for a, b in loops), key=len))
    if not ops:
        return None
    classed = [(op, kind_of(op)) for op in ops]
    counts = Counter(kind for _, kind in classed)
    n = len(classed)
    kinds = dict(counts.most_common())
    # FMAs per floating-point kind: a compute roof counts every instruction as an FMA (2 flops)
    fma = Counter(kind for op, kind in classed if op.split(".")[0] in ("fma", "mad") and kind in FLOAT_KINDS)
    return {"scope": "largest innermost loop" if loops else "whole kernel (no loop)", "loops": len(loops),
            "instructions": n, "kinds": kinds, "shares": {k: v / n for k, v in kinds.items()}, "fma": dict(fma)}


# a tensor-core instruction's A-operand type -> the compute ceiling it runs at (integer MMAs: no ceiling measured)
_MMA_UNITS = {"f64": "fp64", "tf32": "tf32", "f16": "fp16", "bf16": "bf16", "e4m3": "fp8", "e5m2": "fp8"}
_MMA_TYPE = re.compile(r"f64|f32|f16|bf16|tf32|e4m3|e5m2|[su](?:4|8|16|32)|b1")


def tensor_core_unit(ptx: str | None) -> str | None:
    """The compute ceiling a kernel's tensor-core instructions run at: the unit of their A operand's type
    (mma.sync...f32.bf16.bf16.f32 and wgmma...f32.tf32.tf32 list D's type first), the most common one where there
    are several; None without PTX or tensor-core floating-point instructions."""
    if not ptx:
        return None
    units = Counter()
    for _, op in _instructions(ptx.splitlines()):
        parts = op.split(".")
        if parts[0] not in ("mma", "wgmma"):
            continue
        types = [m for m in parts[1:] if _MMA_TYPE.fullmatch(m)]
        if len(types) >= 2 and types[1] in _MMA_UNITS:
            units[_MMA_UNITS[types[1]]] += 1
    return units.most_common(1)[0][0] if units else None


def summary(m: dict | None, top: int = 4) -> str:
    """'integer/logic 58 %, warp vote 14 %, ...' for the report, the largest kinds first ('moves' left out: ptxas
    removes most of them)."""
    if not m:
        return ""
    parts = [f"{k} {100 * s:.0f} %" for k, s in m["shares"].items() if k != "move"][:top]
    return ", ".join(parts)


def ptx_of(compiled, backend: str) -> str | None:
    """The PTX of a captured launch's compiled kernel (Triton: asm["ptx"]; Numba: inspect_asm for this device's
    compute capability); None when interpreted or not available."""
    if compiled is None:
        return None
    try:
        if backend == "triton":
            asm = getattr(compiled, "asm", None) or {}
            return asm.get("ptx")
        from numba import cuda

        return compiled.inspect_asm(cuda.get_current_device().compute_capability)
    except Exception:  # an API this version lacks: the report goes on without the mix
        return None
