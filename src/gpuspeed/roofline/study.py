"""The roofline study: ceilings, the AI sweep and the built-in placements, as one results document.

`steps()` lists every measuring step (so a front end can show a progress bar with a known total);
`run()` executes them and returns the document (gpuspeed.results schema) with the summary keys of the
roofline issue. A step that fails records its error in its row; the others still run.
"""

from __future__ import annotations

import gc
from typing import Callable

from gpuspeed import device as _device
from gpuspeed.errors import UserError
from gpuspeed.errors import one_line as _err
from gpuspeed.results import make_results
from gpuspeed.roofline import sweep as ai_sweep
from gpuspeed.roofline.ceilings import TENSOR_RUNS, Ceiling, Ceilings, ceiling_steps, check_ceiling_row
from gpuspeed.roofline.place import _UNIT_ALIASES, ABOVE_ROOF, above_roof_note, count_flops, default_unit, locate, place
from gpuspeed.roofline.workloads import Workload, builtin, matmul_precision, sdpa_flops

DTYPES = ("fp32", "tf32", "bf16")
SECOND_PASS_GPU = ("TF32 matmul", "BF16 matmul", "FP16 matmul")  # power-bound ceilings, measured twice


def parse_dtypes(dtypes) -> list[str]:
    """The dtypes of the sweep and the placements: None for all of DTYPES, else a name, a comma-separated string
    or a list of them (repeats once); an empty choice or an unknown name is refused."""
    if dtypes is None:
        return list(DTYPES)
    items = [dtypes] if isinstance(dtypes, str) else list(dtypes)
    names = [d.strip() for item in items for d in str(item).split(",") if d.strip()]
    if not names:
        raise UserError(f"no dtype named in {','.join(map(str, items))!r}: use {', '.join(DTYPES)} "
                        "(all three when none is given)")
    bad = [d for d in names if _dtype_key(d) not in DTYPES]
    if bad:
        raise UserError(f"unknown dtype {bad[0]!r}: use {', '.join(DTYPES)}")
    return list(dict.fromkeys(_dtype_key(d) for d in names))


def _dtype_key(name: str) -> str:
    """A dtype as DTYPES name it, in any case, torch's names too: 'FP32', 'float32', 'torch.bfloat16'."""
    key = name.strip().lower().removeprefix("torch.")
    return _UNIT_ALIASES.get(key, key)


