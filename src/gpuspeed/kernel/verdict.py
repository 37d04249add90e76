"""The verdict on a kernel and the next lever to pull: explicit rules, tried in order, the first that fits wins.

  1. no_launch    no Triton or Numba CUDA launch was seen (on the GPU or under the interpreters)
  2. wrong        its output failed the check against the reference (a workload's original()): fix that first
  3. no_gpu       ran under the interpreters: correct run only, no timing or occupancy
  4. empty        every launch had an empty grid (0 programs / blocks: empty inputs): nothing ran to judge
  5. at_roof      >= DONE_PCT % of its roof: done (over ABOVE_PCT % of a memory roof: cache-resident, say so; past
                 IMPLAUSIBLE_OVER_ROOF x any roof: its counted bytes or FLOPs are not what it did)
  6. at_copy      memory-bound and within COPY_MATCH of what device copies of the same bytes per launch reach:
                 at the practical roof for its launch size; more bytes per launch is the only lever
  7. spills       any launch spills registers to local memory: lower BLOCK / num_warps (Triton) or per-thread state
  8. small_grid   the main launch has fewer blocks (programs) than SMs: split the work
  9. occupancy    the main launch's occupancy <= LOW_OCCUPANCY_PCT %, named by its limiting resource (skipped where the
                 autotuner already timed the lever it would name, half the warps or fewer stages, and chose otherwise)
 10. launch_bound under LAUNCH_BOUND_S per call and under LOW_ROOF_PCT % of the roof: fuse / CUDA graph
 11. own_work     memory-bound, under LOW_ROOF_PCT % of the roof with occupancy above LOW_OCCUPANCY_PCT % (or its
                 lever spent, as in 9), while device copies of the same bytes reach OWN_WORK_GAP x its %: the loads
                 are not what holds it back, the instructions between them are (issue or dependent arithmetic),
                 named by the main launch's instruction mix (kernel.instructions): fewer instructions per element;
                 a Triton < 3.7 kernel whose loop is warp ballots (tl.histogram's lowering then): upgrade Triton,
                 or count in shared memory through inline PTX
 12. compute_mix  compute-bound under LOW_ROOF_PCT % of an fp64 or fp32 roof with occupancy above
                 LOW_OCCUPANCY_PCT %, its loop holding instructions of that precision: the mix and how many of them
                 are FMAs (the roof's rate is all FMAs): more flops per instruction, fewer idle lanes
 13. latency      under LOW_ROOF_PCT % of the roof with occupancy above LOW_OCCUPANCY_PCT %: more work per program
 14. tune         between LOW_ROOF_PCT and DONE_PCT % of the roof: tune the block sizes, warps and stages (Triton),
                 the block shape and work per thread (Numba)
 15. unplaced     no roof position (no bytes counted: no array among its arguments or output): the occupancy alone
The main launch is the one that starts the most threads (over all the times it ran). `facts` is a plain dict
(built by report.kernel_report: gpu, launches, main, sms, pct_of_roof, bound, roof, time_s, occupancy_pct,
limiter, copy_pct, triton_version, check), so the rules are testable on synthetic inputs.
"""

from __future__ import annotations

from gpuspeed.kernel import instructions
from gpuspeed.roofline.place import ABOVE_ROOF, IMPLAUSIBLE_OVER_ROOF

ABOVE_PCT = 105.0  # a memory-bound point this far over the roof ran from cache (roofline.place's ABOVE_ROOF)
DONE_PCT = 80.0  # at or above this % of its roof a kernel is done: what is left is noise and tails
LOW_ROOF_PCT = 50.0
LOW_OCCUPANCY_PCT = 50.0
COPY_MATCH = 0.95  # a kernel within 5 % of a same-bytes copy (or past it) is as fast as its launch size allows
OWN_WORK_GAP = 1.5  # copies of the same bytes this many times faster: the kernel's own instructions are the limit
LAUNCH_BOUND_S = 10e-6  # a few eager launches' worth: below this a call is mostly launch cost
BALLOT_SHARE = 0.05  # warp votes this large a share of a loop body: counting by ballots, not a stray any()


def _pct(x: float) -> str:
    # two significant digits under 10 %: a 4 KiB add "at 0 % of the copy roof, where copies reach 0 %" said nothing
    return f"{x:.0f} %" if abs(x) >= 9.95 else f"{x:.2g} %"


