"""What a captured Numba CUDA launch ran with: registers, static shared memory and local memory per thread,
from the compiled kernel (`_Kernel.regs_per_thread`, `shared_mem_per_block`, `local_mem_per_thread`: what
the dispatcher's `get_regs_per_thread()` and friends return per signature). Local memory is where spilled
registers and local arrays live; the report gives it as `spills` in bytes per thread. Dynamic shared memory
is the launch's fourth configuration value (`kernel[grid, block, stream, nbytes]`).
"""

from __future__ import annotations


def resources(compiled) -> dict:
    """{"registers", "spills", "shared_static", "max_threads_per_block"} of a compiled Numba kernel."""
    if compiled is None:
        return {"registers": None, "spills": None, "shared_static": None, "max_threads_per_block": None}

    def get(attr):
        try:
            v = getattr(compiled, attr)
        except Exception:  # an attribute the driver could not read: unknown, not fatal
            return None
        return None if v is None else int(v)

    return {"registers": get("regs_per_thread"), "spills": get("local_mem_per_thread"),
            "shared_static": get("shared_mem_per_block"), "max_threads_per_block": get("max_threads_per_block")}


def driver_blocks_per_sm(compiled, threads: int, dynamic_smem: int) -> int | None:
    """The CUDA driver's own occupancy answer (cuOccupancyMaxActiveBlocksPerMultiprocessor, through Numba's
    context) for a compiled kernel: a cross-check of the formula; None where it cannot be asked."""
    try:
        from numba import cuda

        func = compiled._codelibrary.get_cufunc()
        return int(cuda.current_context().get_active_blocks_per_multiprocessor(func, int(threads), int(dynamic_smem)))
    except Exception:  # the simulator, or an API this numba-cuda lacks: the formula stands alone
        return None
