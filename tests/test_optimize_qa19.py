"""QA round 19, optimize: the fresh-inputs probe's verdict under load."""
from __future__ import annotations

import numpy as np

from gpuspeed.stats import summarize


def _m(samples):
    return summarize(samples, name="x", device="cpu", mode="cpu")


class _Impl:
    device = "cpu"

    def prepare(self, a):
        return a

    def run(self, *a):
        return None

    def sync(self):
        pass


def _probe(monkeypatch, rounds):
    """_fresh_inputs_probe with each round's (fresh, again) given: the verdict and how many rounds it made."""
    from gpuspeed.optimize import worker

    made = []

    def fresh_vs_again(impl, fn, fresh_sets, same, name):
        made.append(name)
        return rounds[len(made) - 1]

    monkeypatch.setattr(worker, "_fresh_vs_again", fresh_vs_again)
    monkeypatch.setattr(worker, "_fresh_args", lambda spec, wl: [(np.ones(4),)] * worker.FRESH_SETS)
    result = {"name": "cand", "notes": []}
    found = worker._fresh_inputs_probe({"recipe": {}, "bench_budget_s": 2.0}, None, _Impl(), (np.ones(4),),
                                       (np.ones(4),), _m([1e-5] * 5), result, lambda _s: None)
    return found, len(made)


def test_one_round_of_slow_fresh_calls_is_not_called_caching_unless_a_second_round_agrees(monkeypatch):
    # under a load of ~13 all three fresh calls of the one round were slowed alike: a candidate that caches nothing
    # was said to "cache its results by input" and timed on the slow round (test_optimize_qa15's sparse writer)
    slow, fast = (_m([5e-4, 6e-4, 7e-4]), _m([1e-5, 1e-5, 1e-5])), (_m([1.1e-5, 1e-5, 1.2e-5]), _m([1e-5] * 3))
    assert _probe(monkeypatch, [slow, fast]) == (None, 2)
    assert _probe(monkeypatch, [fast]) == (None, 1)  # a first round that finds nothing is the verdict
    found, made = _probe(monkeypatch, [slow, slow])  # caching, seen twice: said, with the second round's times
    assert made == 2 and found is not None and found[0][0].median == slow[0].median
