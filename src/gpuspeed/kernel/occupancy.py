"""Theoretical occupancy: the CUDA occupancy calculator's formula, from a kernel's resources and the device's limits.

A block of T threads with R registers per thread and S bytes of shared memory (static + dynamic) fits
min(by warps, by blocks, by registers, by shared memory) times on one SM:
- warps: max_warps_per_sm // ceil(T / 32)
- blocks: max_blocks_per_sm
- registers (allocated per warp, in units of 256, in each of the 4 SM sub-partitions):
  per warp = round_up(R * 32, 256); warps per sub-partition = (regs_per_sm / 4) // per warp;
  blocks = (warps per sub-partition * 4) // warps per block; 0 when the block's registers pass the
  per-block limit (the hardware assumes the warps round up to a multiple of the 4 sub-partitions)
- shared memory: per block = round_up(S + reserved (1 KB on sm_80+), 128); blocks = smem_per_sm // per block;
  0 when S passes the per-block opt-in limit
Occupancy = active warps / max warps per SM. The limiter is the resource giving the fewest blocks (ties go
to warps, then blocks, then registers, then shared memory: the hardware caps first, since lowering a
kernel's own use does not help there). Device limits come from the device (torch / cupy attributes) where
it is here, else from the table of known compute capabilities below.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

WARP = 32
LIMITERS = ("warps", "blocks", "registers", "shared_memory")  # tie order: see the module docstring


@dataclass(frozen=True)
class Limits:
    """The per-SM and per-block limits the occupancy formula needs."""

    cc: str  # "9.0"
    max_warps_per_sm: int
    max_blocks_per_sm: int
    regs_per_sm: int = 65536
    regs_per_block: int = 65536
    max_regs_per_thread: int = 255
    reg_alloc_unit: int = 256  # registers are allocated per warp in units of this
    sub_partitions: int = 4  # SM sub-partitions (warp schedulers), each with its share of the registers
    smem_per_sm: int = 0  # bytes of shared memory an SM can give its blocks (max carveout)
    smem_per_block: int = 0  # the per-block opt-in maximum
    smem_reserved_per_block: int = 1024  # kept by the system for each block (sm_80+)
    smem_alloc_unit: int = 128
    max_threads_per_block: int = 1024
    sms: int | None = None
    source: str = "table"

    def to_dict(self) -> dict:
        return asdict(self)


# Known compute capabilities (CUDA programming guide, "Technical specifications per compute capability").
# Volta and Turing reserve no shared memory per block and allocate it in units of 256 B (cuda_occupancy.h).
KNOWN = {
    "7.0": Limits("7.0", max_warps_per_sm=64, max_blocks_per_sm=32, smem_per_sm=98304, smem_per_block=98304,
                  smem_reserved_per_block=0, smem_alloc_unit=256),
    "7.5": Limits("7.5", max_warps_per_sm=32, max_blocks_per_sm=16, smem_per_sm=65536, smem_per_block=65536,
                  smem_reserved_per_block=0, smem_alloc_unit=256),
    "8.0": Limits("8.0", max_warps_per_sm=64, max_blocks_per_sm=32, smem_per_sm=167936, smem_per_block=166912, sms=108),
    "8.6": Limits("8.6", max_warps_per_sm=48, max_blocks_per_sm=16, smem_per_sm=102400, smem_per_block=101376),
    "8.7": Limits("8.7", max_warps_per_sm=48, max_blocks_per_sm=16, smem_per_sm=167936, smem_per_block=166912),
    "8.9": Limits("8.9", max_warps_per_sm=48, max_blocks_per_sm=24, smem_per_sm=102400, smem_per_block=101376),
    "9.0": Limits("9.0", max_warps_per_sm=64, max_blocks_per_sm=32, smem_per_sm=233472, smem_per_block=232448, sms=132),
    "10.0": Limits("10.0", max_warps_per_sm=64, max_blocks_per_sm=32, smem_per_sm=233472, smem_per_block=232448),
    "10.3": Limits("10.3", max_warps_per_sm=64, max_blocks_per_sm=32, smem_per_sm=233472, smem_per_block=232448),
    "12.0": Limits("12.0", max_warps_per_sm=48, max_blocks_per_sm=32, smem_per_sm=102400, smem_per_block=101376),
    "12.1": Limits("12.1", max_warps_per_sm=48, max_blocks_per_sm=32, smem_per_sm=102400, smem_per_block=101376),
}


def known_limits(cc) -> Limits | None:
    """The table's limits for a compute capability, or None when unknown: '9.0', (9, 0), '(9, 0)', and the arch
    names nvcc and Triton use: 'sm_90', 'sm_90a', 'compute_90a', 'sm_100f' (an arch-specific 'a' or family 'f'
    target has its base capability's limits), in any case and with spaces around."""
    import re

    if isinstance(cc, (tuple, list)):
        if len(cc) != 2:
            return None
        cc = f"{cc[0]}.{cc[1]}"
    s = str(cc).strip().lower()
    m = (re.fullmatch(r"\(?\s*(\d+)\s*,\s*(\d+)\s*\)?", s) or re.fullmatch(r"(\d+)\.(\d)[af]?", s)
         or re.fullmatch(r"(?:sm_?|compute_?)?(\d+)(\d)[af]?", s))
    return KNOWN.get(f"{int(m.group(1))}.{m.group(2)}") if m else None


def device_limits(index: int | None = None) -> Limits | None:
    """This machine's GPU limits: the table for its compute capability, overlaid with what torch (and cupy,
    for blocks per SM and the reserved shared memory) report; None without a CUDA device."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        idx = torch.cuda.current_device() if index is None else index
        p = torch.cuda.get_device_properties(idx)
    except Exception:  # no torch CUDA here: no device limits either
        return None
    cc = f"{p.major}.{p.minor}"
    base = known_limits(cc)
    fields = asdict(base) if base else {"cc": cc, "max_warps_per_sm": 64, "max_blocks_per_sm": 32,
                                        "smem_per_sm": 0, "smem_per_block": 0}
    got = []

    def take(key, value, scale=1):
        if value:
            fields[key] = int(value) // scale
            got.append(key)

    take("max_warps_per_sm", getattr(p, "max_threads_per_multi_processor", 0), WARP)
    take("regs_per_sm", getattr(p, "regs_per_multiprocessor", 0))
    take("smem_per_sm", getattr(p, "shared_memory_per_multiprocessor", 0))
    take("smem_per_block", getattr(p, "shared_memory_per_block_optin", 0))
    take("sms", getattr(p, "multi_processor_count", 0))
    try:  # cupy knows the attributes torch does not show
        import cupy

        attrs = cupy.cuda.Device(idx).attributes
        take("max_blocks_per_sm", attrs.get("MaxBlocksPerMultiprocessor"))
        take("regs_per_block", attrs.get("MaxRegistersPerBlock"))
        if attrs.get("ReservedSharedMemoryPerBlock") is not None:
            fields["smem_reserved_per_block"] = int(attrs["ReservedSharedMemoryPerBlock"])
            got.append("smem_reserved_per_block")
    except Exception:  # no cupy: the table's values stand
        pass
    fields["source"] = ("device" if got else "table") + ("" if base else f" (sm_{cc.replace('.', '')} not in the "
                                                         "table: unknown limits assumed as sm_90)")
    return Limits(**fields)


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def occupancy(threads_per_block: int, regs_per_thread: int | None, smem_per_block: int, limits: Limits) -> dict:
    """Theoretical occupancy of one kernel launch configuration (see the module docstring).

    Returns {"pct", "active_warps_per_sm", "max_warps_per_sm", "blocks_per_sm", "limiter", "blocks_by"}:
    blocks_by gives each resource's limit on blocks per SM. A block that cannot run at all (too many
    threads, registers or shared memory) gives 0 blocks, 0 %, and the resource that forbids it.
    """
    if threads_per_block <= 0:
        raise ValueError(f"threads per block must be positive, got {threads_per_block}")
    regs = int(regs_per_thread or 0)
    smem = int(smem_per_block or 0)
    warps_per_block = -(-threads_per_block // WARP)
    by: dict[str, int] = {}
    by["warps"] = limits.max_warps_per_sm // warps_per_block if threads_per_block <= limits.max_threads_per_block else 0
    by["blocks"] = limits.max_blocks_per_sm
    if regs > 0:
        per_warp = _round_up(regs * WARP, limits.reg_alloc_unit)
        assumed = per_warp * _round_up(warps_per_block, limits.sub_partitions)  # the hardware's per-block check
        too_many = per_warp * warps_per_block > limits.regs_per_block or assumed > limits.regs_per_block
        if regs > limits.max_regs_per_thread or too_many:
            by["registers"] = 0
        else:
            warps_per_part = (limits.regs_per_sm // limits.sub_partitions) // per_warp
            by["registers"] = warps_per_part * limits.sub_partitions // warps_per_block
    else:
        by["registers"] = by["blocks"]  # unknown or none: registers do not limit
    per_block = _round_up(smem + limits.smem_reserved_per_block, limits.smem_alloc_unit)
    if limits.smem_per_block and smem > limits.smem_per_block:
        by["shared_memory"] = 0
    elif limits.smem_per_sm and per_block > 0:
        by["shared_memory"] = limits.smem_per_sm // per_block
    else:
        by["shared_memory"] = by["blocks"]
    blocks = min(by.values())
    limiter = next(k for k in LIMITERS if by[k] == blocks)
    active = blocks * warps_per_block
    return {"pct": 100.0 * active / limits.max_warps_per_sm, "active_warps_per_sm": active,
            "max_warps_per_sm": limits.max_warps_per_sm, "blocks_per_sm": blocks, "limiter": limiter,
            "blocks_by": by}
