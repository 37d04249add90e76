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


def _stopped_while_loading(signum, _frame):  # nothing is measured or written yet: the line, and the exit code
    import signal

    term = signum == signal.SIGTERM
    _os.write(2, b"gpuspeed: stopped by SIGTERM\n" if term else b"gpuspeed: interrupted\n")
    _os._exit(143 if term else 130)


def _stop_while_loading_if_entry() -> None:
    """`gpuspeed ...` or `python -m gpuspeed ...` (not a program that imports gpuspeed): SIGTERM and Ctrl-C while this
    package's own imports load (~0.2 s, before results.stop_early() takes over) are one line and 143 / 130, not a
    silent -15 or a KeyboardInterrupt traceback. A signal the caller ignores stays ignored."""
    import signal

    orig = list(getattr(_sys, "orig_argv", None) or [])
    by_m = "-m" in orig and orig[orig.index("-m") + 1:orig.index("-m") + 2] == ["gpuspeed"]
    script = _os.path.basename(_sys.argv[0] if _sys.argv else "") in ("gpuspeed", "gpuspeed.exe", "gpuspeed-script.py")
    if not (by_m or script):
        return
    import threading

    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(s) is not signal.SIG_IGN:
                signal.signal(s, _stopped_while_loading)


_stop_while_loading_if_entry()
del _stop_while_loading_if_entry

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
