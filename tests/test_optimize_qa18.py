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


def _timed(median_s):
    return {"median": median_s, "iqr": 0.0, "n": 9}


def _bar_lengths(png):
    """The longest run of each bar colour along a row of the chart's left panel, in pixels."""
    import matplotlib.image as mpimg

    img = (mpimg.imread(png)[..., :3] * 255).round().astype(int)
    left = img[:, : img.shape[1] // 2]
    colours = {"green": (44, 160, 44), "gray": (127, 127, 127), "blue": (31, 119, 180)}
    lengths = {}
    for name, rgb in colours.items():
        hit = np.abs(left - np.array(rgb)).sum(axis=-1) < 12
        # per row, the longest unbroken run (a text's anti-aliased pixels are scattered, a bar is solid)
        edges = np.diff(np.pad(hit.astype(int), ((0, 0), (1, 1))), axis=1)
        starts, ends = np.nonzero(edges == 1), np.nonzero(edges == -1)
        lengths[name] = int((ends[1] - starts[1]).max()) if len(starts[1]) else 0
    return lengths


def test_the_bar_charts_fastest_candidate_has_the_longest_bar(tmp_path):
    # a log axis of times drew the primary (100x faster) as a sliver and the original as the longest bar
    from types import SimpleNamespace

    from gpuspeed.optimize.pipeline import OptimizeRun
    from gpuspeed.optimize.report import plot

    results = {"original": {"status": "ok", "device_time": _timed(1e-2), "e2e_time": _timed(1e-2)},
               "numba": {"status": "ok", "device_time": _timed(1e-4), "e2e_time": _timed(1e-4)},
               "torch-cpu": {"status": "ok", "device_time": _timed(2.5e-3), "e2e_time": _timed(2.5e-3)}}
    run = OptimizeRun(wl=SimpleNamespace(name="wl"), where="cpu", out_dir=tmp_path, results=results,
                      params={"target_gpu": "RTX 4070 Laptop", "rank_by": "e2e"}, choice={"primary": "numba"})
    lengths = _bar_lengths(plot(run, tmp_path / "chart.png"))
    assert lengths["green"] > 3 * lengths["blue"] > 0, lengths  # 100x against 4x: the primary's bar reads longest
    assert lengths["blue"] > lengths["gray"] > 0, lengths  # the original (1x) is the shortest