class Study:
    def __init__(self, device: str = "auto", quick: bool = False, dtypes: list[str] | None = None,
                 sweep: bool = True, workloads: bool = True):
        self.info = _device.get_device(device)
        self.kind = self.info.kind
        self.quick = quick
        self.dtypes = parse_dtypes(dtypes)
        self.do_sweep, self.do_workloads = sweep, workloads
        if dtypes is not None:  # dtypes the user chose must choose something (the ceilings measure every dtype)
            self._check_dtypes_used()
        self.ceil = Ceilings(self.kind, self.info.name)
        self.sweep_rows: list[dict] = []
        self.placements: list[dict] = []
        self.notes: list[str] = []
        if self.kind == "cpu":
            self.notes.append(f"{_device.why_cpu()}: CPU roofline (torch copy/sum/fill bandwidth, torch.mm GFLOP/s); "
                              "no AI sweep (Triton kernels need a GPU); no L2, FP32 FMA, TF32, FP16 or FP8 ceilings "
                              "(a GPU's)")

    def _check_dtypes_used(self) -> None:
        sweeps = self.do_sweep and self.kind == "cuda" and any(d in ("fp32", "bf16") for d in self.dtypes)
        if sweeps or (self.do_workloads and builtin(self.kind, self.quick, self.dtypes)):
            return
        where = "GPU" if self.kind == "cuda" else "CPU"
        why = ["the placements are off (--no-place)" if not self.do_workloads
               else f"no built-in workload runs in {', '.join(self.dtypes)} on the {where} (tf32 is a GPU's)"]
        why.append("the CPU has no AI sweep" if self.kind != "cuda" else "the AI sweep is off (--no-sweep)"
                   if not self.do_sweep else "the AI sweep runs fp32 and bf16 only")
        one = len(self.dtypes) == 1
        raise UserError(f"dtype{'' if one else 's'} {','.join(self.dtypes)} choose{'s' if one else ''} nothing to "
                        f"run: {'; '.join(why)}")

    # -- the plan -----------------------------------------------------------------------------------

    def steps(self) -> list[tuple[str, Callable[[], None]]]:
        out = [(label, self._ceiling_step(label, fn)) for label, fn in ceiling_steps(self.kind, self.quick)]
        if self.do_sweep and self.kind == "cuda":
            sweep_dtypes = [d for d in ("fp32", "bf16") if d in self.dtypes]
            if not sweep_dtypes:
                self.notes.append(f"no AI sweep: it runs fp32 and bf16 only, and the dtypes are {', '.join(self.dtypes)}")
            n = 2**26 if self.quick else 2**28
            out += [(label, self._sweep_step(fn)) for label, fn in ai_sweep.sweep_steps(sweep_dtypes, n, self.quick)]
        if self.do_workloads:
            chosen = builtin(self.kind, self.quick, self.dtypes)
            if not chosen:
                self.notes.append(f"no built-in workload in {', '.join(self.dtypes)} runs on this "
                                  f"{'GPU' if self.kind == 'cuda' else 'CPU'}: nothing placed (tf32 is a GPU's)")
            out += [(f"place {w.name}", self._place_step(w)) for w in chosen]
            # Ceilings are the best of a pass before and after the placements: a shared CPU drifts, and a
            # GPU's tensor-core rate follows its power and heat, which the placements change in between
            again = [(label, fn) for label, fn in ceiling_steps(self.kind, self.quick)
                     if self.kind == "cpu" or label in SECOND_PASS_GPU]
            if again:
                out += [(f"{label} (second pass)", self._ceiling_step(label, fn, merge=True)) for label, fn in again]
                out.append(("re-place on the final ceilings", self._relocate))
        return out

    def _relocate(self):
        """Recompute every placement's roof numbers against the final ceilings (times unchanged)."""
        for p in self.placements:
            if "time_s" in p:
                p |= locate(p["name"], p["flops"], p["bytes"], p["time_s"], self.ceil, p["unit"])
                p["notes"] = [n for n in p.get("notes", []) if n not in ABOVE_ROOF.values()]
                if p["above_roof"]:
                    p["notes"].append(above_roof_note(p["bound"], self.kind, p["pct_of_roof"]))

    def _ceiling_step(self, label, fn, merge: bool = False):
        def run():
            try:
                c = fn()
            except Exception as exc:
                c = Ceiling(name=label, kind="memory", error=_err(exc))
            if not isinstance(c, Ceiling):
                return
            old = self.ceil.get(c.name) if merge else None
            if old is None:
                self.ceil.rows.append(c)
                return
            old.candidates += [cand | {"pass": 2} for cand in c.candidates]
            if c.value and (old.value is None or c.value > old.value):
                keep = old.candidates
                old.__dict__.update(c.__dict__)
                old.candidates = keep
                old.how = f"{c.how} (second pass)"
        return run

    def _sweep_step(self, fn):
        def run():
            row = fn()
            if isinstance(row, dict):
                self.sweep_rows.append(row)
        return run

    def _place_step(self, w: Workload):
        def run():
            notes = list(w.notes)
            row = {"name": w.name, "group": w.group, "dtype": w.dtype, "notes": notes}
            try:
                with matmul_precision(w.precision):
                    if w.verify is not None:  # a wrong kernel is never placed
                        w.verify()
                        notes.append("checked against float64 on 3 fresh random inputs")
                    fn, args = w.make()
                    if w.flops is not None:
                        flops, source = w.flops(args), "given (convention in workloads.py)"
                    else:
                        flops, _ = count_flops(fn, *args)
                        source = "counted by FlopCounterMode"
                        if flops == 0 and w.group == "attention":
                            flops, source = sdpa_flops(args), "4BHS^2D (FlopCounterMode counted none here)"
                    unit = w.unit or default_unit(args, counted=w.group in ("matmul", "attention"))
                    bench_options = dict(budget_s=0.4 if self.quick else 0.8, warmup_s=0.15 if self.quick else 0.25)
                    p = place(fn, *args, flops=flops, bytes=w.nbytes(args) if w.nbytes else None,
                              ceilings=self.ceil, name=w.name, unit=unit, **bench_options)
                row |= p.to_dict() | {"flops_source": source}
                row["notes"] = notes + p.notes
            except Exception as exc:  # keep the other placements
                row["error"] = _err(exc)
            finally:
                fn = args = None
                gc.collect()
            self.placements.append(row)
        return run

    # -- the document -------------------------------------------------------------------------------

    def run(self, progress: Callable[[str], None] | None = None) -> dict:
        for label, fn in self.steps():
            if progress:
                progress(label)
            fn()
        return self.document()

    def summary(self) -> dict:
        c = self.ceil
        copy, mem = c.value("copy"), c.mem_roof_GBps()
        s: dict = {
            "copy_GBps": copy, "read_GBps": c.value("read"), "write_GBps": c.value("write"),
            "l2_GBps": c.value("l2"), "torch_copy_GBps": c.value("torch_copy"), "mem_roof_GBps": mem,
            "fp32_fma_TFLOPs": c.value("fp32") if self.kind == "cuda" else None,
            "fp32_TFLOPs": c.value("fp32"), "fp64_TFLOPs": c.value("fp64"), "tf32_mm_TFLOPs": c.value("tf32"),
            "bf16_mm_TFLOPs": c.value("bf16"), "fp16_mm_TFLOPs": c.value("fp16"), "fp8_mm_TFLOPs": c.value("fp8"),
        }
        torch_mm = [p for p in self.placements if p.get("group") == "matmul" and p.get("dtype") == "bf16"
                    and "TFLOPs" in p]
        big = max(torch_mm, key=lambda p: p["flops"], default=None)
        s["bf16_mm_torch_TFLOPs"] = big["TFLOPs"] if big else None
        s["bf16_mm_torch_N"] = round((big["flops"] / 2) ** (1 / 3)) if big else None
        if s["bf16_mm_TFLOPs"] and s["bf16_mm_torch_TFLOPs"]:
            s["bf16_mm_over_torch"] = s["bf16_mm_TFLOPs"] / s["bf16_mm_torch_TFLOPs"]
        for unit in ("bf16", "fp32"):
            peak = c.value(unit)
            s[f"ridge_{unit}_flop_per_byte"] = peak * 1e12 / (mem * 1e9) if peak and mem else None
        for dt, r in ai_sweep.ridges(self.sweep_rows).items():
            s[f"sweep_ridge_{dt}_flop_per_byte"] = r["ridge"]
            s[f"sweep_peak_{dt}_TFLOPs"] = r["peak_flops"] / 1e12 if r["peak_flops"] else None
            s[f"sweep_GBps_{dt}"] = r["bandwidth"] / 1e9 if r["bandwidth"] else None
        for group, key in (("elementwise", "elementwise"), ("torch elementwise", "elementwise_torch")):
            elem = [p for p in self.placements if p.get("group") == group and "GBps" in p]
            worst = min(elem, key=lambda p: p["GBps"], default=None)
            s[f"{key}_pct_of_copy_roof"] = 100 * worst["GBps"] / copy if worst and copy else None
            s[f"{key}_worst"] = worst["name"] if worst else None  # the point that sets the figure above
        placed = [p for p in self.placements if p.get("pct_of_roof") is not None]
        s["max_pct_of_roof"] = max((p["pct_of_roof"] for p in placed), default=None)
        s["n_above_roof"] = sum(1 for p in placed if p["pct_of_roof"] > 100)  # labelled, not believed
        s["n_errors"] = (sum(1 for r in c.rows if r.error) + sum(1 for r in self.sweep_rows if "error" in r)
                         + sum(1 for p in self.placements if "error" in p))
        return s

    def document(self, partial: str | None = None) -> dict:
        """The results document; `partial` (how the run was stopped, in words) marks one of a run cut short: params
        partial true, a note first, the summary figures of the steps not run null."""
        rows = ([{"section": "ceiling", **r} for r in self.ceil.to_dict()["rows"]]
                + [{"section": "sweep", **r} for r in self.sweep_rows]
                + [{"section": "placement", **p} for p in self.placements])
        params = {"device": self.kind, "quick": self.quick, "dtypes": self.dtypes, "sweep": self.do_sweep,
                  "workloads": self.do_workloads, "device_name": self.info.name}
        if partial:
            params["partial"] = True
        notes = ([f"partial: {partial}; the steps not run have no rows and their summary figures are null: rerun "
                  "gpuspeed roofline for the whole roof"] if partial else []) + list(self.notes) + [
            "ceilings: best candidate of each row; " + (
                "gpuspeed's kernels and the matmuls were checked for correctness before timing (torch's copy_, sum "
                "and fill_ and the L2 read are timed as they are)" if self.kind == "cuda" else
                "the copy and the matmuls were checked for correctness before timing (torch's sum and fill_ are timed "
                "as they are)"),
            "memory roof of placements = best measured device-memory stream (copy, read, write, torch); "
            "ridge_<unit> = that unit's ceiling over it",
            f"bf16 ceiling = best torch.mm ({'cuBLAS' if self.kind == 'cuda' else 'CPU'}) "
            f"{'shape/layout' if self.kind == 'cuda' else 'size'}; bf16_mm_torch_TFLOPs = the largest bf16 torch.mm "
            "placement, timed separately",
        ]
        if self.kind == "cuda":
            notes.append("tensor-core ceilings are power-bound: each matmul candidate is the best of "
                         f"{TENSOR_RUNS} short runs after an idle; a placement is one run, flagged throttled "
                         "when its SM clock (polled while it ran) fell under 90 % of max")
            notes.append("AI sweep: fp32 FMA chains on the CUDA cores (bf16 = bf16 storage, fp32 math); "
                         "its ridge is the CUDA-core ridge, ridge_bf16 the tensor-core one")
        return make_results("roofline", params=params, summary=self.summary(), rows=rows, notes=notes,
                            device=self.kind)


