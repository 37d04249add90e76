"""The bundled examples' hand kernels (gpuspeed/examples/hand_kernels): each one's time on device-resident inputs, its
position on the roofline, occupancy and limiting resource (gpuspeed.kernel_report), and its speedup over the best
automatic candidate of `gpuspeed optimize` on the same example; writes results/<gpu>/kernels.json.

    python benchmarks/kernels.py [--out DIR] [--examples a,b] [--quick] [--optimize-json PATH] [--time-budget S]
                                 [--scale-up K]

The comparison with optimize: by default each example gets one `gpuspeed optimize` run (its hand kernels are among
the candidates, as the example's `variants`), and a kernel's speedup is the best non-variant candidate's device time
there over the kernel's time from kernel_report here (same shapes, same seeds; both with L2 flushed).
--optimize-json reads an existing run instead: one optimize_<example>.json, or a folder holding
<example>/optimize_<example>.json (results/<gpu>/optimize); its own times for the variants are kept beside
(variant_device_s), not used: the run may predate a kernel's current code. Without a GPU the kernels run under the
interpreters at a small scale, for correctness only: no timings (a note says so). A float32 variant (`precision =
"float32"`) gets float32 inputs, as optimize gives them, is checked against the float64 original under the example's
TOLERANCE, its bytes counted at 4 an element, and compared with the float32-demoted candidates (column `precision`).
A kernel whose verdict puts the blame on its launch size (launch-bound, or as fast as device copies of the same bytes
per launch) is measured again on inputs --scale-up times larger (row key `scaled_up`), for information only: the
summary and the issue's targets count the example's own size.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

EXAMPLES = ["row_normalize_loop", "pairwise_distance", "heat_stencil", "histogram", "mandelbrot", "row_stats"]
ROOF_TARGET = 70.0  # % of the roof a hand kernel should reach (issue 11)


def work(example: str, variant: str, args: tuple, out=None, fp32: bool = False) -> tuple[float | None, int]:
    """(useful FLOPs, least DRAM bytes) of one call: every input read once and every output written once, except
    the stencil, which reads and writes the grid once per step (a launch a step), and the escape-time loop,
    whose FLOPs are the iterations the pixels actually ran (8 per iteration). None: FLOPs not meaningful (the
    histogram's index arithmetic); the kernel is held to the memory roof. fp32: a float32 variant (only the
    row normalization and the stencil have one), whose data are 4 bytes an element."""
    if fp32 and example not in ("row_normalize_loop", "heat_stencil"):
        raise KeyError(f"{example}: no float32 byte count")
    w = 4 if fp32 else 8
    if example == "row_normalize_loop":
        r, c = args[0].shape
        return 6.0 * r * c, 2 * w * r * c
    if example == "row_stats":
        r, c = args[0].shape
        return 10.0 * r * c, 8 * r * c + 8 * c + 24 * r
    if example == "pairwise_distance":
        (n, d), m = args[0].shape, args[1].shape[0]
        return float(n * m * (3 * d + 1)), 8 * n * m + 8 * (n + m) * d
    if example == "heat_stencil":
        g, steps = args[0], int(args[2])
        r, c = g.shape
        return 7.0 * (r - 2) * (c - 2) * steps, 2 * w * r * c * steps
    if example == "histogram":
        return None, 8 * int(np.asarray(args[0]).size) + 8 * int(args[1])
    if example == "mandelbrot":
        w, h = len(args[0]), len(args[1])
        iters = float(np.asarray(out).sum()) if out is not None else float(w * h * int(args[2]))
        return 8.0 * iters, 8 * (w + h) + 8 * w * h
    raise KeyError(example)


def to_device(args, gpu: bool, fp32: bool = False):
    """The arguments as torch tensors on the device; fp32: float64 arrays cast to float32 first (as the optimize
    worker casts a float32 variant's inputs, before its timing)."""
    import torch

    def one(a):
        if not isinstance(a, np.ndarray):
            return a
        a = a.astype(np.float32) if fp32 and a.dtype == np.float64 else a
        return torch.from_numpy(np.ascontiguousarray(a)).to("cuda" if gpu else "cpu")

    return tuple(one(a) for a in args)


def optimize_doc(example: str, a, out_dir: Path, here) -> tuple[dict | None, str]:
    """The optimize results document for the example: read from --optimize-json, or made by one run now (here: this
    run's DeviceInfo). A document measured on another device is not used: a speedup across two GPUs is no speedup of
    the kernel."""
    from gpuspeed.results import measured_elsewhere

    if a.optimize_json:
        p = Path(a.optimize_json)
        if p.is_dir():
            p = p / example / f"optimize_{example}.json"
        if not p.is_file():
            return None, f"no optimize results at {p}"
        try:
            doc = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
            return None, f"{p} is not a readable results file ({type(exc).__name__})"
        if not isinstance(doc, dict) or Path(str(doc.get("params", {}).get("workload", ""))).stem != example:
            return None, f"{p} is not a run of {example}"
        theirs = measured_elsewhere(doc, here)
        if theirs:
            return None, (f"{p} was measured on {theirs}, this run on {here.name}: no speedup (pass an optimize run "
                          f"from this device, or leave out --optimize-json)")
        return doc, f"read from {p}"
    folder = out_dir / "kernels_optimize" / example
    cmd = [sys.executable, "-m", "gpuspeed", "optimize", example, "--out", str(folder), "--json",
           "--time-budget", str(a.time_budget)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT / "src"), env.get("PYTHONPATH")] if p)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{example}.log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    path = folder / f"optimize_{example}.json"
    if rc != 0 or not path.is_file():
        return None, f"`gpuspeed optimize {example}` failed (rc {rc}): see {folder.parent / (example + '.log')}"
    (folder / "refs.pkl").unlink(missing_ok=True)  # large, rebuilt by any run
    for spec in (folder / "work").glob("*.spec.json"):  # scratch, as benchmarks/optimize.py leaves it
        spec.unlink()
    return json.loads(path.read_text()), f"`gpuspeed optimize {example} --time-budget {a.time_budget:g}` run now"


