"""`gpuspeed optimize`: speed up a user's Python function end to end.

workload (load + validate) -> analysis (hotspots) -> candidates (the plan) -> runner + worker (each
candidate isolated, checked, timed, budgeted) -> budget (chunking) -> pipeline (choice, projection) ->
report (A-E, JSON, PNG) and emit (the standalone optimized_<name>.py). backends/ holds the candidate
implementations, self-contained so the emitted script can carry them.
"""


def optimize(target, **kwargs):
    """Run the pipeline on a workload file (or a bundled example's name); see pipeline.optimize."""
    from gpuspeed.optimize.pipeline import optimize as _optimize

    return _optimize(target, **kwargs)


__all__ = ["optimize"]
