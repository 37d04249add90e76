"""gpuspeed: measure, analyze and speed up Python code on NVIDIA GPUs.

The measurement core: `bench` (timing), `check` (correctness), `peak_memory` (VRAM). Everything else
in gpuspeed times, checks and budgets through these.
"""

from gpuspeed import compat  # noqa: F401  (shims for optional backends, before any of them compiles)
from gpuspeed.errors import UserError
from gpuspeed.kernel import KernelReport, kernel_report
from gpuspeed.memory import MemoryReport, cap, peak_memory
from gpuspeed.profiling import ProfileResult, profile
from gpuspeed.timing import Measurement, bench, compare
from gpuspeed.verify import CheckResult, check, poison

__version__ = "0.1.0"

__all__ = ["bench", "compare", "Measurement", "check", "CheckResult", "poison", "peak_memory", "MemoryReport",
           "cap", "profile", "ProfileResult", "UserError", "kernel_report", "KernelReport", "__version__"]

# `gpuspeed.roofline.place(...)` after a plain `import gpuspeed`, as the README writes it: the heavier
# subpackages load on first use
_SUBMODULES = {"roofline", "graphs", "graph_breaks", "launch", "decode", "optimize", "examples", "results", "doctor",
               "device", "inputs", "trees", "stats"}


def __getattr__(name: str):
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"gpuspeed.{name}")
    raise AttributeError(f"module 'gpuspeed' has no attribute {name!r}")
