"""The GPU's clocks while bench() samples: polled beside the device, and whether they were throttled.

ClockWatch reads the SM clock before sampling, polls it from a background thread while the samples
run, reads it after, and takes NVML's power/heat cap counters on both sides. `throttled()` turns that
record into the Measurement's flag and notes. All NVML access goes through gpuspeed.device.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from gpuspeed import device as _device

THROTTLE_FRACTION = 0.90  # an SM clock under 90 % of max during the run marks it throttled
CAPPED_FRACTION = 0.10  # so does a heat cap acting for over 10 % of the sampling (a power cap: a note)
POLL_S = 0.005  # the SM clock is polled this often while the samples run


class ClockWatch:
    """The SM clock before, during (polled from a background thread) and after sampling, and how long a
    power or heat cap acted in between (NVML's violation counters)."""

    def __init__(self):
        self.clocks = {"sm_max_mhz": _device.read_clocks().get("sm_max_mhz"), "sm_mhz_before": _device.sm_clock_mhz()}
        self._capped = _device.capped_ns()
        self._index = _device.current_index()  # the poll thread's own current CUDA device would be GPU 0
        self._readings: list[int] = []
        self._done = threading.Event()
        self._thread = None
        if self.clocks["sm_mhz_before"]:  # NVML answers: poll it while the samples run
            self._thread = threading.Thread(target=self._poll, name="gpuspeed-clock-poll", daemon=True)
            self._thread.start()
        self._t0 = time.perf_counter()

    def _poll(self) -> None:
        while not self._done.wait(POLL_S):
            mhz = _device.sm_clock_mhz(self._index)
            if mhz:
                self._readings.append(mhz)

    def stop(self) -> dict:
        wall = time.perf_counter() - self._t0
        if self._thread is not None:
            self._done.set()
            self._thread.join()
        self.clocks["sm_mhz_after"] = _device.sm_clock_mhz()
        if self._readings:
            self.clocks["sm_mhz_median_during"] = int(np.median(self._readings))
            self.clocks["sm_mhz_min_during"] = int(min(self._readings))
            self.clocks["clock_readings"] = len(self._readings)
        capped = _device.capped_ns()
        for key in sorted(self._capped.keys() & capped.keys()):
            acted = (capped[key] - self._capped[key]) * 1e-9
            self.clocks[f"{key}_capped_fraction"] = min(1.0, max(0.0, acted / wall)) if wall > 0 else 0.0
        return self.clocks


def throttled(clocks: dict, notes: list[str]) -> bool:
    """Flag a run whose SM clock fell under 90 % of its max: read before and after sampling, and as the
    median of the readings polled during it. A heat cap acting for over 10 % of the sampling flags it
    too. A power cap adds a note: NVML's clock reading does not follow every dip it causes."""
    seen = [c for c in (clocks.get("sm_mhz_before"), clocks.get("sm_mhz_median_during"),
                        clocks.get("sm_mhz_after")) if c]
    if not seen:
        notes.append("SM clock not read (no NVML): throttling not checked")
        return False
    flagged = bool(clocks.get("sm_max_mhz") and min(seen) < THROTTLE_FRACTION * clocks["sm_max_mhz"])
    if flagged:
        during = " (median while sampling)" if min(seen) == clocks.get("sm_mhz_median_during") else ""
        notes.append(f"SM clock fell to {min(seen)} MHz{during}, under {THROTTLE_FRACTION:.0%} of max "
                     f"{clocks['sm_max_mhz']} MHz")
    thermal = clocks.get("thermal_capped_fraction") or 0.0
    if thermal > CAPPED_FRACTION:
        flagged = True
        notes.append(f"the thermal cap held the clocks down for {thermal:.0%} of the sampling (NVML)")
    power = clocks.get("power_capped_fraction") or 0.0
    if power > CAPPED_FRACTION:
        notes.append(f"power-bound: the power cap acted for {power:.0%} of the sampling (NVML), so the result "
                     "moves with what ran just before it")
    return flagged
