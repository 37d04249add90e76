"""Measured ceilings of this device: memory bandwidths (HBM, L2) and compute peaks, each against its datasheet.

GPU: Triton read / write / copy streams with 16-byte accesses over a working set far larger than L2 (torch's
own copy, sum and fill alongside), an L2 read over half the L2, FP32 and FP64 FMA chains (Triton, plus CUDA
through CuPy/NVRTC when installed), and TF32 / BF16 / FP16 / FP8 tensor-core peaks from large matmuls.
CPU: copy, sum and fill far larger than the last-level cache, and torch.mm GFLOP/s per dtype.
Each candidate is checked for correctness on a small input before it is timed; a ceiling is the best
candidate, and a candidate that fails records its error and the others go on. Tensor-core rates are
power-bound: each matmul candidate is the best of a few short runs (TENSOR_RUNS).
"""

from __future__ import annotations

import json
import math
import numbers
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from gpuspeed import device as _device
from gpuspeed.errors import UserError, require_flag
from gpuspeed.errors import one_line as _err
from gpuspeed.timing import bench
from gpuspeed.verify import check, poison

# A large matmul drives the GPU to its power cap, and a short run's median lands anywhere in a band
# (results/<gpu>/matmul_power.json; docs/notes/studies.md). A ceiling is what the GPU can reach, so each
# tensor-core candidate is the best of a few runs, each after a short idle; a placement is one run.
TENSOR_RUNS = 4
TENSOR_IDLE_S = 0.25

MEMORY = ("copy", "read", "write", "torch_copy", "torch_read", "torch_write")  # device-memory roofs
GB, TFLOP = 1e9, 1e12


@dataclass
class Ceiling:
    name: str  # copy, read, write, l2, torch_copy, ..., fp32, fp64, tf32, bf16, fp16, fp8
    kind: str  # "memory" (GB/s) or "compute" (TFLOP/s)
    value: float | None = None
    how: str = ""
    pct_of_datasheet: float | None = None
    median_s: float | None = None
    rel_noise: float | None = None
    n: int | None = None
    candidates: list = field(default_factory=list)  # every config tried: value or error
    error: str | None = None

    @property
    def unit(self) -> str:
        return "GB/s" if self.kind == "memory" else "TFLOP/s"


@dataclass
class Ceilings:
    device_kind: str  # "cuda" or "cpu"
    device_name: str
    rows: list[Ceiling] = field(default_factory=list)

    def get(self, name: str) -> Ceiling | None:
        return next((c for c in self.rows if c.name == name), None)

    def value(self, name: str) -> float | None:
        c = self.get(name)
        return c.value if c else None

    def mem_roof_GBps(self) -> float | None:
        """The device-memory roof: the best measured stream bandwidth (L2 excluded)."""
        vals = [c.value for c in self.rows if c.name in MEMORY and c.value]
        return max(vals) if vals else None

    def compute_TFLOPs(self, unit: str) -> tuple[str, float | None]:
        """(ceiling name, TFLOP/s) for a compute unit, falling back to fp32 where it was not measured."""
        for name in (unit, "fp32"):
            if self.value(name):
                return name, self.value(name)
        return unit, None

    def to_dict(self) -> dict:
        return {"device_kind": self.device_kind, "device_name": self.device_name,
                "rows": [asdict(c) for c in self.rows]}

    @classmethod
    def from_dict(cls, d: dict) -> "Ceilings":
        known = set(Ceiling.__dataclass_fields__)
        return cls(d["device_kind"], d["device_name"],
                   [Ceiling(**{k: v for k, v in r.items() if k in known}) for r in d["rows"]])