def write_artifacts(doc: dict, out, stem: str = "roofline") -> list:
    """roofline.json (through gpuspeed.results), roofline.md and roofline.png/.svg under `out` (`stem` names them);
    returns their paths. The plots go first, so that a plot failure is among the notes the JSON and the Markdown
    hold (the numbers are written all the same)."""
    from pathlib import Path

    from gpuspeed.results import write_results, write_text_atomic
    from gpuspeed.roofline.plot import plot
    from gpuspeed.roofline.report import markdown

    try:
        pics = plot(doc, out, stem)
    except Exception as exc:  # a plot failure must not lose the numbers: they are written, with a note
        pics = []
        doc["notes"].append(f"plot failed: {_err(exc)}")
    path = write_results(doc, Path(out) / f"{stem}.json")
    md = write_text_atomic(Path(out) / f"{stem}.md", markdown(doc))  # never half-written, no temp left
    return [path, md, *pics]


def run_steps(study: Study, steps, out=None, step=None) -> dict:
    """Run `steps` (study.steps()) in order and return the document; `step(label, done)` is called before each (a
    progress bar; done: the steps finished). Stopped part-way (Ctrl-C, SIGTERM: gpuspeed.results.stop_signals), the
    steps done are kept: with `out`, a document marked partial is written there (json, md, plots), the line says so."""
    from gpuspeed.results import partial_kept_words, partial_stem, stop_signals

    done: list[str] = []
    now: list[str] = []

    def keep():
        if not out or not done:
            return None
        stopped = (f"stopped after {len(done)} of {len(steps)} steps"
                   + (f", during {now[-1]!r}" if now and now[-1] not in done else ""))
        stem = partial_stem(out, "roofline")  # a complete roofline.json there is kept
        paths = write_artifacts(study.document(partial=stopped), out, stem)
        return f"{stopped}; what they measured is {partial_kept_words(paths, stem, 'roofline')}"

    with stop_signals(keep):
        for label, fn in steps:
            now.append(label)
            if step:
                step(label, len(done))
            fn()
            done.append(label)
    return study.document()