def reduced_precision(name: str) -> bool:
    """An optimize candidate demoted to float32 (or TF32): its inputs are cast before the timing and its outputs
    cast back after it, so it moves half the bytes of a float64 kernel."""
    return "fp32" in name or "tf32" in name


def candidates(doc: dict, fp32: bool = False) -> tuple[dict, tuple[str, float] | None, tuple[str, float] | None]:
    """({variant name: device seconds}, (best automatic candidate, device seconds), the same among the candidates
    in the kernel's precision: the original's, or with fp32 the float32-demoted ones) from an optimize document:
    candidates that passed their checks, the original and the hand variants excluded from 'automatic'."""
    variants, best, best_same = {}, None, None
    for r in doc.get("rows", []):
        t = r.get("device_s")
        if r.get("status") != "ok" or not t:
            continue
        name = str(r.get("name", ""))
        if r.get("backend") == "variant" or name.startswith("variant:"):
            variants[name.split(":", 1)[-1]] = t
        elif r.get("backend") != "original":
            if best is None or t < best[1]:
                best = (name, t)
            if reduced_precision(name) == fp32 and (best_same is None or t < best_same[1]):
                best_same = (name, t)
    return variants, best, best_same


def reference(example: str, args):
    """The example's original on (copies of) these arguments: what every kernel is checked against."""
    ex = importlib.import_module(f"gpuspeed.examples.{example}")
    return ex.original(*[np.array(x, copy=True) if isinstance(x, np.ndarray) else x for x in args])


def limited_by_launch_size(row: dict) -> bool:
    """The kernel's verdict says its launch size, not its code, holds it: launch-bound, or as fast as device copies
    of the same bytes per launch (kernel_report's rules launch_bound and at_copy)."""
    return row.get("rule") in ("launch_bound", "at_copy") and bool(row.get("time_s"))