def _roof_name(f: dict) -> str:
    return "copy" if f.get("bound") == "memory" else (f.get("roof") or "compute")


def no_gpu(f):
    if not f.get("gpu"):
        c = f.get("check")
        # Numba's simulator checks bounds, and kernel_report holds the Triton interpreter's loads and stores to
        # the tensor arguments (capture.OutOfBounds): a run that returned stayed inside its arrays
        ran = (f"its output matches {c['against']}" if c else
               "the launcher runs and returns, its loads and stores inside its arrays (nothing checked its output)")
        if _all_empty(f):  # no program ran: nothing of the kernel's body was looked at, in or out of bounds
            return ("ran under the interpreters (no GPU): an empty grid (0 programs), so the kernel's body never ran "
                    "and nothing in it was checked; no timing or occupancy here",
                    "give it inputs of the size it runs on (--input NAME=DTYPE[SHAPE])")
        return (f"ran under the interpreters (no GPU): {ran}; no timing or occupancy here",
                "run it on a GPU for registers, occupancy and the roof")


def _all_empty(f) -> bool:
    """Whether every launch had a grid of no programs (as empty inputs give): a dimension of 0, or below it (a grid
    computed from a negative length: the interpreter runs none, a GPU's Triton launcher skips a grid whose product
    is not positive)."""
    launches = f.get("launches") or ([f["main"]] if f.get("main") else [])
    # a launch whose grid was not recorded is not known to be empty
    return bool(launches) and all(ln.get("grid") and min(ln["grid"]) <= 0 for ln in launches)


def wrong(f):
    c = f.get("check")
    if c and not c.get("passed"):
        return (f"WRONG: its output differs from {c.get('against', 'the reference')}: {c.get('summary')}",
                "fix its correctness first: a timing of a wrong answer means nothing")


def no_launch(f):
    if not f.get("launches"):
        return ("no Triton or Numba CUDA kernel launch seen", "make the launcher call a @triton.jit or @cuda.jit kernel")


def empty(f):
    if f.get("main") and _all_empty(f):
        # not a small grid to split: no program ran, so no time, roof or occupancy describes the kernel
        return ("an empty grid (0 programs): the launch ran no work (empty inputs?), so nothing here describes the "
                "kernel", "give it inputs of the size it runs on (--input NAME=DTYPE[SHAPE])")


def at_roof(f):
    p = f.get("pct_of_roof")
    if p is not None and p > 100 * IMPLAUSIBLE_OVER_ROOF:  # no cache is that fast: the counts were not the work
        return (f"{_pct(p)} of the {_roof_name(f)} roof, {ABOVE_ROOF['implausible']}",
                "pass bytes= (--bytes) and flops= (--flops) as one call's launches move them")
    if p is not None and p > ABOVE_PCT and f.get("bound") == "memory":
        # after bench's flush the inputs come from memory: the rest is outputs L2 took in, written back after the kernel
        return (f"above the {_roof_name(f)} roof ({_pct(p)}): cache-resident data, part of the traffic stayed in L2 "
                "(outputs smaller than L2 are written back to memory after the kernel ends)",
                "time it on data larger than L2 to judge it against device memory")
    if p is not None and p >= DONE_PCT:
        return f"at {_pct(p)} of the {_roof_name(f)} roof: done", "none: it is at its roof"


def at_copy(f):
    p, c = f.get("pct_of_roof"), f.get("copy_pct")
    if p is not None and c and f.get("bound") == "memory" and p >= COPY_MATCH * c:
        return (f"at {_pct(p)} of the copy roof, where device copies of the same bytes per launch reach {_pct(c)}: "
                "at the practical roof for this launch size",
                "more bytes per launch: fuse it with the kernels beside it, or batch the calls")


def spills(f):
    worst = max(f.get("launches") or [], key=lambda la: la.get("spills") or 0, default=None)
    if worst and (worst.get("spills") or 0) > 0:
        # the spilled values are per thread: fewer elements per thread, so a smaller BLOCK or more warps for it
        # (fewer warps for the same BLOCK spills more)
        lever = ("fewer elements per thread: a smaller BLOCK, or more num_warps" if worst.get("backend") == "triton"
                 else "fewer live values or smaller local arrays per thread")
        return f"{worst['kernel']} spills {worst['spills']} bytes per thread: {lever}", lever