def ceilings_from_results(doc: dict) -> Ceilings:
    """The Ceilings of a roofline results document (for notebooks and plots), named for the device it was measured
    on. A document that is not a whole roofline one (another study's, a truncated one, one of no ceilings) is
    refused in one line: its placements would have had no roof, or another's, without a word."""
    from gpuspeed.results import validate

    validate(doc)
    if doc["study"] != "roofline":
        raise UserError(f"a {doc['study']} results document, not a roofline one: it holds no ceilings "
                        "(gpuspeed roofline --out DIR writes one)")
    if isinstance(doc["params"], dict) and doc["params"].get("partial"):
        raise UserError("a partial roofline results document (its run was stopped before the end: some ceilings "
                        "are missing): rerun gpuspeed roofline --out DIR for the whole roof")
    known = set(Ceiling.__dataclass_fields__)
    rows = [r for r in doc["rows"] if isinstance(r, dict) and r.get("section") == "ceiling"]
    if not rows:
        raise UserError("the roofline results document has no ceiling rows: no roof to place anything on")
    for r in rows:
        check_ceiling_row(r)
    if not any(r.get("value") for r in rows):  # every one failed: each placement would get no roof, without a word
        raise UserError("the roofline results document has no measured ceiling (every ceiling row's value is null): "
                        "no roof to place anything on")
    rows = [Ceiling(**{k: v for k, v in r.items() if k in known}) for r in rows]
    stamp = doc["device"] if isinstance(doc["device"], dict) else {}
    params = doc["params"] if isinstance(doc["params"], dict) else {}
    kind = params.get("device") or stamp.get("kind")
    if kind not in ("cuda", "cpu"):
        raise UserError(f"the roofline results document was measured on an unrecorded device (its kind, cuda or "
                        f"cpu, is {kind!r}): whose roof it is cannot be told")
    return Ceilings(kind, params.get("device_name") or stamp.get("name") or "", rows)
