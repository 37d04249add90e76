"""Without a GPU the optimize run ranks its candidates end to end: a float32 candidate's casts are paid by every
caller of the optimized script, which passes the original's float64 arrays (the CPU run chose by the time on inputs
already cast, and could hand back a primary slower than the original for its user)."""

from pathlib import Path

import numpy as np

from gpuspeed.optimize.pipeline import OptimizeRun, choose
from gpuspeed.stats import summarize
from optimize_script_helpers import optimize_text


def row(name, backend, device_s, e2e_s):
    rng = np.random.default_rng(len(name))

    def t(s):
        return summarize(s * (1 + 0.01 * rng.standard_normal(15)), name=name, device="cpu", mode="cpu").to_dict()

    return {"name": name, "status": "ok", "recipe": {"name": name, "backend": backend}, "device_time": t(device_s),
            "e2e_time": t(e2e_s), "label": name}


def test_end_to_end_ranking_keeps_the_original_over_a_cast_bound_float32_candidate():
    results = {r["name"]: r for r in (row("original", "original", 1e-2, 1e-2),
                                      row("numpy-fp32", "numpy", 0.6e-2, 1.8e-2))}
    run = OptimizeRun(wl=None, where="cpu", out_dir=Path("."), params={}, results=results)
    assert choose(run, "device")["primary"] == "numpy-fp32"  # on inputs already cast it is faster...
    choice = choose(run, "e2e")
    assert choice["primary"] == "original" and choice["kept_original"]  # ...but not for the script's caller


def test_a_cpu_run_ranks_end_to_end_by_default_and_keeps_an_explicit_choice(tmp_path):
    text = """
        import numpy as np
        def original(x):
            return np.sqrt(x * x + 1.0).sum(axis=1)
        def inputs(rng, scale=1.0):
            return (rng.standard_normal((64, 128)),)
    """
    run = optimize_text(tmp_path, "sq", text, ["numpy"])
    assert run.params["rank_by"] == "e2e" and run.choice["rank_by"] == "e2e"
    assert any("ranked end to end" in n for n in run.notes), run.notes
    (tmp_path / "b").mkdir()
    explicit = optimize_text(tmp_path / "b", "sq", text, ["numpy"], rank_by="device")
    assert explicit.params["rank_by"] == "device" and not any("ranked end to end" in n for n in explicit.notes)
