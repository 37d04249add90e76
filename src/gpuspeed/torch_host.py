"""torch's CPU allocations during one call, for peak_memory() on the host: torch keeps no count of them there,
tracemalloc never sees them, and the RSS does not rise where torch's heap reuses memory it freed (a warmed-up call
read 0 B). Read from torch's profiler, recording its memory events only, where the caller has imported torch."""

from __future__ import annotations

import os
import sys


PROFILER_EVENT_BYTES = 48  # kineto's buffer grows the RSS ~44 B a memory event (torch 2.13)


def _silently(fn) -> None:
    """fn() with the process's stderr (file descriptor 2, where C++ code writes) sent to /dev/null."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no stderr to silence (closed, or None under pythonw)
        fn()
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            fn()
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class TorchHostAllocs:
    """The peak of torch's CPU allocations in a window, from its profiler's memory events (a running sum): torch
    keeps no count on the host, tracemalloc never sees them, and RSS does not rise where torch's heap reuses memory
    it freed (a warmed-up call read 0 B). Only where torch is already imported; only memory events are recorded,
    so the cost is per allocation (~5 us and ~2 KiB each while torch reads them back, after the window). A tensor
    made before the window and freed in it has no event (torch does not know its size): the peak is then high."""

    warned = False  # c10 warns once a process when a tensor made before a profiler is freed inside it

    def __init__(self):
        self.peak: int | None = None
        self.events = 0  # memory events recorded (each grew the process's RSS a little)
        self.why = ""  # set: torch is imported but its allocations could not be measured
        self._on = False

    def start(self) -> None:
        if "torch" not in sys.modules:
            return
        try:
            from torch._C import _autograd, _profiler

            if _autograd._profiler_enabled():
                self.why = "torch's profiler was already running (one profiler at a time)"
                return
            dist = getattr(sys.modules["torch"], "distributed", None)
            if dist is not None and dist.is_available() and dist.is_initialized():
                # a rank of a --tp run on the CPU died of SIGSEGV once in a C++ thread soon after a measured
                # window (gloo's threads allocate beside the call): no profiler in a torch.distributed process
                self.why = "a torch.distributed process (its communication threads allocate beside the call)"
                return
            config = _profiler.ProfilerConfig(_profiler.ProfilerState.KINETO, False, True, False, False, False,
                                              _profiler._ExperimentalConfig())
            cpu = {_profiler.ProfilerActivity.CPU}
            made_before = [sys.modules["torch"].empty(1)] if not TorchHostAllocs.warned else None
            quiet = "KINETO_LOG_LEVEL" not in os.environ  # kineto prints two lines a window at its default level
            if quiet:
                os.environ["KINETO_LOG_LEVEL"] = "6"  # read once, when kineto starts
            try:
                _autograd._prepare_profiler(config, cpu)
                _autograd._enable_profiler(config, cpu, {_profiler.RecordScope.USER_SCOPE})  # no per-op events
            finally:
                if quiet:
                    os.environ.pop("KINETO_LOG_LEVEL", None)
            self._on = True
            if made_before is not None:
                TorchHostAllocs.warned = True
                _silently(made_before.clear)  # frees it: c10's one-time warning is spent here, unseen
        except Exception as exc:  # noqa: BLE001 - a torch without this profiler API: said, not a failed measurement
            self.why = f"torch's profiler did not start ({type(exc).__name__}: {exc})"

    def stop(self) -> None:
        if not self._on:
            return
        self._on = False
        try:
            from torch._C import _autograd

            if not _autograd._profiler_enabled():  # a profiler the call ran ended this one on its way out
                self.why = "the call ran torch's profiler itself, which ended the measurement's"
                return
            cpu = _autograd.DeviceType.CPU
            # only memory events carry bytes (a free's are negative); a CUDA allocation is not host memory
            sizes = sorted((e.start_ns(), n) for e in _autograd._disable_profiler().events()
                           if (n := e.nbytes()) and e.device_type() == cpu)
        except Exception as exc:  # noqa: BLE001
            self.why = f"torch's profiler gave no memory events ({type(exc).__name__}: {exc})"
            return
        self.events = len(sizes)
        running = peak = 0
        for _, size in sizes:  # frees of tensors made before the call take the sum below 0: the peak is above start
            running += size
            peak = max(peak, running)
        self.peak = peak