def measure(example: str, variant: str, fn, args, gpu: bool, a, ref=None) -> dict:
    """One hand kernel through kernel_report on device-resident inputs, checked against the original (`ref`: its
    output on these arguments, when already computed)."""
    from gpuspeed import kernel_report

    ex = importlib.import_module(f"gpuspeed.examples.{example}")
    module, name = fn.target
    launcher = getattr(importlib.import_module(module), name)
    fp32 = getattr(fn, "precision", None) == "float32"
    dev = to_device(args, gpu, fp32)
    ref = reference(example, args) if ref is None else ref
    flops, nbytes = work(example, variant, args, ref if example == "mandelbrot" else None, fp32)
    bench_kw = {"budget_s": 0.3 if a.quick else 2.0}
    rep = kernel_report(launcher, *dev, flops=flops, bytes=nbytes, name=f"{example}:{variant}",
                        device="cuda" if gpu else "cpu", bench_kw=bench_kw, expected=ref,
                        against=f"{example}'s original()", **getattr(ex, "TOLERANCE", {}))
    d = rep.to_dict()
    main = next((la for la in d["launches"] if la["kernel"] == d.get("main_kernel")), d["launches"][0] if d["launches"]
                else {})
    place = d.get("placement") or {}
    copy_pct = d.get("copy_pct_of_roof")  # kernel_report's same-bytes copies (memory-bound kernels on a GPU)
    return {"example": example, "variant": variant, "launcher": f"{module}.{name}", "backend": d["backend"],
            "precision": "float32" if fp32 else "as-written", "correct": rep.check["passed"], "check": rep.check["summary"],
            "time_s": d["time_s"], "time_rel_iqr": d["time_rel_iqr"],
            "flops": flops, "bytes": nbytes, "GBps": place.get("GBps"), "TFLOPs": place.get("TFLOPs"),
            "intensity": place.get("intensity"), "bound": place.get("bound"), "roof": place.get("roof"),
            "pct_of_roof": d["pct_of_roof"], "at_70pct_roof": (d["pct_of_roof"] or 0) >= ROOF_TARGET,
            "copy_same_launches_pct_of_roof": copy_pct,
            "occupancy_pct": d["occupancy_pct"], "limiter": d["limiter"], "launches": len(d["launches"]),
            "launch_count": sum(la.get("count", 1) for la in d["launches"]),
            "main_kernel": d.get("main_kernel"), "grid": main.get("grid"), "block": main.get("block"),
            "num_warps": main.get("num_warps"), "num_stages": main.get("num_stages"),
            "registers": main.get("registers"), "spills": main.get("spills"),
            "shared_bytes": (main.get("shared_static") or 0) + (main.get("shared_dynamic") or 0)
            if main.get("registers") is not None else None,
            "autotune_chosen": (main.get("autotune") or {}).get("chosen"),
            "instruction_mix": (main.get("instruction_mix") or {}).get("shares"), "verdict": d["verdict"],
            "next_lever": d["next_lever"], "rule": d["rule"], "note": d.get("note")}


