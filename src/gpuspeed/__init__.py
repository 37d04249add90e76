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
