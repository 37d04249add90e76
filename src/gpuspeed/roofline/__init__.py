"""Roofline: measured ceilings of this device, the AI sweep, placement of any function, plot and report.

    from gpuspeed.roofline import ceilings, place
    c = ceilings()                      # measured memory and compute ceilings
    p = place(fn, *args, ceilings=c)    # intensity, achieved FLOP/s and GB/s, roof, % of roof, bound

Submodules: model (arithmetic), kernels (Triton), ceilings, sweep, place, workloads, study, plot, report.
"""

from gpuspeed.roofline.ceilings import Ceiling, Ceilings, ceilings
from gpuspeed.roofline.place import Placement, count_flops, min_bytes, place

__all__ = ["Ceiling", "Ceilings", "ceilings", "Placement", "count_flops", "min_bytes", "place"]
