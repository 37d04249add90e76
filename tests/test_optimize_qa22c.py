"""QA round 22c, optimize: the confirmation step (the primary timed alternately with the original) reviewed.

The busy moment is made deterministic as in test_optimize_qa22b: the original sleeps while a flag file exists, and the
first candidate's first call removes it, so the original's own timing overstates every speedup over it.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from optimize_script_helpers import optimize_text

TWO_VARIANTS = '''
import time
from pathlib import Path

import numpy as np

BUSY = Path(__file__).with_name("busy.flag")  # there: the machine is busy while the original is timed


def original(x):
    if BUSY.exists():
        time.sleep(0.03)
    return np.sort(np.sort(np.sort(x)))


def inputs(rng):
    return (rng.standard_normal(20000),)


def sorted_once(x):  # a third of the work
    BUSY.unlink(missing_ok=True)
    return np.sort(x)


def sorted_twice(x):  # two thirds of the work
    BUSY.unlink(missing_ok=True)
    return np.sort(np.sort(x))


variants = {"sorted_once": sorted_once, "sorted_twice": sorted_twice}
'''


def _benchmark_row(folder: Path) -> dict:
    spec = importlib.util.spec_from_file_location("bench_optimize", Path(__file__).parents[1] / "benchmarks/optimize.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._row("busy", folder, 0, 0.1, "")


def test_a_replaced_speedup_rescales_the_other_candidates_and_the_benchmark_row_records_it(tmp_path):
    (tmp_path / "busy.flag").touch()
    run = optimize_text(tmp_path, "busy", TWO_VARIANTS, ["variant"])
    conf = run.choice["confirmation"]
    assert run.choice["primary"] == "variant:sorted_once" and conf["replaced"], conf
    doc = json.loads((run.out_dir / "optimize_busy.json").read_text())
    rows = {r["name"]: r for r in doc["rows"]}
    twice = rows["variant:sorted_twice"]["speedup"]
    # two thirds of the work: about 1.5x, and below the primary; over the busy original's 30 ms it read ~200x
    assert twice < run.choice["speedup"] < 30, (twice, run.choice["speedup"])
    assert 0.5 < twice < 5, twice
    table = next(line for line in (run.out_dir / "report.md").read_text().splitlines()
                 if line.startswith("| variant:sorted_twice"))
    assert "rescaled" in table, table

    row = _benchmark_row(run.out_dir)
    assert row["speedup"] == run.choice["speedup"]
    assert row["confirmed"] is True and row["speedup_replaced"] is True, row
    assert row["separate_speedup"] == conf["separate"] > 30, row
