"""Profiler and trace analysis: `profile(fn, *args, steps=N)` runs torch.profiler (with NVTX ranges),
reads the Chrome trace into findings (busy/idle, launch gaps, tiny kernels, host syncs, transfers, top
kernels), adds Python hotspots, and places each finding at the user's file:line.

Modules: run (the passes), trace (trace -> findings), sites (source lines), hotspots (cProfile, line
times, loop nests), advice (recommendations), report (console, Markdown, results JSON).
"""

from gpuspeed.profiling.run import ProfileResult, profile

__all__ = ["profile", "ProfileResult"]
