"""gpuspeed: measure, analyze and speed up Python code on NVIDIA GPUs.

The measurement core: `bench` (timing), `check` (correctness), `peak_memory` (VRAM). Everything else
in gpuspeed times, checks and budgets through these.
"""

import os as _os
import sys as _sys

# `python -m gpuspeed` imports this package with the current folder first on sys.path (argv[0] is "-m" meanwhile),
# where a user's inspect.py or numbers.py replaced the standard library's: that folder goes last (as __main__ does)
if _sys.argv[:1] == ["-m"] and _sys.path and _sys.path[0] in ("", _os.getcwd()):
    _sys.path.append(_sys.path.pop(0))
del _os, _sys

from gpuspeed import compat  # noqa: E402, F401  (shims for optional backends, before any of them compiles)
from gpuspeed.errors import UserError  # noqa: E402
from gpuspeed.kernel import KernelReport, kernel_report  # noqa: E402
from gpuspeed.memory import MemoryReport, cap, peak_memory  # noqa: E402
from gpuspeed.profiling import ProfileResult, profile  # noqa: E402
from gpuspeed.timing import Measurement, bench, compare  # noqa: E402
from gpuspeed.verify import CheckResult, check, poison  # noqa: E402

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
