"""QA round 20, optimize: section D on a CPU-only run, and the emitted script as users run and import it."""
from __future__ import annotations

import numpy as np
import pytest

from gpuspeed.optimize import workload as W


def _timed(median_s):
    return {"median": median_s, "iqr": 0.0, "n": 9}


def _report(tmp_path, where, results):
    """Sections A-E of a run of a small workload that kept the original, on `where`, with `results`."""
    from gpuspeed.optimize.pipeline import OptimizeRun
    from gpuspeed.optimize.report import markdown

    path = tmp_path / "scale.py"
    path.write_text("import numpy as np\n\ndef original(x):\n    return x * 2.0\n\n"
                    "def inputs(rng):\n    return (rng.standard_normal((64, 8)),)\n")
    run = OptimizeRun(wl=W.load(path, gpu=False), where=where, out_dir=tmp_path, results=results,
                      params={"target_gpu": "RTX 4070 Laptop", "budget": "8GiB", "seeds": [1, 2, 3]},
                      choice={"primary": "original", "kept_original": True})
    return markdown(run)


def test_a_cpu_only_runs_section_d_names_no_gpu_bandwidth_roof(tmp_path):
    # a CPU-only run said "% of bw roof ... against this GPU's datasheet bandwidth" above a column of dashes
    timed = _timed(1e-4)
    section_d = _report(tmp_path, "cpu", {"original": {"status": "ok", "recipe": {"backend": "original"},
                                                        "label": "the original", "device_time": timed,
                                                        "e2e_time": timed}}).split("## D")[1].split("### Plan")[0]
    assert "GPU's datasheet" not in section_d and "bw roof" not in section_d, section_d
    header = next(ln for ln in section_d.splitlines() if ln.startswith("| candidate"))
    row = next(ln for ln in section_d.splitlines() if ln.startswith("| original"))
    assert header.count("|") == row.count("|"), (header, row)
    assert "No GPU here, so no bandwidth roof" in section_d, section_d


@pytest.mark.gpu
def test_a_gpu_runs_section_d_keeps_its_bandwidth_roof_column(tmp_path):
    timed = _timed(1e-4)
    results = {"original": {"status": "ok", "recipe": {"backend": "original"}, "label": "the original",
                            "device_time": timed, "e2e_time": timed, "pct_of_bw_roof": 41.5}}
    section_d = _report(tmp_path, "cuda", results).split("## D")[1].split("### Plan")[0]
    assert "% of bw roof" in section_d and "| 42 % |" in section_d, section_d
