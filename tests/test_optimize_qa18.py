"""Round 18 of optimize/profile QA: refs.pkl read one seed at a time, the bar chart, section E's profile command,
the image_filter example without SciPy."""

import tracemalloc

import numpy as np

from gpuspeed.optimize import workload as W


def test_one_seeds_reference_is_read_without_the_others(tmp_path):
    # a worker checks one seed at a time: reading one seed's outputs must not hold every seed's in memory
    n = 1_000_000  # 8 MB a seed
    refs = {seed: (np.full(n, float(seed)),) for seed in (11, 22, 33)}
    path = tmp_path / "refs.pkl"
    W.save_refs(path, refs)
    del refs
    tracemalloc.start()
    try:
        saved = W.load_refs(path)
        ref = saved[22]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert float(ref[0][0]) == 22.0 and ref[0].shape == (n,)
    assert sorted(saved) == [11, 22, 33] and 33 in saved
    assert peak < 1.5 * 8 * n, f"read {peak / 8e6:.1f} seeds' worth of outputs for one seed"
