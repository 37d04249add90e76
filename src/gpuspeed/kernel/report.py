"""kernel_report(): tuning notes for a Triton or Numba CUDA kernel launcher, measured, not guessed.

Calls the launcher once to compile and autotune, once more under a Capture to record every launch (grid,
block / num_warps and num_stages, registers, spills, shared memory, the autotuner's choice), computes each
launch's theoretical occupancy from the device's limits, times the launcher with gpuspeed.bench, places it
on the roofline with roofline.place's locate() (memory-bound kernels against the measured copy bandwidth),
times device copies of the same bytes in as many launches beside a memory-bound kernel (the practical roof
at its launch size), and names a verdict and the next lever (see verdict.py). Without a GPU the kernels run under the
interpreters (TRITON_INTERPRET=1 / NUMBA_ENABLE_CUDASIM=1, set before the kernels are defined): the report
then says the launcher ran and returned, with its launches, and no timing or occupancy.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gpuspeed import device as _device
from gpuspeed import trees
from gpuspeed.errors import UserError
from gpuspeed.kernel import instructions, numba_info, triton_info, verdict
from gpuspeed.kernel.capture import Capture, interpreting_triton, simulating_numba
from gpuspeed.kernel.chunks import launch_bytes
from gpuspeed.kernel.occupancy import Limits, device_limits, occupancy

NO_GPU_NOTE = ("no GPU: ran under the interpreters (TRITON_INTERPRET=1 / NUMBA_ENABLE_CUDASIM=1){checked}; no timing, "
               "registers or occupancy are possible here")


def no_gpu_note(checked: dict | None) -> str:
    """What a run under the interpreters did: its check is named only where one ran (a variant on inputs(rng)'s)."""
    return NO_GPU_NOTE.format(checked=f" to check what it computes against {checked['against']}" if checked else "")


@dataclass
class KernelReport:
    name: str
    backend: str  # "triton", "numba", "mixed" or "none"
    gpu: bool
    note: str | None
    time_s: float | None
    time_rel_iqr: float | None
    launches: list[dict]
    placement: dict | None
    pct_of_roof: float | None
    occupancy_pct: float | None
    limiter: str | None
    verdict: str
    next_lever: str
    rule: str = ""
    main_kernel: str | None = None
    limits: dict | None = None
    ceilings_source: str | None = None
    # memory-bound kernels on a GPU: the % of the same roof that device copies of the same bytes, in as many
    # launches, reach when timed the same way (copy_reference): the practical roof at this launch size
    copy_pct_of_roof: float | None = None
    # with an expected output: gpuspeed.check's verdict on the launcher's output (passed, summary, rtol, atol,
    # against: what the expected output came from)
    check: dict | None = None
    output: Any = field(default=None, repr=False)  # what the launcher returned (not in to_dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        from gpuspeed.results import _jsonable as plain  # NaN and inf as null: strict JSON

        d = {k: v for k, v in self.__dict__.items() if k != "output"}
        # --json's counts as the human output gives them ("N in one call, M distinct"), not left to add up by hand
        d |= {"launch_count": self.launch_count(), "distinct_launches": len(self.launches)}
        return plain(json.loads(json.dumps(d, default=_jsonable)))

    def to_results(self, params: dict | None = None, device: str | None = None) -> dict:
        """The report as a results document (study "kernel_report", the project's schema): the headline figures
        in the summary, one row per launch, the whole report under "report"."""
        from gpuspeed.results import make_results

        d = self.to_dict()
        # launch_count: the launches one call makes; distinct_launches: the rows, identical launches merged (files
        # written before these two called the distinct count "launches", which read as the launches made)
        summary = {"time_s": self.time_s, "pct_of_roof": self.pct_of_roof, "occupancy_pct": self.occupancy_pct,
                   "limiter": self.limiter, "launch_count": self.launch_count(),
                   "distinct_launches": len(self.launches), "gpu": self.gpu,
                   "check_passed": self.check["passed"] if self.check else None,
                   "verdict": self.verdict, "next_lever": self.next_lever}
        doc = make_results("kernel_report", params=params or {}, summary=summary, rows=d["launches"],
                           notes=([self.note] if self.note else []) + self.notes, device=device)
        doc["report"] = d
        return doc

    def launch_count(self) -> int:
        """The launches one call of the launcher makes (each row's `count` added up)."""
        return sum(int(la.get("count", 1)) for la in self.launches)

    def lines(self) -> list[str]:
        """The report for people: one line per fact."""
        what = "no Triton or Numba CUDA launch seen" if self.backend == "none" else f"{self.backend} kernel launcher"
        out = [f"{self.name}: {what}" + ("" if self.gpu else " (interpreted, no GPU)")]
        if self.check:
            out.append(f"check against {self.check['against']}: {self.check['summary']}")
        if self.time_s is not None:
            out.append(f"time {self.time_s * 1e6:.1f} us (IQR/median {100 * (self.time_rel_iqr or 0):.1f} %)")
        if self.launches:
            total = self.launch_count()
            out.append(f"launches: {total} in one call" + (f", {len(self.launches)} distinct" if total != len(self.launches)
                                                            else ""))
        for la in self.launches:
            geo = f"grid {tuple(la['grid'])}"
            geo += (f" block {tuple(la['block'])}" if la.get("block")
                    else f" num_warps={la['num_warps']} num_stages={la['num_stages']}")
            res = ""
            if la.get("registers") is not None:
                res = (f"; {la['registers']} regs, spills {la['spills']} B, smem {la['shared_static']} static + "
                       f"{la['shared_dynamic']} dynamic B")
            occ = la.get("occupancy")
            if occ:
                res += f"; occupancy {occ['pct']:.0f} % ({occ['blocks_per_sm']} blocks/SM, {occ['limiter']}-limited)"
            times = f" x{la['count']}" if la.get("count", 1) > 1 else ""
            out.append(f"  {la['kernel']}{times} [{la['backend']}] {geo}{res}")
            mix = la.get("instruction_mix")
            if mix:
                out.append(f"    PTX, {mix['scope']} ({mix['instructions']} instructions): "
                           f"{instructions.summary(mix, top=6)}")
            at = la.get("autotune")
            if at and not self.gpu:  # the interpreter times nothing: its autotuner keeps the first config
                out.append(f"    autotune: nothing timed under the interpreter; the first of {len(at['tried'])} "
                           f"configs ran: {at['chosen']}")
            elif at:
                out.append(f"    autotune chose {at['chosen']}; tried {len(at['tried'])}:")
                for t in at["tried"][:8]:
                    ms = "-" if t["time_ms"] is None else f"{t['time_ms'] * 1e3:.1f} us"
                    out.append(f"      {ms:>10}  {t['config']}")
        p = self.placement
        if p and p.get("pct_of_roof") is not None:
            out.append(f"roofline: {p['GBps']:.0f} GB/s, {p['TFLOPs']:.3g} TFLOP/s at {p['intensity']:.3g} FLOP/B: "
                       f"{p['pct_of_roof']:.0f} % of the {p['roof']} roof ({p['bound']}-bound); "
                       f"{p['bytes'] / 1e6:.4g} MB a call ({p.get('bytes_source', 'given')})")
        if self.copy_pct_of_roof is not None:
            out.append(f"device copies of the same bytes, as many launches: {self.copy_pct_of_roof:.0f} % of that roof")
        out.append(f"verdict: {self.verdict}")
        out.append(f"next lever: {self.next_lever}")
        out += [f"note: {n}" for n in ([self.note] if self.note else []) + self.notes]
        return out


def _jsonable(o):
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def _sync(gpu: bool) -> None:
    if gpu:
        import torch

        torch.cuda.synchronize()


def _threads(launch) -> int:
    if launch.block:
        return launch.block[0] * launch.block[1] * launch.block[2]
    return (launch.num_warps or 4) * 32


def describe(launch, limits: Limits | None) -> dict:
    """A captured Launch as the report's dict, with its resources, occupancy and autotune record."""
    res = triton_info.resources(launch.compiled) if launch.backend == "triton" else numba_info.resources(launch.compiled)
    d = {"kernel": launch.kernel, "backend": launch.backend, "grid": list(launch.grid),
         "block": list(launch.block) if launch.block else None,
         "num_warps": launch.num_warps if launch.backend == "triton" else None,
         "num_stages": launch.num_stages if launch.backend == "triton" else None,
         "threads_per_block": _threads(launch), "registers": res["registers"], "spills": res["spills"],
         "shared_static": res["shared_static"],
         "shared_dynamic": res.get("shared_dynamic", launch.shared_dynamic) if launch.backend == "triton"
         else launch.shared_dynamic,
         "occupancy": None, "autotune": None, "meta": launch.meta, "interpreted": launch.interpreted,
         "arg_bytes": launch.arg_bytes,
         # what its innermost loops are made of (static PTX counts): where a kernel's own instructions go
         "instruction_mix": None if launch.interpreted else instructions.mix(instructions.ptx_of(launch.compiled,
                                                                                                 launch.backend))}
    if launch.backend == "triton":
        d["autotune"] = triton_info.autotune_info(launch.autotuner, launch.tuned)
        if d["autotune"] and launch.interpreted:
            for t in d["autotune"]["tried"]:
                t["time_ms"] = None  # the interpreter's stand-in benchmark timed nothing
    if limits is not None and d["registers"] is not None:
        smem = (d["shared_static"] or 0) + (d["shared_dynamic"] or 0)
        occ = occupancy(d["threads_per_block"], d["registers"], smem, limits)
        d["occupancy"] = {k: occ[k] for k in ("pct", "active_warps_per_sm", "max_warps_per_sm", "blocks_per_sm",
                                              "limiter", "blocks_by")}
        # the driver's answer beside the formula's, where it can be asked: they should agree
        d["occupancy"]["driver_blocks_per_sm"] = (
            triton_info.driver_blocks_per_sm(launch.compiled, d["threads_per_block"]) if launch.backend == "triton"
            else numba_info.driver_blocks_per_sm(launch.compiled, d["threads_per_block"], d["shared_dynamic"] or 0))
    return d


def group(launches: list) -> list[tuple]:
    """[(launch, count)]: identical launches (same kernel, compiled binary, geometry and options) merged, in the
    order each was first seen, so a launcher that runs one kernel a thousand times reports it once."""
    seen: dict = {}
    for la in launches:
        key = (la.kernel, la.backend, tuple(la.grid), tuple(la.block or ()), la.num_warps, la.num_stages,
               la.shared_dynamic, id(la.compiled) if la.compiled is not None else None, id(la.autotuner),
               repr(sorted(la.meta.items())))
        if key in seen:
            seen[key][1] += 1
        else:
            seen[key] = [la, 1]
    return [tuple(v) for v in seen.values()]


def _ceilings(ceilings, info=None, roots=None) -> tuple:
    """(Ceilings, where they came from, notes): given; a roofline results document or its path; this GPU's committed
    results/<gpu>/roofline.json when there is one (committed_ceilings); else measured now (quick). `info`: the device
    the kernel runs on (default this one). Ceilings given of another device (or of none recorded) are refused in one
    line: a kernel's % of another GPU's roof is no figure of this one."""
    from gpuspeed.results import measured_elsewhere

    info = info or _device.get_device("auto")
    if ceilings is None:
        ceil, source, notes = committed_ceilings(info, roots)
        if ceil is not None:
            return ceil, source, notes
        from gpuspeed.roofline.place import cached_ceilings

        return cached_ceilings(info.kind), "measured now (quick)", notes
    ceil, source = _read_ceilings(ceilings)
    theirs = measured_elsewhere({"kind": ceil.device_kind, "name": ceil.device_name}, info)
    if theirs is not None:
        what = "ceilings given" if source == "given" else f"the ceilings of {source}"
        raise UserError(f"{what} were measured on {theirs}, this kernel runs on {info.name}: pass this device's "
                        "roofline (gpuspeed roofline --out DIR), or leave ceilings= out")
    return ceil, source, []


def _read_ceilings(ceilings) -> tuple:
    """(Ceilings, where they came from) of ceilings= as given (a Ceilings, a roofline results document or its path),
    or a one-line UserError: what a launch need not run to find wrong."""
    from gpuspeed.results import read_results
    from gpuspeed.roofline.ceilings import Ceilings
    from gpuspeed.roofline.study import ceilings_from_results

    if isinstance(ceilings, Ceilings):
        return ceilings, "given"
    if isinstance(ceilings, dict):
        doc, source = ceilings, "given results document"
    elif isinstance(ceilings, (str, Path)):
        p = Path(ceilings)
        if p.is_dir():  # `gpuspeed roofline --out DIR` writes DIR/roofline.json: the folder exists, it is no file
            inside = p / "roofline.json"
            raise UserError(f"ceilings {p} is a folder, not a roofline.json: " + (
                f"pass {inside}" if inside.is_file() else "pass the roofline.json that `gpuspeed roofline --out DIR` "
                "wrote there"))
        if not p.is_file():
            raise UserError(f"ceilings file {p} does not exist")
        doc, source = read_results(p), str(p)
    else:
        raise UserError(f"ceilings= takes a Ceilings, a roofline results document or its path, got "
                        f"{type(ceilings).__name__}")
    try:
        return ceilings_from_results(doc), source
    except TypeError as exc:  # a ceiling row without its name or kind: Ceiling(**row) cannot be made
        raise UserError(f"{'the ceilings given' if source.startswith('given') else source}: a ceiling row lacks "
                        f"its name or kind ({exc})") from exc


def given_ceilings(ceilings, gpu: bool) -> tuple:
    """(Ceilings, source) of ceilings= (None, None when left out) and notes, checked before the launcher first runs,
    so a bad value costs no launch, compile or timing: on a GPU as _ceilings() takes them (this device's only);
    without one they are read to refuse what is not a roof, and said to be unused (nothing is placed)."""
    if ceilings is None:
        return None, None, []
    if gpu:
        ceil, source, notes = _ceilings(ceilings, _device.get_device("cuda"))
        return ceil, source, notes
    _, source = _read_ceilings(ceilings)
    what = "the ceilings given" if source.startswith("given") else f"the ceilings of {source}"
    return None, None, [f"{what} are not used: without a GPU nothing is timed or placed on a roof"]


def committed_ceilings(info, roots=None) -> tuple:
    """(Ceilings, path, notes) of the first results/<slug>/roofline.json under `roots` (default: the current folder,
    then gpuspeed's checkout) measured on `info`'s device; (None, None, notes) where there is none. A file there of
    another device (written there by hand, or a CPU's run with --out into a GPU's folder), of none recorded, of
    another study or cut short is not used: a note says why, and the next is looked at."""
    from gpuspeed.results import measured_elsewhere, read_results
    from gpuspeed.roofline.study import ceilings_from_results

    if roots is None:
        import gpuspeed

        roots = (Path.cwd(), Path(gpuspeed.__file__).resolve().parents[2])
    notes = []
    for root in dict.fromkeys(Path(r) for r in roots):  # the checkout may be the current folder
        p = Path(root) / "results" / info.slug / "roofline.json"
        if not p.is_file():
            continue
        try:
            doc = read_results(p)
            ceil = ceilings_from_results(doc)
        except UserError as exc:
            notes.append(f"{p} not used for the roof: {exc}")
            continue
        theirs = measured_elsewhere(doc, info)
        if theirs is not None:
            notes.append(f"{p} not used for the roof: measured on {theirs}, this kernel runs on {info.name}")
            continue
        return ceil, str(p), notes
    return None, None, notes


def copy_roof_view(ceil):
    """The same ceilings with the copy stream as the only device-memory roof (when copy was measured), so a
    memory-bound kernel that reads and writes is held to the copy bandwidth, not the read-only one."""
    from gpuspeed.roofline.ceilings import MEMORY, Ceilings

    if not ceil.value("copy"):
        return ceil
    return Ceilings(ceil.device_kind, ceil.device_name, [c for c in ceil.rows if c.name not in MEMORY or c.name == "copy"])


def placement(name: str, flops: float | None, nbytes: int, time_s: float, ceil, unit: str) -> dict:
    """roofline.place's locate() for this kernel, with the contract's names (intensity, roof, bound). Without
    a FLOP count the kernel is held to the memory roof alone (bound 'memory')."""
    from gpuspeed.roofline.place import locate

    d = locate(name, float(flops or 0.0), nbytes, time_s, ceil, unit)
    bw = ceil.mem_roof_GBps()
    if not flops and bw:
        d |= {"bound": "memory", "pct_of_mem_roof": 100 * d["GBps"] / bw, "pct_of_roof": 100 * d["GBps"] / bw,
              "above_roof": d["GBps"] > bw}
    d["intensity"] = d.pop("ai")
    d["roof"] = (("copy" if ceil.value("copy") else "memory") if d["bound"] == "memory"
                 else d["compute_ceiling"]) if d["bound"] else None
    d["roof_GBps"] = bw
    d["flops_source"] = "given" if flops else "none: memory roof only"
    return d


FLOOR = "inputs read once + outputs written once"


def in_place_bytes(fn, args: tuple, kwargs: dict, gpu: bool) -> tuple[int, str]:
    """(bytes of the arguments one call reads and writes in place, what to add to the count's name) for a launcher
    that returns no array: measured on copies (kernel.traffic), as an in-place kernel moves those arrays twice."""
    from gpuspeed.kernel.traffic import read_and_written_bytes

    try:
        both = read_and_written_bytes(fn, args, kwargs, lambda: _sync(gpu))
    except Exception as exc:  # copies that do not fit, or a launcher that fails on them: the floor stands, said
        return 0, (f"; it returns no array and its arguments could not be copied to see which it updates in place "
                   f"({type(exc).__name__}): one it reads and writes moves twice what is counted (pass --bytes)")
    if not both:
        return 0, ""
    return both, f", + the {both / 1e6:.4g} MB of arguments it updates in place written back"


def call_bytes(given: int | None, floor: int, launches: list) -> tuple[int, str]:
    """(bytes one call moves, how they were counted): `given`; else, for a launcher of several launches whose
    array arguments add up to more than its inputs and outputs (a multi-pass or iterative kernel: a stencil's
    steps, a reduction's second pass), each launch's arguments moved once (a chunked launcher's buffers, handed whole
    to each launch with an offset, once: kernel.chunks); else `floor`, the launcher's inputs read once and outputs
    written once."""
    if given is not None:
        return int(given), "given"
    per_launch, said = launch_bytes(launches)
    said = f"; {said}" if said else ""
    if len(launches) > 1 and per_launch > floor:
        return per_launch, f"each of its {len(launches)} launches moving its array arguments once{said}"
    return floor, FLOOR + said


def copy_reference(nbytes: int, launches: int, bench_kw: dict | None = None) -> float:
    """Seconds for `launches` device copies moving `nbytes` in all (each reads and writes nbytes / launches / 2
    bytes: a ping-pong between two buffers, several launches replayed from one CUDA graph), timed as kernel_report
    times a kernel (events, L2 flushed, launch latency hidden). What a copy of this launch size reaches is the
    practical roof at that size: a launch's fixed cost (its ramp and tail, ~3 us) weighs on a small one."""
    import torch

    from gpuspeed.graphs import capture
    from gpuspeed.timing import bench

    half = max(1, int(nbytes // max(1, launches) // 2))
    a = torch.randint(0, 256, (half,), dtype=torch.uint8, device="cuda")  # random bytes, not zeros
    b = torch.empty_like(a)

    def copies():
        src, dst = a, b
        for _ in range(launches):
            dst.copy_(src)
            src, dst = dst, src
        return src

    kw = {k: v for k, v in (bench_kw or {}).items() if k in ("budget_s", "max_noise", "min_samples", "max_samples")}
    fn = capture(copies) if launches > 1 else copies
    return bench(fn, mode="events", hide_launch_latency=True, name="same-bytes copy", **kw).median


def _raise_out_of_bounds(exc: BaseException) -> None:
    """A launcher's failure that came of an interpreted kernel's out-of-bounds load or store (capture.OutOfBounds), of
    a NumPy array among its arguments (capture.NotATensor) or of a simulated Numba launch of no blocks
    (capture.EmptyLaunch), wrapped by the interpreter in its InterpreterError and
    maybe by the launcher, as a UserError of one line."""
    from gpuspeed.kernel.capture import InterpretedLaunchError

    seen, e = set(), exc
    while e is not None and id(e) not in seen:
        if isinstance(e, InterpretedLaunchError):  # OutOfBounds, NotATensor, EmptyLaunch, SignatureMismatch
            raise UserError(str(e)) from exc
        seen.add(id(e))
        e = e.__cause__ or e.__context__


def _numba_to_host(out):
    """A launcher's output with Numba device arrays (cuda.device_array, the simulator's FakeCUDAArray) copied to the
    host, which check() reads; anything else as it is."""
    from gpuspeed.optimize.backends.common import tree_map

    return tree_map(lambda x: x.copy_to_host() if "numba" in type(x).__module__ and hasattr(x, "copy_to_host") else x,
                    out)


def _returned_instead(returned, expected, rtol, atol) -> str:
    """Why an in-place check failed when the launcher returned the answer instead of writing it into its arguments
    ('' otherwise): the arithmetic is right, the contract is not."""
    if returned is None:
        return ""
    from gpuspeed.verify import check

    one = expected[0] if isinstance(expected, (tuple, list)) and len(expected) == 1 else expected
    try:
        right = check(_numba_to_host(returned), one, rtol=rtol, atol=atol).passed
    except Exception:  # a returned value of another shape or kind: nothing to say about it
        return ""
    return ("; it returned the right answer and left its arguments as they were: the reference writes its result into "
            "its arguments, so the launcher must too" if right else "")


def _host(x):
    """An array leaf as a host NumPy array (torch, CuPy, Numba device arrays, NumPy), None where it cannot say."""
    import numpy as np

    from gpuspeed.verify import _to_host

    try:
        return np.asarray(x.copy_to_host()) if hasattr(x, "copy_to_host") else _to_host(x)[0]
    except Exception:  # an array kind with no host view: not compared
        return None


def _written(before, after) -> bool:
    """Whether a call changed any array among the arguments (`before`: copies taken ahead of it; NaN equal to NaN)."""
    import numpy as np

    for a, b in zip(trees.leaves(before), trees.leaves(after), strict=False):
        if not (hasattr(a, "shape") and hasattr(a, "dtype")) or a is b:
            continue
        ha, hb = _host(a), _host(b)
        if ha is None or hb is None:
            continue
        if ha.shape != hb.shape or not np.array_equal(ha, hb, equal_nan=ha.dtype.kind in "fc"):
            return True
    return False


def _grid_launch_name(fn) -> str | None:
    """'kern[grid]' for Triton's `kern[grid]` (a lambda over the kernel and its grid), else None."""
    from gpuspeed.kernel.target import is_triton_kernel, kernel_name

    if getattr(fn, "__name__", None) != "<lambda>":
        return None
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            obj = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if is_triton_kernel(obj):
            return f"{kernel_name(obj)}[grid]"
    return None


def compute_unit(unit: str | None, ptxs: list, args: Any, counted: bool) -> tuple[str, str | None]:
    """(the compute ceiling a kernel is held to, a note where its PTX chose it): `unit` as given; else the unit its
    tensor-core instructions (mma / wgmma) run at, from the PTX of its launches, the main one's first (a Triton
    tl.dot on fp16 data runs at the fp16 tensor-core rate, fp32 data at tf32's, which no FMA roof bounds); else
    default_unit's (the CUDA-core unit of its dtype, or the tensor-core one of the torch matmuls FlopCounterMode
    counted)."""
    from gpuspeed.roofline.place import default_unit

    if unit:
        return unit, None
    found = next((u for u in map(instructions.tensor_core_unit, ptxs) if u), None)
    if found:
        return found, (f"held to the {found} roof: its kernel's tensor-core instructions (mma) run on {found} data "
                       "(unit= to name another)")
    return default_unit(args, counted), None


def _main_first_ptx(captured: list, described: list[dict], main: dict | None) -> list:
    """The PTX of each distinct launch (as group() orders them, beside their report dicts), the main launch's first."""
    ptxs = [instructions.ptx_of(la.compiled, la.backend) for la, _ in group(captured)]
    first = [i for i, d in enumerate(described) if d is main]
    return [ptxs[i] for i in first] + [p for i, p in enumerate(ptxs) if i not in first]


def given_counts(name: str, flops, nbytes) -> tuple[float | None, int | None]:
    """(flops, bytes) as given (a 0-d array as the number it holds), or a one-line UserError for a count the roof
    cannot use, as place() refuses it: FLOPs finite and >= 0 (0: a copy's), bytes a whole number >= 1 (1.5 would be
    int()ed to another count). Without a GPU they are not used, but one a GPU run would refuse after all its timing
    is refused now."""
    from gpuspeed.roofline.place import _one_number, _real, _shown

    def real(v) -> bool:
        return isinstance(v, numbers.Real) and not isinstance(v, bool)

    flops = None if flops is None else _one_number(flops)
    nbytes = None if nbytes is None else _one_number(nbytes)
    if flops is not None and not (real(flops) and 0 <= _real(flops) < math.inf):  # NaN too
        raise UserError(f"{name}: flops must be finite and >= 0 (FLOPs per call), got {_shown(flops)}")
    if nbytes is not None and not (real(nbytes) and 1 <= _real(nbytes) < math.inf and float(nbytes).is_integer()):
        raise UserError(f"{name}: bytes must be a whole number of bytes >= 1 per call, got {_shown(nbytes)}")
    return flops, None if nbytes is None else int(nbytes)


def kernel_report(fn: Callable, *args, flops: float | None = None, bytes: int | None = None,  # noqa: A002
                  name: str | None = None, device: str = "auto", ceilings=None, bench_kw: dict | None = None,
                  kwargs: dict | None = None, unit: str | None = None, expected: Any = None,
                  rtol: float | None = None, atol: float | None = None,
                  against: str = "the expected output", in_place: list[int] | None = None) -> KernelReport:
    """Tuning notes for `fn(*args, **kwargs)`, a launcher of Triton and/or Numba CUDA kernels.

    flops / bytes: per call (default: torch's FlopCounterMode count, usually none for hand kernels, and the
    minimum traffic, every input read once and every output written once, or for several launches whose array
    arguments add up to more, each launch's arguments moved once: call_bytes). ceilings: a Ceilings, a roofline
    results document or its path (default: this GPU's results/<gpu>/roofline.json, else measured now), checked before
    the launcher first runs (a bad one, or another device's on a GPU, is a UserError; without a GPU it is unused).
    bench_kw go to gpuspeed.bench. unit: the compute ceiling (default from the dtypes, as place() does).
    expected: what the launcher should return (e.g. a workload's original() on the same inputs), checked with
    gpuspeed.check under rtol / atol (its dtype defaults when None); `against` names it in the report; it is what
    one call on the arguments as given returns (a launcher that writes into its arguments, `x *= 2; return x`, is
    checked on a call of its own on copies of them, not on the recorded call's twice-written ones). A failed
    check is the verdict, before any timing rule. in_place: for a launcher that writes its result into its
    arguments, their positions: `expected` is then what they hold after one call on fresh copies of the args.
    """
    from gpuspeed.device import resolve_device
    from gpuspeed.trees import callable_name

    from gpuspeed.kernel.target import refuse_kernel

    kwargs = kwargs or {}
    name = name or _grid_launch_name(fn) or callable_name(fn, "kernel")
    refuse_kernel(fn, name, getattr(fn, "__name__", None), "pass the function that launches it, or the kernel with "
                  "its launch configuration")
    gpu = resolve_device(device) == "cuda"
    flops, bytes = given_counts(name, flops, bytes)  # noqa: A001 - before any launch, as place() refuses them
    if unit is not None:  # an unknown one was refused only after the timing, in locate()
        from gpuspeed.roofline.place import unit_name

        unit = unit_name(unit)
    given_ceil, given_source, notes = given_ceilings(ceilings, gpu)  # before any launch
    if expected is not None:
        from gpuspeed.trees import clone_tree

        # the check's own copies: the calls below may write into (or step) args, so a launcher that writes into its
        # arguments is checked on a call of its own on these (expected is for the arguments as given)
        fresh, fresh_kw = clone_tree((args, kwargs))
    with Capture() as cap:
        cap.recording = False
        try:
            fn(*args, **kwargs)  # compile and autotune outside the record
        except Exception as exc:
            _raise_out_of_bounds(exc)
            text = f"{type(exc).__name__} {exc}".lower()
            if not gpu and ("driver" in text or "cuda" in text) and not (interpreting_triton() or simulating_numba()):
                raise UserError(f"{name} cannot run here: there is no GPU, and its kernels were not defined under "
                                "TRITON_INTERPRET=1 / NUMBA_ENABLE_CUDASIM=1 (set them before importing the kernels; "
                                f"`gpuspeed kernel` does) ({type(exc).__name__})") from exc
            raise
        _sync(gpu)
        cap.refresh()  # the warm-up may have imported the kernels (lazy launchers)
        cap.recording = True
        out = fn(*args, **kwargs)
        _sync(gpu)
    interpreted = sorted({la.kernel for la in cap.launches if la.interpreted})
    if gpu and interpreted:  # its time would be the interpreter's host work, reported as the GPU's
        raise UserError(f"{name}: {', '.join(interpreted)} ran interpreted on a GPU run (TRITON_INTERPRET=1 or "
                        "NUMBA_ENABLE_CUDASIM=1 was set when its kernels were defined): its time would not be the "
                        "GPU's; define them without those variables, or pass device='cpu' to run them interpreted")
    checked = None
    if expected is not None:
        from gpuspeed.verify import check

        returned = None
        if in_place:
            returned = fn(*fresh, **fresh_kw)
            _sync(gpu)
            out = tuple(fresh[i] for i in in_place)
            if len(out) == 1 and not isinstance(expected, (tuple, list)):
                out = out[0]  # one argument written, one array expected: compared as they are
        elif _written((fresh, fresh_kw), (args, kwargs)):  # the recorded call ran on arguments written once already
            out = fn(*fresh, **fresh_kw)
            _sync(gpu)

        res = check(_numba_to_host(out), expected, rtol=rtol, atol=atol)
        summary = res.summary + (_returned_instead(returned, expected, rtol, atol) if not res.passed else "")
        if not res.passed and out is None and expected is not None:
            summary += "; it returned None where the reference returns its result: return what it computes"
        checked = {"passed": bool(res.passed), "summary": summary, "rtol": rtol, "atol": atol, "against": against}
    limits = device_limits() if gpu else None
    launches = []
    for la, count in group(cap.launches):
        launches.append(describe(la, limits) | {"count": count})
    kinds = {la["backend"] for la in launches}
    backend = "none" if not kinds else kinds.pop() if len(kinds) == 1 else "mixed"
    main = verdict.main_launch(launches)
    time_s = rel_iqr = place = copy_pct = None
    source = None
    if gpu and launches:
        from gpuspeed.roofline.place import count_flops, min_bytes
        from gpuspeed.timing import bench

        # a launcher that returns no array writes into its arguments: those it also reads move twice; seen before the
        # timing's many calls have stepped them (an in-place x *= 2.5 reaches inf, where no write shows)
        in_place = in_place_bytes(fn, args, kwargs, gpu) if bytes is None and not trees.nbytes(out) else (0, "")
        kw = dict(bench_kw or {})
        # the kernels' GPU time, cold: events around each call after the flush (graph mode would time calls 2..K of
        # a replay with a warm L2, and Numba launches on its own stream, which torch's graphs cannot capture), the
        # stream held while the Python launcher issues its launches, so its latency is not the kernel's time
        kw.setdefault("mode", "events")
        kw.setdefault("hide_launch_latency", True)
        m = bench(fn, *args, kwargs=kwargs, name=name, **kw)
        time_s, rel_iqr = m.median, m.rel_iqr
        notes += list(m.notes)
        # counted even when given: FLOPs that FlopCounterMode sees are matmul-like (the tensor-core unit)
        try:
            n_counted, _ = count_flops(fn, *args, kwargs=kwargs)
        except Exception:  # not a torch launcher: no count
            n_counted = 0
        counted, given = n_counted > 0, flops is not None
        flops = flops if given else n_counted
        nbytes, moved = call_bytes(bytes, min_bytes((args, kwargs), out) or
                                   trees.nbytes((args, kwargs)) + trees.nbytes(out), cap.launches)
        if moved.startswith(FLOOR):
            nbytes, moved = nbytes + in_place[0], FLOOR + in_place[1] + moved[len(FLOOR):]
        if nbytes > 0:
            ceil, source, said = ((given_ceil, given_source, []) if given_ceil is not None
                                  else _ceilings(None, _device.get_device("cuda")))
            notes += said
            held_to, why = compute_unit(unit, _main_first_ptx(cap.launches, launches, main), (args, kwargs), counted)
            notes += [why] if why and flops else []
            place = placement(name, flops, nbytes, time_s, copy_roof_view(ceil), held_to)
            place["bytes_source"] = moved
            if counted and not given:
                place["flops_source"] = "counted by FlopCounterMode"
        else:
            notes.append("no array bytes found in the arguments or the output: pass bytes= to place it on the roofline")
        if place and place["bound"] == "memory" and place.get("roof_GBps") and time_s:
            calls = sum(la.get("count", 1) for la in launches)
            copy_pct = 100 * nbytes / copy_reference(nbytes, calls, bench_kw) / (place["roof_GBps"] * 1e9)
    occ = (main or {}).get("occupancy")
    if not gpu and (flops is not None or bytes is not None):  # said, not dropped without a word
        notes.append("no GPU: the flops/bytes given are used on a GPU run, to place the kernel on the roofline; "
                     "nothing is timed or placed here")
    facts = {"gpu": gpu, "launches": launches, "main": main, "sms": limits.sms if limits else None,
             "pct_of_roof": place["pct_of_roof"] if place else None, "bound": place["bound"] if place else None,
             "roof": place["roof"] if place else None, "time_s": time_s,
             "occupancy_pct": occ["pct"] if occ else None, "limiter": occ["limiter"] if occ else None,
             "copy_pct": copy_pct, "check": checked,
             "triton_version": _device.versions().get("triton") if any(la["backend"] == "triton" for la in launches)
             else None}
    rule, said, lever = verdict.judge(facts)
    return KernelReport(
        name=name, backend=backend, gpu=gpu, note=None if gpu else no_gpu_note(checked), time_s=time_s, time_rel_iqr=rel_iqr,
        launches=launches, placement=place, pct_of_roof=place["pct_of_roof"] if place else None,
        occupancy_pct=occ["pct"] if occ else None, limiter=occ["limiter"] if occ else None, verdict=said,
        next_lever=lever, rule=rule, main_kernel=main["kernel"] if main else None,
        limits=limits.to_dict() if limits else None, ceilings_source=source, copy_pct_of_roof=copy_pct, check=checked,
        output=out,
        notes=notes)