def summarize(rows: list[dict]) -> dict:
    timed = [r for r in rows if r.get("time_s")]
    faster = [r for r in rows if (r.get("speedup_vs_auto") or 0) > 1]
    by_example: dict[str, float] = {}
    for r in rows:
        if r.get("speedup_vs_auto"):
            by_example[r["example"]] = max(by_example.get(r["example"], 0.0), r["speedup_vs_auto"])
    speedups = [r["speedup_vs_auto"] for r in rows if r.get("speedup_vs_auto")]
    same = [r for r in rows if (r.get("speedup_vs_auto_same_precision") or 0) > 1]
    compared = bool(speedups)  # no optimize run to compare with (none here, or another GPU's): unknown, not 0
    return {"kernels": len(rows), "kernels_correct": sum(1 for r in rows if r.get("correct")),
            "kernels_timed": len(timed), "kernels_at_70pct_roof": sum(1 for r in timed if r["at_70pct_roof"]),
            "kernels_faster_than_auto": len(faster) if compared else None,
            # under the target where a plain copy with the same bytes per launch is under it too (the size's floor)
            "kernels_short_where_a_copy_is_too": sum(1 for r in timed if not r["at_70pct_roof"] and
                                                     (r.get("copy_same_launches_pct_of_roof") or 100) < ROOF_TARGET),
            "kernels_faster_than_auto_same_precision": len(same) if compared else None,
            "examples": len({r["example"] for r in rows}),
            "examples_faster_than_auto": sum(1 for s in by_example.values() if s > 1) if compared else None,
            "geomean_speedup_vs_auto": math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups
            else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # the first paragraph: a whole sentence
    ap.add_argument("--out", default=None, help="folder for kernels.json (default results/<gpu>)")
    ap.add_argument("--examples", default=None, help=f"comma-separated (default: {','.join(EXAMPLES)})")
    ap.add_argument("--quick", action="store_true", help="short timings; no optimize run (unless --optimize-json)")
    ap.add_argument("--optimize-json", default=None, help="an optimize_<example>.json, or a folder of "
                    "<example>/optimize_<example>.json, to compare with instead of running optimize")
    ap.add_argument("--time-budget", type=float, default=120.0, help="seconds per example for its optimize run")
    ap.add_argument("--scale", type=float, default=None, help="input scale (default 1 on a GPU, tiny without one)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale-up", type=float, default=64.0,
                    help="a kernel its launch size holds back (launch-bound, or as fast as same-bytes copies) is "
                         "timed again on inputs this many times larger, for information (row key scaled_up); the "
                         "summary and its targets count the example's own size (0: off)")
    a = ap.parse_args(argv)
    from gpuspeed.errors import UserError

    if not (math.isfinite(a.scale_up) and a.scale_up >= 0):
        raise UserError(f"--scale-up must be 0 (off) or positive, got {a.scale_up:g}")
    import torch

    gpu = torch.cuda.is_available()
    if not gpu:  # before any kernel module is imported: the interpreters replace the compilers
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    from gpuspeed.results import (check_out_dir, default_dir, git_commit, make_results, measured_elsewhere,
                                  write_results)
    from gpuspeed.device import get_device

    names = a.examples.split(",") if a.examples else EXAMPLES
    bad = [n for n in names if n not in EXAMPLES]
    if bad:
        raise UserError(f"no hand kernels for {', '.join(bad)} (these have them: {', '.join(EXAMPLES)})")
    out = check_out_dir(a.out) or default_dir("cuda" if gpu else "cpu")
    from gpuspeed.examples.hand_kernels import INTERPRETED_SCALE

    scale = a.scale if a.scale is not None else (1.0 if gpu else INTERPRETED_SCALE)
    notes = ["time_s: kernel_report's gpuspeed.bench median on device-resident inputs (outputs allocated inside the "
             "call); pct_of_roof: against the measured copy bandwidth for memory-bound kernels, the FP64 ceiling "
             "otherwise (roofline.place)",
             "copy_same_launches_pct_of_roof (memory-bound kernels): the % of the same roof reached by as many device "
             "copies as the kernel has launches, moving the same bytes (replayed from one CUDA graph when several), "
             "timed the same way: the practical roof at the kernel's launch size",
             "speedup_vs_auto: the best automatic (non-variant) optimize candidate's device time in the optimize run "
             "over the kernel's time_s from this run (variant_device_s: that run's own time for the variant, which "
             "may predate the kernel's current code); "
             "*_same_precision: against the best candidate in the kernel's own precision: the original's float64, or "
             "for a float32 variant (precision float32) the float32-demoted candidates (a float32 candidate's inputs "
             "are cast before its timing and its outputs after, so it moves half the bytes)",
             f"scaled_up (kernels whose verdict is launch-bound or at the level of same-bytes copies): the same kernel "
             f"on inputs(rng, scale={a.scale_up:g} x scale), checked and timed alike, for information: what it reaches "
             f"where its launch's fixed cost no longer dominates. The summary counts the example's own size only"]
    if not gpu:
        notes.append("no GPU: the kernels ran under TRITON_INTERPRET=1 / NUMBA_ENABLE_CUDASIM=1 at a tiny scale, for "
                     "correctness only; no timings, occupancy or speedups")
    have_numba = importlib.util.find_spec("numba_cuda") is not None or (gpu and importlib.util.find_spec("numba"))
    here = get_device("cuda" if gpu else "cpu")
    kept = []  # rows of examples an earlier call measured and this one does not: several calls make one file
    previous = out / "kernels.json"
    if previous.is_file():
        try:
            earlier = json.loads(previous.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
            notes.append(f"{previous} could not be read ({type(exc).__name__}): none of its rows kept")
            earlier = {}
        if not isinstance(earlier, dict):
            earlier = {}
        elsewhere = measured_elsewhere(earlier, here) if earlier.get("rows") else None
        if elsewhere:  # one file, one device: its rows are not merged
            notes.append(f"rows of {previous} were measured on {elsewhere}, this run on {here.name}: not kept")
        else:  # each kept row carries the commit it was measured at (the file's own stamp is this call's)
            kept = [dict(r, git=r.get("git") or earlier.get("git")) for r in earlier.get("rows", [])
                    if r.get("example") not in names]
    if kept:
        commits = sorted({str(r["git"])[:7] for r in kept})
        notes.append(f"rows kept from an earlier call: {', '.join(sorted({r['example'] for r in kept}))} "
                     f"(at {', '.join(commits)}: each row's git)")
    rows = []
    # every optimize run first, before this process touches the GPU: a CUDA context and cached blocks held here
    # would count in the device-level memory peaks those runs measure
    docs = {}
    for example in names:
        docs[example] = (None, "no GPU") if not gpu else (None, "--quick: no optimize run") \
            if a.quick and not a.optimize_json else optimize_doc(example, a, out, here)
        if gpu and docs[example][0] is None:
            print(f"{example}: {docs[example][1]}", flush=True)
    for example in names:
        ex = importlib.import_module(f"gpuspeed.examples.{example}")
        args = ex.inputs(np.random.default_rng(a.seed), scale=scale)
        ref = reference(example, args)  # once an example: the original is slow
        big = None  # (args, ref) at scale * scale_up, made when a kernel first needs them
        doc, source = docs[example]
        for vname, fn in ex.variants.items():
            fp32 = getattr(fn, "precision", None) == "float32"
            # like for like: a float32 variant against the float32-demoted candidates, the others against float64
            variant_s, best, best_same = candidates(doc, fp32) if doc else ({}, None, None)
            if vname == "numba_cuda" and not have_numba:
                rows.append({"example": example, "variant": vname, "skipped": "numba-cuda is not installed"})
                continue
            print(f"{example}:{vname} ...", flush=True)
            try:
                row = measure(example, vname, fn, args, gpu, a, ref)
            except Exception as exc:  # noqa: BLE001 - one failing kernel does not stop the others
                rows.append({"example": example, "variant": vname, "error": f"{type(exc).__name__}: {exc}"[:300]})
                print(f"  failed: {rows[-1]['error']}", flush=True)
                continue
            if gpu and a.scale_up and limited_by_launch_size(row):
                try:  # a failure here (memory, say) leaves the row measured at the example's size as it is
                    if big is None:
                        big_args = ex.inputs(np.random.default_rng(a.seed), scale=scale * a.scale_up)
                        big = (big_args, reference(example, big_args))
                    up = measure(example, vname, fn, big[0], gpu, a, big[1])
                    row["scaled_up"] = {"scale": scale * a.scale_up} | {
                        k: up[k] for k in ("correct", "time_s", "bytes", "flops", "GBps", "TFLOPs", "pct_of_roof",
                                           "copy_same_launches_pct_of_roof", "occupancy_pct", "grid", "verdict")}
                except Exception as exc:  # noqa: BLE001
                    row["scaled_up"] = {"scale": scale * a.scale_up, "error": f"{type(exc).__name__}: {exc}"[:300]}
            row["optimize_source"] = source
            row["best_auto"], row["best_auto_s"] = best if best else (None, None)
            # the optimize run's own time for this variant is kept for reference only: that run may predate the
            # kernel's current code, so the speedup is this run's kernel_report time against that run's best
            row["variant_device_s"] = variant_s.get(vname)
            mine = row["time_s"]
            row["speedup_basis"] = "kernel_report time against the optimize run's best" if best and mine else None
            row["speedup_vs_auto"] = best[1] / mine if best and mine else None
            # like for like: a float64 hand kernel reads and writes the original's float64, a demoted candidate (and
            # a float32 variant) half as many bytes
            row["best_auto_same_precision"], row["best_auto_same_precision_s"] = best_same if best_same else (None, None)
            row["speedup_vs_auto_same_precision"] = best_same[1] / mine if best_same and mine else None
            row["git"] = git_commit()
            rows.append(row)
            t = row["time_s"]
            print(f"  {'ok' if row['correct'] else 'WRONG'}  " + (f"{t * 1e6:.1f} us, {row['pct_of_roof']:.0f} % of roof, "
                  f"occupancy {row['occupancy_pct']}, {row['limiter']}-limited, x{row['speedup_vs_auto'] or 0:.2f} vs "
                  f"{row['best_auto']}" if t else row.get("note") or ""), flush=True)
            if row.get("scaled_up"):
                up = row["scaled_up"]
                print(f"  at scale {up['scale']:g}: " + (f"failed: {up['error']}" if "error" in up else
                      f"{'ok' if up['correct'] else 'WRONG'}  {(up['time_s'] or 0) * 1e6:.1f} us, "
                      f"{up['pct_of_roof'] or 0:.0f} % of roof"), flush=True)
        all_rows = kept + rows
        params = {"examples": sorted({r["example"] for r in all_rows}), "scale": scale, "scale_up": a.scale_up,
                  "seed": a.seed, "quick": a.quick,
                  "optimize_json": a.optimize_json, "time_budget_s": a.time_budget, "roof_target_pct": ROOF_TARGET}
        doc_out = make_results("kernels", params=params, rows=all_rows, notes=notes, device="cuda" if gpu else "cpu",
                               summary=summarize([r for r in all_rows if "error" not in r and "skipped" not in r]))
        path = write_results(doc_out, out)  # rewritten after each example: a run cut short keeps what it did
    print(f"wrote {path}")
    print(json.dumps(doc_out["summary"], indent=1))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # a UserError is one line and exit 2, as the CLI does
        from gpuspeed.errors import UserError

        if isinstance(exc, UserError):
            print(f"gpuspeed: error: {exc}", file=sys.stderr)
            sys.exit(2)
        raise
