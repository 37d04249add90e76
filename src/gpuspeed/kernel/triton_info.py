"""What a captured Triton launch ran with: registers, spills and shared memory from the compiled kernel,
and the autotuner's choice with the configs it tried and their times.

Triton puts all of its own shared memory in the launch's dynamic shared memory (`metadata.shared`); a
kernel's static shared memory comes only from inline PTX that declares a `.shared` array (the bundled
histogram's counts), and is read from the loaded function (the driver's CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
through CuPy; 0 where it cannot say). `n_spills` counts 4-byte words of local memory per thread
(Triton divides CUDA's local size in bytes by 4); the report gives bytes. Autotuner timings are the medians
(ms) of the autotuner's own timer -- triton's `do_bench`, or the `do_bench` it was given (the bundled kernels
pass gpuspeed.bench) -- kept on the Autotuner after it tuned (`configs_timings`, `best_config`); None where it
did not time them (one config, or the interpreter).
"""

from __future__ import annotations

import math


def resources(compiled) -> dict:
    """{"registers", "spills" (bytes per thread), "shared_static", "shared_dynamic"} of a CompiledKernel."""
    if compiled is None:
        return {"registers": None, "spills": None, "shared_static": None, "shared_dynamic": None}
    if getattr(compiled, "n_regs", None) is None and hasattr(compiled, "_init_handles"):
        compiled._init_handles()  # loads the binary: registers and spills are read then
    md = getattr(compiled, "metadata", None)
    regs = getattr(compiled, "n_regs", None)
    spills = getattr(compiled, "n_spills", None)
    return {"registers": None if regs is None else int(regs), "spills": None if spills is None else 4 * int(spills),
            "shared_static": static_shared(compiled), "shared_dynamic": int(getattr(md, "shared", 0) or 0)}


CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1  # the CUfunction_attribute of a function's static shared memory


def static_shared(compiled) -> int:
    """Bytes of static shared memory of a loaded Triton kernel (inline PTX's `.shared` arrays); 0 without CuPy
    or a loaded function (the interpreter), where Triton's own kernels have none."""
    func = getattr(compiled, "function", None)
    if not func:
        return 0
    try:
        from cupy.cuda import driver

        return int(driver.funcGetAttribute(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, int(func)))
    except Exception:  # no CuPy, or a driver that will not say
        return 0


def config_dict(config) -> dict:
    """A triton.Config as a JSON-safe dict: its kwargs (BLOCK sizes...) and its launch options."""
    if config is None:
        return {}
    d = {k: v for k, v in dict(getattr(config, "kwargs", {}) or {}).items() if isinstance(v, (bool, int, float, str))}
    for key in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
        v = getattr(config, key, None)
        if v is not None and not (key == "num_ctas" and v == 1):
            d[key] = v
    return d


def _ms(t) -> float | None:
    """A do_bench result (a float, or [median, p20, p80]) -> the median in ms; None when not a real time."""
    if isinstance(t, (list, tuple)):
        t = t[0] if t else None
    try:
        t = float(t)
    except (TypeError, ValueError):
        return None
    return t if math.isfinite(t) and t > 0 else None


def autotune_info(tuner, tuned: dict | None = None) -> dict | None:
    """{"chosen": config, "tried": [{"config", "time_ms"}]} for the autotuner a launch came through; `tuned` is what
    the Capture took when the launch ran (capture.Launch.tuned: its chosen config and its own key's timings), else
    the autotuner's last choice and timings are read."""
    if tuner is None:
        return None
    if tuned is not None:
        best, timings = tuned.get("chosen"), tuned.get("timings") or {}
    else:
        best, timings = getattr(tuner, "best_config", None), getattr(tuner, "configs_timings", None) or {}
    tried = [{"config": config_dict(c), "time_ms": _ms(t)} for c, t in timings.items()]
    if not tried:  # it did not benchmark (one config, or a cached choice): list what it could choose from
        tried = [{"config": config_dict(c), "time_ms": None} for c in getattr(tuner, "configs", [])]
    tried.sort(key=lambda r: (r["time_ms"] is None, r["time_ms"] or 0.0))
    return {"chosen": config_dict(best), "tried": tried}


def driver_blocks_per_sm(compiled, threads: int) -> int | None:
    """The CUDA driver's own occupancy answer (cuOccupancyMaxActiveBlocksPerMultiprocessor, through CuPy) for
    a compiled kernel: a cross-check of the formula; None without CuPy or a loaded kernel."""
    func = getattr(compiled, "function", None)
    if not func:
        return None
    try:
        from cupy.cuda import driver

        smem = int(getattr(getattr(compiled, "metadata", None), "shared", 0) or 0)
        return int(driver.occupancyMaxActiveBlocksPerMultiprocessor(int(func), int(threads), smem))
    except Exception:  # no CuPy, or a driver that will not say: the formula stands alone
        return None
