"""The time budget (issue 14 item 2): min_samples is a floor, the warm-up a bounded share, and batched
sampling overshoots the budget by at most one batch. The batch logic runs here on a fake device clock."""

import time

import numpy as np
import pytest

from gpuspeed.timing import bench
from gpuspeed.timing.stopping import WARMUP_SHARE, Stopper, sample_batches


class FakeDevice:
    """A device that runs queued samples back to back, each `per_sample` seconds of fake time, with
    times spread widely enough that a tight noise target is never met."""

    def __init__(self, per_sample: float):
        self.per_sample, self.now, self.busy_until, self.queued = per_sample, 0.0, 0.0, 0
        self.rng = np.random.default_rng(0)

    def clock(self) -> float:
        return self.now

    def queue(self, n: int):
        assert n >= 1
        self.queued += n
        self.busy_until = max(self.busy_until, self.now) + n * self.per_sample
        return n, self.busy_until

    def read(self, handle) -> list[float]:
        n, end = handle
        self.now = max(self.now, end)
        return list(self.per_sample * self.rng.uniform(0.5, 1.5, n))


def run(per_sample, budget_s, min_samples=3, max_samples=10**6, nominal=3, max_noise=1e-6, settle=False):
    dev = FakeDevice(per_sample)
    stopper = Stopper(max_noise, min_samples, max_samples, budget_s, clock=dev.clock)
    samples = sample_batches(dev.queue, dev.read, stopper, per_sample, nominal, settle_batch=settle)
    return samples, dev, stopper


def test_a_slow_call_overshoots_by_at_most_one_batch():
    # a 1 s call under a 2 s budget: the old loop always read a second full batch in flight (6 s here)
    samples, dev, stopper = run(per_sample=1.0, budget_s=2.0, nominal=3)
    assert len(samples) == 3 and "time budget" in stopper.reason
    assert dev.now <= 3.0 + 1e-9  # the min_samples floor (3 s), nothing queued past it
    assert dev.queued == len(samples)


@pytest.mark.parametrize("per_sample, nominal", [(0.01, 3), (0.001, 25), (0.0002, 125)])
def test_fast_calls_stop_within_one_batch_of_the_budget(per_sample, nominal):
    samples, dev, stopper = run(per_sample=per_sample, budget_s=0.5, nominal=nominal, min_samples=10)
    assert "time budget" in stopper.reason
    assert 0.5 <= dev.now <= 0.5 + nominal * per_sample + 1e-9
    assert dev.queued == len(samples)


def test_min_samples_is_a_floor_even_past_the_budget():
    samples, dev, stopper = run(per_sample=0.5, budget_s=0.1, min_samples=10, nominal=3)
    assert len(samples) == 10
    assert "past it to min_samples=10" in stopper.reason
    assert dev.now == pytest.approx(5.0)  # ten samples, no more


def test_max_samples_trims_and_nothing_is_queued_past_it():
    samples, dev, stopper = run(per_sample=1e-4, budget_s=100.0, min_samples=3, max_samples=7, nominal=5)
    assert len(samples) == 7 and "max_samples" in stopper.reason
    assert dev.queued == 7


def test_settle_batch_is_discarded():
    samples, dev, _ = run(per_sample=0.01, budget_s=0.2, nominal=4, settle=True)
    assert dev.queued == len(samples) + 4


def test_next_batch_never_leaves_the_device_idle_while_the_rule_is_unmet():
    now = [0.0]
    stopper = Stopper(0.01, 3, 100, 1.0, clock=lambda: now[0])
    now[0] = 50.0  # the budget long spent
    assert stopper.next_batch(taken=5, in_flight=0, per_sample_s=0.1, nominal=10) == 1
    assert stopper.next_batch(taken=5, in_flight=2, per_sample_s=0.1, nominal=10) == 0
    assert stopper.next_batch(taken=1, in_flight=1, per_sample_s=0.1, nominal=10) == 2  # the floor
    assert stopper.next_batch(taken=100, in_flight=0, per_sample_s=0.1, nominal=10) == 0


def _never_settles():
    """A call that gets slower every time, so the warm-up never settles and the noise target is never met."""
    calls = [0]

    def f():
        calls[0] += 1
        time.sleep(0.002 + 0.0002 * calls[0])
    return f, calls


def test_min_samples_floor_on_the_cpu_path():
    # the old rule stopped at 3 samples: the warm-up ate the budget and the budget exit needed only 3
    f, _ = _never_settles()
    m = bench(f, device="cpu", budget_s=0.5, min_samples=10, max_noise=1e-6)
    assert m.n >= 10
    assert "time budget" in m.notes[0]


def test_default_warmup_is_a_bounded_share_of_the_budget():
    f, calls = _never_settles()
    budget = 0.6
    t0 = time.perf_counter()
    m = bench(f, device="cpu", budget_s=budget, min_samples=5, max_noise=1e-6)
    elapsed = time.perf_counter() - t0
    n_warm = int(m.notes[1].split()[1])
    assert n_warm + m.n == calls[0]
    warm_s = sum(0.002 + 0.0002 * i for i in range(1, n_warm + 1))  # what the warm-up slept
    assert warm_s <= budget * WARMUP_SHARE + 0.02, (n_warm, warm_s)
    assert m.n >= 5 and elapsed < budget + 0.5
