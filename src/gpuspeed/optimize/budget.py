"""The memory budget: which axis a workload can be chunked along, and how big a chunk fits.

The axis is the workload's BATCH_AXIS, or one proposed here after checking on small inputs that the
original is independent along it (outputs of two uneven pieces, concatenated, equal the output of the
whole). The chunk size comes from the planner: the candidate's peak measured at two chunk sizes under
the budget's 15 % headroom (gpuspeed.memory.plan_chunks), two chunks in flight for the two-stream pipeline;
then the pipeline itself is measured on its first chunks (both streams' cached blocks, staging, rounding:
everything alive at once) and the chunk re-planned once from that peak when it is over the limit.
"""

from __future__ import annotations

import math

import numpy as np

from gpuspeed.errors import UserError
from gpuspeed.memory import HEADROOM
from gpuspeed.optimize.backends.common import take
from gpuspeed.trees import leaves, nbytes
from gpuspeed.verify import check

SMALL_SCALE = 0.02  # inputs for the independence test, when the workload takes `scale`
# share of the budget a pipelined run leaves for what one chunk's peak does not show: blocks cached per
# stream and split by the short last chunk, allocation rounding
PIPELINE_SLACK = 0.05
REPLAN_TARGET = 0.9  # a re-plan from a measured pipeline peak aims this far under the limit
CAP_NEAR = 0.97  # a measured peak this close to the cap may be the allocator holding itself under it
CAPPED_TARGET = 0.75  # ... then the re-plan aims lower still: the demand above the cap was not seen


def _split_check(fn, args, axes: dict, rtol, atol):
    """out_axes if fn is independent along `axes` (checked on a 1/3 : 2/3 split), else None."""
    n = args[next(iter(axes))].shape[next(iter(axes.values()))]
    if n < 3:
        return None
    cut = n // 3
    parts = []
    for lo, hi in ((0, cut), (cut, n)):
        parts.append(fn(*(take(a, axes[i], lo, hi) if i in axes else a for i, a in enumerate(args))))
    whole = fn(*args)
    lw, l1, l2 = leaves(whole), leaves(parts[0]), leaves(parts[1])
    out_axes = []
    for w, p1, p2 in zip(lw, l1, l2, strict=False):
        w, p1, p2 = np.asarray(w), np.asarray(p1), np.asarray(p2)
        found = None
        for k in range(w.ndim):
            if w.shape[k] == n and p1.shape[k] == cut and p2.shape[k] == n - cut:
                if check(np.concatenate([p1, p2], axis=k), w, rtol=rtol, atol=atol).passed:
                    found = k
                    break
        if found is None:
            return None
        out_axes.append(found)
    return out_axes


def _small_inputs(wl) -> tuple[tuple | None, str]:
    """(inputs at SMALL_SCALE, where they come from), or (None, why there are none): inputs() takes no scale, or
    makes no fewer bytes with it (it ignores its scale: those are the full inputs, as slow as the run's)."""
    if not wl.scale_used:
        return None, "inputs() takes no scale"
    import numpy.random as npr

    small_scale = min(wl.scale, SMALL_SCALE)

    def make(seed, scale):
        out = wl.module.inputs(npr.default_rng(seed), scale=scale)
        return out if isinstance(out, tuple) else tuple(out) if isinstance(out, list) else (out,)
    args = make(7, small_scale)
    if small_scale < wl.scale and nbytes(args) >= nbytes(make(7, wl.scale)):
        return None, f"inputs(rng, scale) makes as many bytes at scale {small_scale:g} as at {wl.scale:g}"
    return args, f"inputs at scale {small_scale:g}"


def propose_axes(wl, max_original_s: float = 5.0, original_s: float | None = None) -> dict:
    """{"axes": {arg: axis}, "out_axes": [...], "note": why} or {"axes": None, "note": why not}."""
    args, where = _small_inputs(wl)
    if args is None:
        if original_s is not None and original_s * 3 > max_original_s:
            return {"axes": None, "note": f"no small inputs ({where}) and the original is too slow to test an axis "
                                          "on full ones"}
        args = wl.make_args(7)
        where = "the full inputs"
    rtol = wl.rtol if wl.rtol is not None else 1e-9
    atol = wl.atol
    tries = []
    if wl.batch_axis:
        tries.append(dict(wl.batch_axis))
    else:
        for i, a in enumerate(args):
            if isinstance(a, np.ndarray) and a.ndim:
                for ax in range(a.ndim):
                    if a.shape[ax] >= 3:
                        tries.append({i: ax})
    for axes in tries:
        try:
            out_axes = _split_check(wl.original, args, axes, rtol, atol)
        except Exception:
            out_axes = None
        if out_axes is not None:
            src = "BATCH_AXIS" if wl.batch_axis else "proposed"
            desc = ", ".join(f"argument {i} axis {ax}" for i, ax in axes.items())
            return {"axes": axes, "out_axes": out_axes, "source": src,
                    "note": f"chunk along {desc} ({src}; checked on {where}: two uneven pieces give the whole's "
                            f"output along output axes {out_axes})"}
    if wl.batch_axis:
        return {"axes": None, "note": f"BATCH_AXIS {wl.batch_axis} failed the independence check on {where}"}
    return {"axes": None, "note": f"no axis along which the original is independent (checked on {where})"}