def small_grid(f):
    m, sms = f.get("main"), f.get("sms")
    if m and sms:
        n = m["grid"][0] * m["grid"][1] * m["grid"][2]
        if n < sms:
            word = "programs" if m.get("backend") == "triton" else "blocks"
            return (f"grid of {n} {word} on {sms} SMs: split the work",
                    "more, smaller programs (smaller BLOCK, split the reduction or the rows)")


def _autotuner_tried(m: dict | None, **config) -> bool:
    """Whether the launch's autotuner timed a config with these settings (and so chose against it)."""
    tried = ((m or {}).get("autotune") or {}).get("tried") or []
    return any(r.get("time_ms") is not None and all((r.get("config") or {}).get(k) == v for k, v in config.items())
               for r in tried)


def _occupancy_lever_tried(m: dict | None) -> bool:
    """The occupancy rule's Triton lever (half the warps for registers, fewer stages for shared memory) was among
    the configs the autotuner timed: it chose otherwise, so that lever is spent."""
    occ = (m or {}).get("occupancy")
    if not occ or (m or {}).get("backend") != "triton":
        return False
    nw, ns = m.get("num_warps") or 4, m.get("num_stages") or 1
    if occ["limiter"] == "registers" and nw > 1:
        return _autotuner_tried(m, num_warps=nw // 2)
    if occ["limiter"] == "shared_memory":
        return any(_autotuner_tried(m, num_stages=s) for s in range(1, ns))
    return False


def occupancy(f):
    m = f.get("main")
    occ = (m or {}).get("occupancy")
    if not occ or occ["pct"] > LOW_OCCUPANCY_PCT or _occupancy_lever_tried(m):
        return None
    lim, pct, tri = occ["limiter"], _pct(occ["pct"]), m.get("backend") == "triton"
    nw = m.get("num_warps") or 4
    if lim == "registers":
        if tri:
            lever = f"try num_warps={nw // 2}" if nw > 1 else "a smaller BLOCK (fewer registers per thread)"
        else:
            lever = "fewer registers per thread (less per-thread state, or max_registers= in @cuda.jit)"
    elif lim == "shared_memory":
        lever = "fewer num_stages or smaller tiles" if tri else "smaller shared-memory tiles per block"
    elif lim == "blocks":
        lever = "bigger blocks: more threads per block (num_warps up)" if tri else "bigger blocks (128-256 threads)"
    else:
        lever = "a block size that divides the SM's warps (128-256 threads)"
    word = {"registers": "register", "shared_memory": "shared-memory", "blocks": "block-count", "warps": "warp"}[lim]
    return f"{word}-limited to {pct} occupancy: {lever}", lever


def launch_bound(f):
    t, p = f.get("time_s"), f.get("pct_of_roof")
    if t is not None and t < LAUNCH_BOUND_S and (p is None or p < LOW_ROOF_PCT):
        return (f"launch-bound: {t * 1e6:.1f} us per call" + (f" at {_pct(p)} of the roof" if p is not None else ""),
                "fuse launches / more work per launch / a CUDA graph")


def _mix_text(m: dict | None) -> str:
    """'its loop body (PTX): integer/logic 62 %, fp64 10 %, warp vote 9 %' from the main launch's instruction mix."""
    mix = (m or {}).get("instruction_mix")
    if not mix:
        return ""
    return ("its loop body" if mix.get("loops") else "its code") + f" (PTX): {instructions.summary(mix, top=5)}"


def _version_below(version: str | None, major: int, minor: int) -> bool:
    try:
        got = tuple(int(x) for x in (version or "").split(".")[:2])
    except ValueError:
        return False
    return len(got) == 2 and got < (major, minor)


def own_work(f):
    p, c, occ = f.get("pct_of_roof"), f.get("copy_pct"), f.get("occupancy_pct")
    if (p is not None and c and f.get("bound") == "memory" and p < LOW_ROOF_PCT and p * OWN_WORK_GAP <= c
            and (occ is None or occ > LOW_OCCUPANCY_PCT or _occupancy_lever_tried(f.get("main")))):
        # the same bytes, as many launches, move far faster as copies: memory latency with this many warps is not it
        m = f.get("main") or {}
        mix = _mix_text(m)
        said = (f"bound by its own instructions at {_pct(p)} of the copy roof: device copies of the same bytes reach "
                f"{_pct(c)}" + (f" and occupancy is {_pct(occ)}" if occ is not None else "") +
                ", so the time goes to the work between the loads" + (f"; {mix}" if mix else
                " (instruction issue or dependent arithmetic; which of the two needs hardware counters)"))
        lever = ("fewer instructions per element (cheaper index math, arithmetic or counting); then more "
                 "independent elements per thread")
        shares = (m.get("instruction_mix") or {}).get("shares") or {}
        if (m.get("backend") == "triton" and shares.get("warp vote", 0) >= BALLOT_SHARE
                and _version_below(f.get("triton_version"), 3, 7)):
            lever = (f"warp ballots are {_pct(100 * shares['warp vote'])} of its loop: Triton {f['triton_version']} "
                     "counts tl.histogram with ballots and popc, Triton 3.7 and later with one shared-memory atomic "
                     "per element (triton-lang/triton#9517); where the ballots are tl.histogram's, upgrade Triton, or "
                     "count in shared memory through inline PTX (as gpuspeed.examples.hand_kernels.histogram does); "
                     "else " + lever)
        return said, lever


def compute_mix(f):
    p, occ, roof = f.get("pct_of_roof"), f.get("occupancy_pct"), f.get("roof")
    mix = (f.get("main") or {}).get("instruction_mix") or {}
    n = (mix.get("kinds") or {}).get(roof, 0)
    if (p is not None and f.get("bound") == "compute" and p < LOW_ROOF_PCT and n
            and (occ is None or occ > LOW_OCCUPANCY_PCT)):
        # a flop roof is one FMA (2 flops) per lane per cycle: other instructions in the loop cost that rate
        fma = (mix.get("fma") or {}).get(roof, 0)
        return (f"compute-bound at {_pct(p)} of the {roof} roof" + (f" with {_pct(occ)} occupancy" if occ is not None
                                                                   else "") +
                f"; {_mix_text(f.get('main'))}; {fma} of its {n} {roof} instructions are FMAs (the roof counts each "
                "as an FMA's 2 flops)",
                "more flops per instruction: an FMA wherever a * b + c appears, fewer selects, conversions and integer "
                "work beside the arithmetic; in a loop whose lanes finish apart, fewer idle lanes (work of like "
                "length in a warp)")


def latency(f):
    p = f.get("pct_of_roof")
    occ = f.get("occupancy_pct")
    if p is not None and p < LOW_ROOF_PCT and (occ is None or occ > LOW_OCCUPANCY_PCT):
        return (f"latency-bound at {_pct(p)} of the {_roof_name(f)} roof" +
                (f" with {_pct(occ)} occupancy" if occ is not None else ""),
                "more work per program / fuse (more loads in flight per thread)")


def tune(f):
    p = f.get("pct_of_roof")
    if p is not None:
        triton = (f.get("main") or {}).get("backend", "triton") == "triton"
        return (f"at {_pct(p)} of the {_roof_name(f)} roof",
                "tune BLOCK sizes, num_warps and num_stages (autotune over them)" if triton else
                "tune the block shape and the work per thread (time a few)")


def unplaced(f):
    occ = f.get("occupancy_pct")
    text = f"occupancy {_pct(occ)} ({f.get('limiter')}-limited)" if occ is not None else "no occupancy figures"
    # on a GPU the ceilings are always found (committed or measured now): only a call moving no counted bytes is unplaced
    return (f"{text}; no roof position (no bytes counted: no array among its arguments or output)",
            "pass bytes= (--bytes) and flops= (--flops) to place it on the roofline")


RULES = [no_launch, wrong, no_gpu, empty, at_roof, at_copy, spills, small_grid, occupancy, launch_bound, own_work,
         compute_mix, latency, tune, unplaced]


def judge(facts: dict) -> tuple[str, str, str]:
    """(rule name, verdict, next lever): the first rule in RULES that fits the facts."""
    for rule in RULES:
        got = rule(facts)
        if got:
            return rule.__name__, got[0], got[1]
    raise AssertionError("the last rule always fits")


def main_launch(launches: list[dict]) -> dict | None:
    """The launch that starts the most threads (grid x threads per block x times it ran)."""
    def threads(la):
        g = la["grid"][0] * la["grid"][1] * la["grid"][2]
        return g * (la.get("threads_per_block") or 1) * la.get("count", 1)
    return max(launches, key=threads, default=None)
