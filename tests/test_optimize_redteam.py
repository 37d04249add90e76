"""The red-team set on the CPU: variants that cheat or break must be rejected or flagged, each recorded
against itself while the honest one (and the original) keep their results. Zero false passes."""

import textwrap

import pytest

from gpuspeed.optimize.pipeline import optimize

REDTEAM = '''
import os
import signal
import time

import numpy as np

TOLERANCE = dict(rtol=1e-5, atol=1e-6)  # loose enough that a float32 result passes on values alone
_cache = {}
_calls = [0]


def original(x, w):
    return np.sin(x) * w


def inputs(rng):
    return rng.standard_normal(4096), 1.5


def honest(x, w):
    return w * np.sin(x)


def mutates_input(x, w):
    out = np.sin(x) * w
    x[:] = 0.0
    return out


def cached(x, w):
    if "r" not in _cache:
        _cache["r"] = np.sin(x) * w
    return _cache["r"]


def leaves_half_unwritten(x, w):
    out = np.empty_like(x)
    half = len(x) // 2
    out[:half] = np.sin(x[:half]) * w
    return out


def wrong_shape(x, w):
    return (np.sin(x) * w)[:-1]


def wrong_dtype(x, w):
    return (np.sin(x) * w).astype(np.float32)


def returns_nan(x, w):
    out = np.sin(x) * w
    out[7] = np.nan
    return out


def right_only_on_zeros(x, w):
    return np.zeros_like(x)


def right_only_first_seed(x, w):
    _calls[0] += 1
    return np.sin(x) * w * (1.0 if _calls[0] == 1 else 1.001)


def segfaults(x, w):
    os.kill(os.getpid(), signal.SIGSEGV)


def hangs(x, w):
    time.sleep(3600)


def raises(x, w):
    raise RuntimeError("kernel launch failed")


variants = {name: fn for name, fn in list(globals().items())
            if callable(fn) and name not in ("original", "inputs") and not name.startswith("_")
            and getattr(fn, "__module__", None) == __name__}
'''

EXPECTED = {
    "honest": "ok", "mutates_input": "mutates_inputs", "cached": "incorrect", "leaves_half_unwritten": "incorrect",
    "wrong_shape": "wrong_output", "wrong_dtype": "wrong_output", "returns_nan": "incorrect",
    "right_only_on_zeros": "incorrect", "right_only_first_seed": "incorrect", "segfaults": "crashed",
    "hangs": "timeout", "raises": "error",
}


@pytest.mark.slow
def test_redteam_zero_false_passes(tmp_path):
    p = tmp_path / "redteam.py"
    p.write_text(textwrap.dedent(REDTEAM))
    # 8 s a candidate: `hangs` waits it out; the others finish in a second or two
    run = optimize(p, device="cpu", out=tmp_path / "out", backends=["variant"], time_budget=400,
                   candidate_limit_s=8, bench_budget_s=0.2)
    assert run.results["original"]["status"] == "ok"
    got = {name.split(":", 1)[1]: r["status"] for name, r in run.results.items() if name.startswith("variant:")}
    assert got == EXPECTED, {k: (v, run.results["variant:" + k].get("reason")) for k, v in got.items()}
    assert run.choice["primary"] in ("variant:honest", "original")  # the same work: either may time faster
    assert "another stream" not in (run.results["variant:cached"].get("reason") or "")
    md = (tmp_path / "out" / "report.md").read_text()
    for name in EXPECTED:
        assert f"variant:{name}" in md  # every candidate, good or bad, is in the report
