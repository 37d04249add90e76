"""Launch overhead: the tiny-kernel sweep, the 1000-op chain, the fusion study, the fit; their report.

    from gpuspeed import launch
    doc = launch.run_launch(device="auto")      # the results document (gpuspeed.results schema)
    launch.write_artifacts(doc, "out/")         # launch.json, launch.md, launch.png

Submodules, one job each: fit (T(K) = fixed + per_launch * K), sweep (K tiny kernels: eager wall time,
one replayed graph), chains (the K-op chain, its check, the tiny chain), fusion (eager / compiled /
reduce-overhead / captured against a copy, in interleaved rounds with reliability flags), study (the
whole document), report (Markdown and PNG). `gpuspeed launch` is the CLI (commands/launch.py).
"""

from gpuspeed.launch.chains import chain_rtol, check_chain, make_chain
from gpuspeed.launch.fit import Fit, fit_linear
from gpuspeed.launch.fusion import VARIANTS
from gpuspeed.launch.report import plot, to_markdown, write_artifacts
from gpuspeed.launch.study import (CHAIN_TINY, CPU_KS, CPU_NS, GPU_KS, GPU_NS, TARGETS, check_fits, check_params,
                                   count_steps, run_launch)
from gpuspeed.launch.sweep import TINY_N, wall_time

__all__ = ["CHAIN_TINY", "CPU_KS", "CPU_NS", "GPU_KS", "GPU_NS", "TARGETS", "TINY_N", "VARIANTS", "Fit",
           "chain_rtol", "check_chain", "check_fits", "check_params", "count_steps", "fit_linear", "make_chain", "plot",
           "run_launch", "to_markdown", "wall_time", "write_artifacts"]
