"""QA round 15, core: the public API as a script or a notebook calls it (bench, check, peak_memory, results files read
back), and the CLI's JSON."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import gpuspeed


# -- check() on a large output: float64 work a chunk at a time -----------------------------------------------------

def test_check_of_a_large_array_holds_no_whole_array_float64_temporaries():
    # check() compared a whole leaf in float64 at once: ~86 bytes of temporaries an element (the guard assumed 40), so
    # a 400M-element output with 22 GiB free passed the guard and the OOM killer ended the process; and every fresh
    # temporary page-faulted in: 7 s for 20M elements. Now the comparison runs a chunk at a time.
    n = 2_000_000
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(n)
    out = ref.astype(np.float32)
    out[123_457] += 1.0  # one element far off: found, and placed, across chunks
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        r = gpuspeed.check(out, ref)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert not r.passed and r.n_over_tol == 1 and r.worst_index == (123_457,), r.summary
    assert peak < 4 * n, f"check() held {peak / n:.1f} bytes an element beyond its inputs"
