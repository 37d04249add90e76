"""When bench() stops: the warm-up, the stopping rule, and how many samples to queue next.

One budget covers the whole bench() call, warm-up included. The warm-up gets a bounded share of it;
sampling stops when the median's relative standard error is under `max_noise`, at `max_samples`, or
once the budget is spent -- but never under `min_samples`, a hard floor that can take longer than the
budget. Batched modes size each batch to the budget left, so a run overshoots by at most one batch.
Everything here takes its clock as an argument, so the rules run under a fake clock in the tests.
"""

from __future__ import annotations

import numbers
import time
from typing import Any, Callable

import numpy as np

from gpuspeed.errors import UserError
from gpuspeed.stats import median_rel_error

WARMUP_SHARE = 1 / 3  # the default warm-up may use this share of budget_s (it always makes 2 calls)


class Stopper:
    """The stopping rule shared by every mode, timed from bench()'s start (before the warm-up)."""

    def __init__(self, max_noise: float, min_samples: int, max_samples: int, budget_s: float,
                 clock: Callable[[], float] = time.perf_counter):
        for what, v in (("max_noise", max_noise), ("budget_s", budget_s)):
            if isinstance(v, bool) or not isinstance(v, numbers.Real):  # '2' < 1 is a TypeError
                raise UserError(f"{what} must be a number, got {v!r}")
        for what, v in (("min_samples", min_samples), ("max_samples", max_samples)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):  # samples[:inf] fails at the end
                raise UserError(f"{what} must be a whole number, got {v!r}")
        if not (0 < max_noise < 1):
            raise UserError(f"max_noise must be in (0, 1), got {max_noise}")
        if min_samples < 3 or max_samples < min_samples:
            raise UserError(f"need 3 <= min_samples <= max_samples, got min_samples={min_samples}, "
                            f"max_samples={max_samples}")
        if not 0 < budget_s < float("inf"):  # NaN too; inf made the default warm-up endless for a drifting call
            raise UserError(f"budget_s must be a positive, finite number of seconds, got {budget_s}")
        self.max_noise, self.min_samples, self.max_samples, self.budget_s = (
            max_noise, min_samples, max_samples, budget_s)
        self.clock = clock
        self.t0 = clock()
        self.reason = ""
        self._floor_past_budget = False  # the budget ran out before min_samples were taken

    def left(self) -> float:
        """Seconds of the budget not yet spent (negative once overspent)."""
        return self.budget_s - (self.clock() - self.t0)

    def done(self, samples) -> bool:
        n = len(samples)
        if n >= self.max_samples:
            self.reason = f"stopped at max_samples={self.max_samples}"
            return True
        if n < self.min_samples:  # a floor, whatever the budget says
            self._floor_past_budget = self.left() < 0
            return False
        if median_rel_error(samples) <= self.max_noise:
            self.reason = "noise target met"
            return True
        if self.left() < 0:
            self.reason = f"time budget of {self.budget_s:g} s spent before the noise target"
            if self._floor_past_budget:
                self.reason += f" (sampling went past it to min_samples={self.min_samples})"
            return True
        return False

    def next_batch(self, taken: int, in_flight: int, per_sample_s: float, nominal: int) -> int:
        """How many samples to queue now: `taken` already read or queued, `in_flight` of them still queued.

        At most `nominal`, never past max_samples, no more than fit in the budget left once the batch in
        flight has run -- except what the min_samples floor still needs. 0 means queue nothing; it is
        never 0 with nothing in flight unless max_samples is reached, so the caller always has a batch
        to wait on while the rule is not met.
        """
        room = self.max_samples - taken
        if room <= 0:
            return 0
        floor = self.min_samples - taken
        if per_sample_s > 0:
            fit = int((self.left() - in_flight * per_sample_s) // per_sample_s)
        else:
            fit = room
        size = min(nominal, room, max(fit, floor))
        if size <= 0:
            size = 0 if in_flight else 1
        return size


def settle(one: Callable[[], float], budget_s: float, window: int = 5, tol: float = 0.05,
           clock: Callable[[], float] = time.perf_counter) -> tuple[float, int, bool]:
    """Call `one()` (returns a time) until two successive windows' medians agree within `tol`, or until
    `budget_s` has passed (at least two calls: the first pays for compilation and allocation and is never
    part of a window). Returns (typical time, calls made, settled)."""
    t0 = clock()
    times = [one()]
    while True:
        times.append(one())
        if len(times) > 2 * window:
            prev = float(np.median(times[-2 * window:-window]))
            cur = float(np.median(times[-window:]))
            if prev > 0 and abs(cur - prev) / prev < tol:
                return cur, len(times), True
        if clock() - t0 > budget_s:
            return float(np.median(times[-window:])), len(times), False


def sample_batches(queue: Callable[[int], Any], read: Callable[[Any], list[float]], stopper: Stopper,
                   per_sample_s: float, nominal: int, settle_batch: bool = False) -> list[float]:
    """Samples from batches queued on the device, two in flight, until the stopper is satisfied.

    `queue(n)` queues n samples and returns a handle; `read(handle)` waits for them and returns their
    times. The next batch is queued before the host waits on the current one, so the device never idles
    between batches. The batch still in flight when the rule is met is read too (every sample counts);
    it was sized to the budget left, so it is the only overshoot. `settle_batch`: queue one batch first
    and discard it, so sampling starts in the power state of sustained use.
    """
    discard = queue(nominal) if settle_batch else None
    size = stopper.next_batch(0, 0, per_sample_s, nominal)
    pending, pending_n = queue(size), size
    if discard is not None:
        read(discard)
    samples: list[float] = []
    last = stopper.clock()
    while True:
        size = stopper.next_batch(len(samples) + pending_n, pending_n, per_sample_s, nominal)
        following = queue(size) if size else None
        samples += read(pending)
        # what a sample really takes, flush and launches included, sizes the batches from here on
        now = stopper.clock()
        per_sample_s, last = (now - last) / pending_n, now
        pending, pending_n = following, size
        if stopper.done(samples):
            break
        if pending is None:
            pending_n = stopper.next_batch(len(samples), 0, per_sample_s, nominal)
            pending = queue(pending_n)
    if pending is not None:
        samples += read(pending)
    return samples[:stopper.max_samples]
