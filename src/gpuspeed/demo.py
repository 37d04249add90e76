"""The `gpuspeed bench` demo: time a NumPy function and its torch version, check, compare, record."""

from __future__ import annotations

from gpuspeed import device as _device
from gpuspeed.examples import softmax as ex
from gpuspeed.results import make_results
from gpuspeed.timing import bench, compare
from gpuspeed.verify import check


def run_demo(device: str = "auto", shape: tuple[int, int] | None = None, budget_s: float = 2.0) -> dict:
    """Bench the bundled softmax example; returns a results document (study "bench_demo")."""
    import torch

    where = _device.resolve_device(device)
    chosen = shape
    shape = shape or (ex.GPU_SHAPE if where == "cuda" else ex.CPU_SHAPE)
    _check_fits(shape, where)
    x = ex.make_inputs(shape)
    xt = torch.from_numpy(x).to(where)
    # "smaller" only where gpuspeed picked the CPU's default shape, not the user's --rows/--cols
    notes = [] if where == "cuda" else ["no GPU: both versions run on the CPU" + ("" if chosen else ", at a smaller size")]

    slow = bench(ex.softmax_numpy, x, name="softmax_numpy (NumPy, CPU)", device="cpu", budget_s=budget_s)
    fast = bench(ex.softmax_torch, xt, name=f"softmax_torch ({where})", device=where, budget_s=budget_s)
    cmp = compare(slow, fast)
    # fresh inputs for the correctness check, never the timing buffers
    fresh = ex.make_inputs(shape, seed=1)
    result = check(ex.softmax_torch(torch.from_numpy(fresh).to(where)), ex.softmax_reference(fresh))
    bytes_moved = 2 * x.nbytes  # read once, write once
    rows = []
    for m in (slow, fast):
        rows.append({"name": m.name, "median_s": m.median, "rel_noise": m.rel_noise, "rel_iqr": m.rel_iqr,
                     "n": m.n, "mode": m.mode, "throttled": m.throttled, "unreliable": m.unreliable,
                     "shared_gpu": m.shared_gpu,
                     "GBps": bytes_moved / m.median / 1e9, "measurement": m.to_dict()})
        notes += [f"{m.name}: {n}" for n in m.notes if n.startswith("unreliable") or "other process" in n]
    summary = {"speedup": cmp.speedup, "speedup_ci_low": cmp.ci_low, "speedup_ci_high": cmp.ci_high,
               "verdict": cmp.verdict, "check_passed": result.passed, "rel_l2_err": result.rel_l2_err,
               "unreliable": slow.unreliable or fast.unreliable,
               "fast_GBps": bytes_moved / fast.median / 1e9}
    pct = _device.pct_of_datasheet(summary["fast_GBps"], _device.get_device(where).name, "mem")
    if where == "cuda":
        summary["fast_pct_of_datasheet_bw"] = pct
    notes.append(f"check: {result.summary}")
    return make_results("bench_demo", params={"shape": list(shape), "device": where, "budget_s": budget_s},
                        summary=summary, rows=rows, notes=notes, device=where)


HOST_BYTES_PER_ELEMENT = 52  # two float32 inputs, NumPy's float32 temporaries, the float64 reference's four arrays
GPU_BYTES_PER_ELEMENT = 16  # the input and torch's softmax temporaries, float32


def _check_fits(shape: tuple[int, int], where: str) -> None:
    """A one-line error before anything is allocated when the demo's arrays cannot fit in free memory."""
    from gpuspeed.errors import UserError
    from gpuspeed.inputs import gpu_available_bytes, host_available_bytes

    n = int(shape[0]) * int(shape[1])
    need = [("host", n * HOST_BYTES_PER_ELEMENT, host_available_bytes())]
    if where == "cuda":
        need.append(("GPU", n * GPU_BYTES_PER_ELEMENT, gpu_available_bytes("cuda")))
    for what, needed, free in need:
        if free is not None and needed > free:
            raise UserError(f"a {shape[0]} x {shape[1]} softmax needs ~{needed / 2**30:.1f} GiB of {what} memory, "
                            f"{free / 2**30:.1f} GiB is free: pass smaller --rows/--cols")