def measured_pair(measure, a: int, b: int) -> tuple[int, int, str]:
    """(peak at a items, peak at b > a items, a note): measure(size) is one chunk's peak. A pair that does not grow
    is measured once more and each size keeps its lower reading: what inflates one reading only adds to it (a
    first-use cost, or another process's memory in NVML's device-wide count), and taken as read the falling pair
    planned the whole input as one chunk, the size that had not fit."""
    pa, pb = int(measure(a)), int(measure(b))
    if pb > pa:
        return pa, pb, ""
    pa2, pb2 = int(measure(a)), int(measure(b))
    return (min(pa, pa2), min(pb, pb2),
            f"; measured twice, the first pair did not grow ({pa / 2**20:.0f} then {pb / 2**20:.0f} MiB)")


def plan_for_pipeline(size_a: int, peak_a: int, size_b: int, peak_b: int, budget_bytes: int, in_flight: int = 1,
                      max_size: int | None = None):
    """The chunk plan (gpuspeed.memory.ChunkPlan) for a run that holds `in_flight` chunks at once.

    Two peaks of one chunk give peak = fixed + per_item * size. The two-stream pipeline has two chunks in
    flight, and each stream's allocator (CuPy's per-stream arenas, torch's per-stream blocks) keeps its
    chunk's blocks cached for that stream alone, so its peak is fixed + in_flight * per_item * size: a chunk
    sized for one in flight ran the pipeline to twice its working set and out of memory under cap()."""
    from gpuspeed.memory import plan_chunks

    slope = (peak_b - peak_a) / (size_b - size_a)
    fixed = peak_a - slope * size_a

    def pipeline_peak(size):
        return int(round(fixed + in_flight * slope * size))

    planned = int(budget_bytes * (1 - PIPELINE_SLACK)) if in_flight > 1 else int(budget_bytes)
    planned = f"{planned}B"  # with its unit: a bare count under 1 MiB (`--budget 1MB`) is refused as ambiguous
    if slope <= 0:
        # no per-item cost to multiply by the chunks in flight: a falling pair (a first-use cost at the smaller
        # chunk) doubled went below zero; plan_chunks judges a flat or falling peak by the larger measured one
        return plan_chunks(size_a, peak_a, size_b, peak_b, planned, max_size=max_size)
    return plan_chunks(size_a, pipeline_peak(size_a), size_b, pipeline_peak(size_b), planned, max_size=max_size)


def replan_from_measured(size: int, measured_peak: int, fixed: float, budget_bytes: int,
                         headroom: float = HEADROOM, max_size: int | None = None) -> tuple[int, str]:
    """The chunk size after a chunked run measured `measured_peak` at `size` items per chunk: unchanged when
    it fits budget x (1 - headroom), else re-planned once from that peak (the pipeline's own bytes per item,
    every buffer and cached block included, times items) to REPLAN_TARGET of the limit. A peak within
    CAP_NEAR of the budget may have been held down by the allocator under cap(), which frees its cached
    blocks to stay under the limit: the real demand is unknown above it, so the aim is lower still."""
    usable = budget_bytes * (1 - headroom)
    if measured_peak <= usable:
        return size, f"measured {measured_peak / 2**20:.0f} MiB at {size} items per chunk: fits"
    fixed = max(0.0, min(float(fixed), measured_peak - 1.0))
    per_item = (measured_peak - fixed) / size
    target = usable * REPLAN_TARGET
    capped = measured_peak >= CAP_NEAR * budget_bytes
    if capped:
        target *= CAPPED_TARGET
    new = int(math.floor((target - fixed) / per_item))
    new = max(1, min(new, size - 1, max_size or new))
    why = (f"measured {measured_peak / 2**20:.0f} MiB at {size} items per chunk, over the {usable / 2**20:.0f} MiB "
           f"limit{' (at the cap: the allocator freed its cache to stay under, the demand is higher)' if capped else ''}"
           f": re-planned from that peak ({per_item / 2**20:.3f} MiB per item in flight) to {new} items, predicted "
           f"{(fixed + per_item * new) / 2**20:.0f} MiB")
    return new, why