def check_ceiling_row(row: dict) -> None:
    """A one-line UserError for a ceiling row a roof cannot be made of (a file edited by hand): a value that is a string,
    a bool or not positive and finite read as a TypeError inside place(), as 1 TFLOP/s, or as a negative % of roof."""
    name = row.get("name")
    if not isinstance(name, str) or not name:
        raise UserError(f"a ceiling row of the roofline results document has no name: {_short_row(row)}")
    if row.get("kind") not in ("memory", "compute"):
        raise UserError(f"ceiling {name!r} of the roofline results document has kind {row.get('kind')!r}: "
                        "'memory' (GB/s) or 'compute' (TFLOP/s)")
    value = row.get("value")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not 0 < value < math.inf):
        raise UserError(f"ceiling {name!r} of the roofline results document has value {value!r}: a measured ceiling "
                        "is a positive number (null where it failed)")


def _short_row(row: dict) -> str:
    text = json.dumps(row, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def _pct(value, device_name, kind, name) -> float | None:
    if value is None or device_name is None:
        return None
    unit = "mem" if kind == "memory" and name in MEMORY else None if kind == "memory" else name
    return _device.pct_of_datasheet(value, device_name, unit) if unit else None


def best_of(name: str, kind: str, candidates: list[tuple[str, Callable[[], tuple[float, object]]]],
            device_name: str | None) -> Ceiling:
    """Run each candidate (label, fn -> (value, Measurement)); the ceiling is the best that succeeded."""
    ceil = Ceiling(name=name, kind=kind)
    best = None
    for label, run in candidates:
        try:
            value, m = run()
            ceil.candidates.append({"how": label, "value": value, "median_s": m.median, "rel_noise": m.rel_noise,
                                    "n": m.n, "throttled": m.throttled})
            if best is None or value > best[0]:
                best = (value, label, m)
        except Exception as exc:  # one failing config must not lose the others
            ceil.candidates.append({"how": label, "error": _err(exc)})
            if _device.cuda_available():
                import torch

                torch.cuda.synchronize()
    if best is None:
        ceil.error = "; ".join(c["error"] for c in ceil.candidates if "error" in c) or "no candidate"
        return ceil
    ceil.value, ceil.how, m = best
    ceil.median_s, ceil.rel_noise, ceil.n = m.median, m.rel_noise, m.n
    ceil.pct_of_datasheet = _pct(ceil.value, device_name, kind, name)
    return ceil


def best_run(run: Callable[[], object], runs: int = TENSOR_RUNS, idle_s: float = TENSOR_IDLE_S):
    """The fastest (lowest median) of `runs` Measurements from `run()`, each after `idle_s` of idle GPU."""
    best = None
    for _ in range(runs):
        time.sleep(idle_s)
        m = run()
        if best is None or m.median < best.median:
            best = m
    return best


def _must(result) -> None:
    if not result.passed:
        raise AssertionError(f"wrong result: {result.summary}")


def checked_rate(checked, work: float, unit: float, fn: Callable, *args, kwargs: dict | None = None, name: str,
                 options: dict, runs: int = 1, stat: str = "median") -> tuple[float, object]:
    """(work / time / unit, Measurement) of fn(*args), refused when `checked` (the CheckResult of the same
    code on a small input) failed: a wrong kernel is never timed. runs > 1: the best of best_run()'s runs
    (power-bound tensor-core rates). stat: the Measurement's "median", or "min" (CPU ceilings)."""
    _must(checked)

    def once():
        return bench(fn, *args, kwargs=kwargs, name=name, **options)

    m = once() if runs == 1 else best_run(once, runs)
    return work / getattr(m, stat) / unit, m


# ---------------------------------------------------------------------------------------------------
# GPU memory
# ---------------------------------------------------------------------------------------------------

STREAM_CONFIGS = [(4096, 4), (8192, 8), (16384, 8), (16384, 16)]  # (BLOCK, num_warps)
# (BLOCK, num_warps, L2 eviction hint of the loads) tried for read and copy: the hint decides the copy and
# not the read, so each is measured, not assumed (docs/notes/studies.md).
READ_CONFIGS = ([(b, w, e) for e in ("", "evict_first") for b, w in STREAM_CONFIGS]
                + [(2048, 4, ""), (1024, 4, "evict_last"), (16384, 8, "evict_last")])
COPY_CONFIGS = ([(b, w, e) for e in ("", "evict_last")
                 for b, w in [(1024, 4), (2048, 4), (2048, 8), (4096, 4), (8192, 8), (16384, 16)]]
                + [(16384, 8, "evict_first")])
ROUND = 16384 * 64  # sizes are multiples of every BLOCK and of the persistent grid's share


def _size(nbytes: int) -> str:
    """A buffer's size in a ceiling's label: '4.0 GiB', '128 MiB', or format_bytes' three figures below 10 MiB."""
    from gpuspeed.memory import format_bytes

    return (f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB" if nbytes >= 10 * 2**20
            else format_bytes(nbytes))


def _bench_kw(quick: bool) -> dict:
    return dict(budget_s=0.5 if quick else 1.0, warmup_s=0.2 if quick else 0.3)


def gpu_memory_steps(nbytes: int, quick: bool, device_name: str) -> list[tuple[str, Callable[[], Ceiling]]]:
    """(label, fn) steps measuring the device-memory and L2 ceilings; each fn returns one Ceiling."""
    import torch

    from gpuspeed.roofline import kernels

    state: dict = {}
    bench_options = _bench_kw(quick)
    n = max(nbytes // 4 // ROUND, 1) * ROUND  # fp32 elements per buffer

    def buffers():
        if not state:
            state["src"] = torch.rand(n, device="cuda") + 0.5  # never zeros
            state["dst"] = torch.empty_like(state["src"])
            small = torch.randn(ROUND, device="cuda")
            state["small"] = (small, torch.empty_like(small))
        return state["src"], state["dst"]

    def read_grid(block, warps, evict=""):
        def run():
            src, _ = buffers()
            x, _ = state["small"]
            part = poison(torch.empty(x.numel() // block, device="cuda"))
            ref = x.double().view(-1, block).sum(1)
            kw = dict(block=block, num_warps=warps, evict=evict)
            small_ok = check(kernels.launch_read(x, part, **kw), ref, rtol=1e-5)
            part = torch.empty(src.numel() // block, device="cuda")
            return checked_rate(small_ok, src.nbytes + part.nbytes, GB, kernels.launch_read, src, part, kwargs=kw,
                                name="read", options=bench_options)
        return run

    def read_persistent(block, warps):
        def run():
            src, _ = buffers()
            x, _ = state["small"]
            sms = torch.cuda.get_device_properties(0).multi_processor_count
            part = poison(torch.empty(16, device="cuda"))
            ref = x.double().view(-1, 16, block).sum((0, 2))  # program p owns tiles p, p+16, ...
            kw = dict(block=block, num_warps=warps)
            small_ok = check(kernels.launch_read_persistent(x, part, **kw), ref, rtol=1e-5)
            grid = sms * 4
            n_tiles = src.numel() // block
            use = (n_tiles // grid) * grid * block  # an equal share of tiles per program
            part = torch.empty(grid, device="cuda")
            return checked_rate(small_ok, use * 4, GB, kernels.launch_read_persistent, src[:use], part, kwargs=kw,
                                name="read_persistent", options=bench_options)
        return run

    def write(block, warps):
        def run():
            _, dst = buffers()
            _, y = state["small"]
            poison(y)
            kw = dict(block=block, num_warps=warps)
            small_ok = check(kernels.launch_write(y, 1.5, **kw), torch.full_like(y, 1.5), rtol=0, atol=0)
            return checked_rate(small_ok, dst.nbytes, GB, kernels.launch_write, dst, 1.5, kwargs=kw, name="write",
                                options=bench_options)
        return run

    def copy(block, warps, evict="", stream_store=False):
        def run():
            src, dst = buffers()
            x, y = state["small"]
            poison(y)
            kw = dict(block=block, num_warps=warps, evict=evict, stream_store=stream_store)
            small_ok = check(kernels.launch_copy(x, y, **kw), x, rtol=0, atol=0)
            return checked_rate(small_ok, 2 * src.nbytes, GB, kernels.launch_copy, src, dst, kwargs=kw, name="copy",
                                options=bench_options)
        return run

    def torch_op(kind):
        def run():
            src, dst = buffers()
            if kind == "copy":
                m = bench(dst.copy_, src, name="torch copy_", **bench_options)
                return 2 * src.nbytes / m.median / GB, m
            if kind == "read":
                m = bench(torch.sum, src, name="torch sum", **bench_options)
                return src.nbytes / m.median / GB, m
            m = bench(dst.fill_, 1.5, name="torch fill_", **bench_options)
            return dst.nbytes / m.median / GB, m
        return run

    def l2(block, warps):
        def run():
            x = torch.rand(max(_device.l2_bytes() // 2 // 4 // ROUND, 1) * ROUND, device="cuda") + 0.5
            part = torch.empty(x.numel() // block, device="cuda")
            m = bench(kernels.launch_read, x, part, kwargs=dict(block=block, num_warps=warps), name="l2 read",
                      flush=False, **bench_options)  # warm cache on purpose: repeated reads of half the L2
            return (x.nbytes + part.nbytes) / m.median / GB, m
        return run

    def cfg(b, w, e=""):
        return f"BLOCK={b}, {w} warps" + (f", {e}" if e else "")

    gib = _size(n * 4)  # what is measured: nbytes rounded to whole ROUNDs
    steps = [
        ("read (Triton)", lambda: best_of("read", "memory",
            [(f"Triton sum, {cfg(b, w, e)}, {gib}", read_grid(b, w, e)) for b, w, e in READ_CONFIGS]
            + [(f"Triton persistent sum, {cfg(8192, 8)}, 4 programs/SM", read_persistent(8192, 8))],
            device_name)),
        ("write (Triton)", lambda: best_of("write", "memory",
            [(f"Triton fill, {cfg(b, w)}, {gib}", write(b, w)) for b, w in STREAM_CONFIGS], device_name)),
        ("copy (Triton)", lambda: best_of("copy", "memory",
            [(f"Triton copy, {cfg(b, w, e)}, {gib} each way", copy(b, w, e)) for b, w, e in COPY_CONFIGS]
            + [(f"Triton copy, {cfg(b, w)}, streaming stores, {gib} each way", copy(b, w, "", True))
               for b, w in [(16384, 16), (32768, 16)]],
            device_name)),
        ("torch copy_", lambda: best_of("torch_copy", "memory", [(f"torch copy_, {gib}", torch_op("copy"))],
                                        device_name)),
        ("torch sum", lambda: best_of("torch_read", "memory", [(f"torch sum, {gib}", torch_op("read"))],
                                      device_name)),
        ("torch fill_", lambda: best_of("torch_write", "memory", [(f"torch fill_, {gib}", torch_op("write"))],
                                        device_name)),
        ("L2 read", lambda: best_of("l2", "memory",
            [(f"Triton sum over half the L2, {cfg(b, w)}, warm", l2(b, w)) for b, w in STREAM_CONFIGS[:3]],
            device_name)),
    ]
    steps.append(("free buffers", lambda: state.clear()))
    return steps


# ---------------------------------------------------------------------------------------------------
# GPU compute
# ---------------------------------------------------------------------------------------------------

FMA_CONFIGS = [(1024, 4), (2048, 4), (1024, 8)]  # (BLOCK, num_warps): 8, 16 and 4 chains per thread
FMA_A, FMA_B = 0.9999, 1e-4  # x -> a x + b stays near 1: no overflow, no denormals


def _fma_ref(x0: np.ndarray, n: int) -> np.ndarray:
    x = x0.astype(np.float64)
    for _ in range(n):
        x = x * np.float64(np.float32(FMA_A)) + np.float64(np.float32(FMA_B))
    return x


def gpu_compute_steps(quick: bool, device_name: str, cc: tuple[int, int]) -> list[tuple[str, Callable]]:
    import torch

    from gpuspeed.roofline import kernels

    bench_options = _bench_kw(quick)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n_chains = sms * 16 * 1024  # one full wave of 2048 threads per SM at 1024-element programs
    target_flops = (1.5e11 if quick else 3e11)  # ~5 ms of FP32 work at 65 TFLOP/s

    def triton_fma(block, warps, dtype):
        def run():
            small = poison(torch.empty(4 * block, device="cuda", dtype=dtype))
            kernels.launch_fma(small, FMA_A, FMA_B, 2, block=block, num_warps=warps)
            x0 = (np.arange(small.numel()).astype(np.float32 if dtype == torch.float32 else np.float64) * 1e-9)
            small_ok = check(small, _fma_ref(x0, 2 * kernels.FMA_UNROLL), rtol=1e-4)  # 128 chained roundings
            n_outer = max(int(target_flops / (2 * n_chains * kernels.FMA_UNROLL)), 1)
            if dtype == torch.float64:
                n_outer = max(n_outer // 2, 1)
            out = torch.empty(n_chains, device="cuda", dtype=dtype)
            return checked_rate(small_ok, 2 * n_chains * kernels.FMA_UNROLL * n_outer, TFLOP, kernels.launch_fma, out,
                                FMA_A, FMA_B, n_outer, kwargs=dict(block=block, num_warps=warps), name="fma",
                                options=bench_options)
        return run

    def cuda_fma():
        launch = kernels.cuda_fma_launcher()
        small = poison(torch.empty(1024, device="cuda"))
        launch(small, FMA_A, FMA_B, 2)
        torch.cuda.synchronize()
        base = np.arange(1024, dtype=np.float32) * np.float32(1e-9)
        ref = sum(_fma_ref(base + np.float32(j * 1e-3), 2 * kernels.CUDA_FMA_UNROLL)
                  for j in range(kernels.CUDA_FMA_CHAINS))
        small_ok = check(small, ref, rtol=1e-4)
        threads = n_chains  # one thread per former chain, 8 chains each
        per_thread = kernels.CUDA_FMA_CHAINS * kernels.CUDA_FMA_UNROLL
        n_outer = max(int(target_flops / (2 * threads * per_thread)), 1)
        out = torch.empty(threads, device="cuda")
        return checked_rate(small_ok, 2 * threads * per_thread * n_outer, TFLOP, launch, out, FMA_A, FMA_B, n_outer,
                            name="cuda fma", options=bench_options)

    def mm(dtype, m_, k_, n_, layout="nn", precision="highest", tol_dtype=None):
        def run():
            old = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision(precision)
            try:
                a = torch.randn(m_, k_, device="cuda", dtype=dtype)
                b = (torch.randn(n_, k_, device="cuda", dtype=dtype).t() if layout == "nt"
                     else torch.randn(k_, n_, device="cuda", dtype=dtype))
                out = torch.mm(a, b)
                ref = a[:64].double() @ b[:, :64].double()
                # TF32 rounds each input to 10 mantissa bits: a K=8192 dot product lands near 5e-4, so 2e-3
                rtol = 2e-3 if tol_dtype == "tf32" else None
                small_ok = check(out[:64, :64], ref, rtol=rtol, dtype=None if rtol else tol_dtype)
                return checked_rate(small_ok, 2 * m_ * n_ * k_, TFLOP, torch.mm, a, b, name="mm", options=bench_options,
                                    runs=TENSOR_RUNS)
            finally:
                torch.set_float32_matmul_precision(old)
        return run

    def fp8(n):
        def run():
            a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
            b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt needs
            one = torch.ones((), device="cuda")

            def f(x, y):
                return torch._scaled_mm(x, y, one, one, out_dtype=torch.bfloat16)
            out = f(a, b)
            small_ok = check(out[:64, :64], a[:64].float().double() @ b[:, :64].float().double(), dtype="bfloat16")
            return checked_rate(small_ok, 2 * n ** 3, TFLOP, f, a, b, name="scaled_mm fp8", options=bench_options,
                                runs=TENSOR_RUNS)
        return run

    def cfg(b, w):
        return f"BLOCK={b}, {w} warps, {b // (32 * w)} chains/thread"

    n = 8192
    fp32_cands = [(f"Triton FMA chains, {cfg(b, w)}", triton_fma(b, w, torch.float32)) for b, w in FMA_CONFIGS]
    import importlib.util

    if importlib.util.find_spec("cupy") is not None:
        fp32_cands.append((f"CUDA C++ (CuPy NVRTC) FMA, {kernels.CUDA_FMA_CHAINS} chains/thread, 256 threads",
                           cuda_fma))
    steps = [
        ("FP32 FMA peak", lambda: best_of("fp32", "compute", fp32_cands, device_name)),
        ("FP64 FMA peak", lambda: best_of("fp64", "compute",
            [(f"Triton FP64 FMA chains, {cfg(1024, 4)}", triton_fma(1024, 4, torch.float64))], device_name)),
        # n/2 as well: a long sustained 8192^3 run can lower the clocks below what a 4096^3 one sees
        ("TF32 matmul", lambda: best_of("tf32", "compute",
            [(f"torch.mm fp32 (TF32) {n}^3 A@B", mm(torch.float32, n, n, n, precision="high", tol_dtype="tf32")),
             (f"torch.mm fp32 (TF32) {n}^3 A@B^T", mm(torch.float32, n, n, n, "nt", "high", "tf32")),
             (f"torch.mm fp32 (TF32) {n // 2}^3 A@B", mm(torch.float32, n // 2, n // 2, n // 2, precision="high",
                                                         tol_dtype="tf32"))],
            device_name)),
        ("BF16 matmul", lambda: best_of("bf16", "compute",
            [(f"torch.mm bf16 {n}^3 A@B", mm(torch.bfloat16, n, n, n)),
             (f"torch.mm bf16 {n}^3 A@B^T", mm(torch.bfloat16, n, n, n, "nt")),
             (f"torch.mm bf16 {2 * n}x{2 * n}x{n} A@B", mm(torch.bfloat16, 2 * n, n, 2 * n)),
             (f"torch.mm bf16 {n // 2}^3 A@B", mm(torch.bfloat16, n // 2, n // 2, n // 2))], device_name)),
        ("FP16 matmul", lambda: best_of("fp16", "compute",
            [(f"torch.mm fp16 {n}^3 A@B", mm(torch.float16, n, n, n)),
             (f"torch.mm fp16 {n}^3 A@B^T", mm(torch.float16, n, n, n, "nt")),
             (f"torch.mm fp16 {n // 2}^3 A@B", mm(torch.float16, n // 2, n // 2, n // 2))], device_name)),
    ]
    if cc >= (8, 9) and hasattr(torch, "_scaled_mm"):
        steps.append(("FP8 matmul", lambda: best_of("fp8", "compute",
                                                    [(f"torch._scaled_mm e4m3 {n}^3", fp8(n))], device_name)))
    return steps


# ---------------------------------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------------------------------


ALLOCATIONS = 3  # fresh buffers per CPU bandwidth ceiling


def cpu_steps(quick: bool, nbytes: int | None = None) -> list[tuple[str, Callable]]:
    """Memory bandwidth far beyond the last-level cache, and torch.mm GFLOP/s per dtype.

    A shared CPU's speed wanders by tens of percent between one measurement and the next (neighbours,
    frequency), so a CPU ceiling is the fastest sample seen (`m.min`), not the median: the most the
    machine did, which a later placement of the same op should not beat. The bandwidth of one buffer
    also depends on how its pages happen to be mapped (docs/notes/studies.md), so each stream is measured
    on ALLOCATIONS fresh buffers and the best is kept.
    """
    import torch

    bench_options = dict(budget_s=0.3 if quick else 1.0, warmup_s=0.1 if quick else 0.3, device="cpu")
    # 128 MiB / 512 MiB of fp32 per buffer: >> a 32 MiB L3 (nbytes: the caller's size instead)
    n = max(nbytes // 4, 1) if nbytes else (2**25 if quick else 2**27)
    state: dict = {}

    def buffers(k: int):
        if state.get("k") != k:  # a fresh allocation for each of the ALLOCATIONS candidates
            state.clear()
            state["src"] = torch.rand(n) + 0.5
            state["dst"] = torch.empty_like(state["src"])
            state["k"] = k
        return state["src"], state["dst"]

    def copy(k):
        def run():
            src, dst = buffers(k)
            small_ok = check(dst.copy_(src)[:4096], src[:4096], rtol=0, atol=0)
            return checked_rate(small_ok, 2 * src.nbytes, GB, dst.copy_, src, name="copy_", options=bench_options,
                                stat="min")
        return run

    def read(k):
        def run():
            src, _ = buffers(k)
            m = bench(torch.sum, src, name="sum", **bench_options)
            return src.nbytes / m.min / GB, m
        return run

    def write(k):
        def run():
            _, dst = buffers(k)
            m = bench(dst.fill_, 1.5, name="fill_", **bench_options)
            return dst.nbytes / m.min / GB, m
        return run

    def allocs(label, run):
        return [(f"{label}, {mib}, allocation {k + 1}, fastest sample", run(k)) for k in range(ALLOCATIONS)]

    def mm(dtype, size):
        def run():
            a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
            small_ok = check(torch.mm(a, b)[:32, :32], a[:32].double() @ b[:, :32].double())
            return checked_rate(small_ok, 2 * size ** 3, TFLOP, torch.mm, a, b, name="mm", options=bench_options,
                                stat="min")
        return run

    mib = _size(n * 4)
    # the best of several sizes: cache fit varies by CPU (on an AMD EPYC with bf16 instructions a 128^3 bf16 mm ran
    # 2.1x the FLOP rate of 256^3 and 512^3, so a ceiling without it had placed points far above their roof)
    sizes = [128, 256, 512] if quick else [128, 512, 1024]

    def mms(dtype, tag):
        return [(f"torch.mm {tag} {s}^3, fastest sample", mm(dtype, s)) for s in sizes]
    return [
        ("copy", lambda: best_of("copy", "memory", allocs("torch copy_", copy), None)),
        ("read", lambda: best_of("read", "memory", allocs("torch sum", read), None)),
        ("write", lambda: best_of("write", "memory", allocs("torch fill_", write), None)),
        ("free buffers", lambda: state.clear()),
        ("fp32 matmul", lambda: best_of("fp32", "compute", mms(torch.float32, "fp32"), None)),
        ("fp64 matmul", lambda: best_of("fp64", "compute", mms(torch.float64, "fp64"), None)),
        ("bf16 matmul", lambda: best_of("bf16", "compute", mms(torch.bfloat16, "bf16"), None)),
    ]


def ceiling_steps(device: str = "auto", quick: bool = False, nbytes: int | None = None):
    """The measuring steps for this device: a list of (label, fn returning a Ceiling or None). nbytes: the size of
    each bandwidth buffer (default 4 GiB on a GPU, 1 GiB quick; 512 MiB on a CPU, 128 MiB quick)."""
    if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral) or nbytes < 4):
        raise UserError(f"nbytes must be a whole number of bytes >= 4 (one fp32 element), got {nbytes!r}")
    require_flag("quick", quick)  # quick="no" measured the quick ceilings, as True does
    info = _device.get_device(device)
    if info.kind == "cpu":
        return cpu_steps(quick, nbytes)
    import torch

    cc = torch.cuda.get_device_capability()
    nbytes = nbytes or (2**30 if quick else 4 * 2**30)
    return gpu_memory_steps(nbytes, quick, info.name) + gpu_compute_steps(quick, info.name, cc)


def ceilings(device: str = "auto", quick: bool = False, nbytes: int | None = None,
             progress: Callable[[str], None] | None = None) -> Ceilings:
    """Measure every ceiling of this device (see the module docstring); nbytes as in ceiling_steps."""
    info = _device.get_device(device)
    out = Ceilings(info.kind, info.name)
    for label, step in ceiling_steps(device, quick, nbytes):
        if progress:
            progress(label)
        try:
            c = step()
        except Exception as exc:  # a broken step is recorded, the rest still run
            c = Ceiling(name=label, kind="memory", error=_err(exc) + " | " + traceback.format_exc(limit=2)[-300:])
        if isinstance(c, Ceiling):
            out.rows.append(c)
    return out
