"""Shared by the optimize tests: a workload text loaded, a small CPU `gpuspeed optimize` run of one, the run's script
rewritten with another primary, and the lines a user's script starts with to load it."""

import textwrap

from gpuspeed.optimize.pipeline import optimize


def load_text(tmp_path, text, name="w"):
    """The workload `text`, written to tmp_path/<name>.py, loaded as optimize loads it (no GPU)."""
    from gpuspeed.optimize import workload

    p = tmp_path / f"{name}.py"
    p.write_text(textwrap.dedent(text))
    return workload.load(p, gpu=False)


def optimize_text(tmp_path, name, text, backends, **kw):
    """`gpuspeed optimize` on the CPU of the workload `text`, written to tmp_path/<name>.py; a short run."""
    p = tmp_path / f"{name}.py"
    p.write_text(textwrap.dedent(text))
    return optimize(p, **({"device": "cpu", "out": tmp_path / "out", "backends": backends, "time_budget": 180,
                           "bench_budget_s": 0.05} | kw))


def rewrite(run, primary):
    """The run's script with `primary` as its primary (what the run writes had it chosen it)."""
    from gpuspeed.optimize import emit

    run.choice = {"primary": primary}
    script = run.out_dir / f"optimized_{run.wl.name}.py"
    script.write_text(emit.script_text(run))
    return script


# a user's script: the optimized script given as argv[1] loaded as a module, its optimized function built
LOAD_OPTIMIZED = '''
import importlib.util
import sys

spec = importlib.util.spec_from_file_location("optimized", sys.argv[1])
opt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(opt)
fn, how = opt.build_optimized()
'''