def _pipeline_peak(impl, args, axes: dict, out_axes, size: int, library: str, budget_bytes: int) -> tuple[int, str]:
    """The measured peak of the chunked pipeline itself at `size` items per chunk, on its first three chunks
    (both streams have held a chunk and one has reused its cached blocks: the steady state). An
    out-of-memory error under cap() counts as the whole budget."""
    from gpuspeed.memory import peak_memory
    from gpuspeed.optimize.backends.chunking import chunked

    i0, ax0 = next(iter(axes.items()))
    stop = min(args[i0].shape[ax0], 3 * size)
    sub = tuple(take(a, axes[i], 0, stop) if i in axes else a for i, a in enumerate(args))
    run = chunked(impl, axes, out_axes, size, library)
    try:
        rep = peak_memory(run, *sub, device="cuda")
    except Exception as exc:  # noqa: BLE001 - only running out of memory is an answer here
        text = f"{type(exc).__name__}: {exc}".lower()
        if "out of memory" not in text and "outofmemory" not in text:
            raise
        _release(library)
        return int(budget_bytes), "out of memory under the cap"
    return int(rep.peak_bytes), f"peak from {rep.peak_source}"


def _release(library):
    """Cached blocks back to the device after an out-of-memory error, so the next measurement starts clean."""
    import sys

    if library == "cupy" and "cupy" in sys.modules:
        sys.modules["cupy"].get_default_memory_pool().free_all_blocks()
    if "torch" in sys.modules:
        sys.modules["torch"].cuda.empty_cache()


def chunk_size_for(impl, wl, spec: dict, chunk: dict, library: str | None = None) -> tuple[int, str]:
    """The chunk size for a candidate: the spec's, or the planner's for the budget (GPU), or a quarter.
    library: 'cupy' or 'torch' for the two-stream pipeline (two chunks in flight), None for chunks one
    after another. The pipeline's plan is then checked by measuring the pipeline itself and re-planned
    once from its measured peak if that is over the limit."""
    from gpuspeed.optimize.worker import host_inputs

    axes = {int(k): int(v) for k, v in chunk["axes"].items()}
    in_flight = 2 if library else 1
    args = host_inputs(wl, spec["timing_seed"])
    i0, ax0 = next(iter(axes.items()))
    n = args[i0].shape[ax0]
    if chunk.get("size"):
        return int(chunk["size"]), f"chunk size {chunk['size']} given"
    if spec["device"] != "cuda" or not spec.get("budget_bytes"):
        size = max(1, n // 4)
        return size, f"no GPU budget to plan against: {size} items per chunk (a quarter)"
    from gpuspeed.memory import peak_memory

    def run_chunk(size):
        sub = tuple(take(a, axes[i], 0, size) if i in axes else a for i, a in enumerate(args))
        return impl(*sub)

    budget_bytes = spec["budget_bytes"]
    a, b = max(1, n // 32), max(2, n // 16)
    pa, pb, again = measured_pair(lambda size: peak_memory(run_chunk, size, device="cuda").peak_bytes, a, b)
    plan = plan_for_pipeline(a, pa, b, pb, budget_bytes, in_flight=in_flight, max_size=n)
    if not plan.max_chunk:
        raise UserError(f"no chunk fits the budget: {plan.note}")
    size = int(min(plan.max_chunk, n))
    pred = f"{plan.predicted_peak_bytes / 2**30:.2f} GiB" if plan.predicted_peak_bytes else "?"
    per_item = (pb - pa) / (b - a)
    fixed = pa - per_item * a
    line = (f"peak = {fixed / 2**20:.0f} MiB + {per_item / 2**20:.3f} MiB per item per chunk" if per_item > 0 else
            f"peak {pa / 2**20:.0f} MiB at {a} items and {pb / 2**20:.0f} MiB at {b}: no per-item growth")
    note = (f"chunk planner: {line} (measured at {a} and {b} items{again}), {in_flight} chunk(s) in flight; {size} "
            f"items per chunk, predicted peak {pred}, {plan.note}")
    if not library or size >= n:
        return size, note
    measured, how = _pipeline_peak(impl, args, axes, chunk["out_axes"], size, library, budget_bytes)
    new, why = replan_from_measured(size, measured, fixed, budget_bytes, max_size=n)
    note += f"; the pipeline itself on its first chunks: {why} ({how})"
    if new != size:
        again, how = _pipeline_peak(impl, args, axes, chunk["out_axes"], new, library, budget_bytes)
        note += f"; at {new} items measured {again / 2**20:.0f} MiB ({how})"
        size = new
    return size, note
