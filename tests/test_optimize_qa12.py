"""gpuspeed optimize and its optimized_<name>.py as a demanding user exercises them (QA pass 12), CPU only: small real
runs (--device cpu, a short bench budget, few backends) and the emitted script run or imported in a subprocess."""

import pytest
from optimize_script_helpers import optimize_text

RETURNS_ITS_ARGUMENTS = """
    import numpy as np

    TOLERANCE = dict(rtol=1e-4, atol=1e-5)  # loose enough for the float32 candidate


    def original(x, w, out):
        x *= 2.0
        x += w
        np.multiply(x, w, out=out)
        return out, x, x.sum()


    def copies(x, w, out):  # writes what the original writes, but hands back new arrays
        original(x, w, out)
        return out.copy(), x.copy(), x.sum()


    def clobbers(x, w, out):  # right in x and out, but it also writes into w, which the original only reads
        res = original(x, w, out)
        w *= 0.5
        return res


    variants = {"copies": copies, "clobbers": clobbers}


    def inputs(rng):
        return rng.standard_normal(300), rng.standard_normal(300) + 3.0, rng.standard_normal(300)
    """


@pytest.fixture(scope="module")
def returns_args(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("returns_args")
    return optimize_text(tmp_path, "scale", RETURNS_ITS_ARGUMENTS, ["numpy", "variant"]), tmp_path


def test_a_candidate_that_writes_an_argument_the_original_only_reads_is_not_correct(returns_args):
    """The original writes x and out and only reads w: a variant that also wrote into w (the caller's array) was
    called correct, because the mutation check was skipped altogether for an original that writes its arguments."""
    run, _ = returns_args
    row = run.results["variant:clobbers"]
    assert row["status"] == "mutates_inputs", (row["status"], row.get("reason"))
    assert "w" in row["reason"], row["reason"]
    assert run.results["original"]["status"] == "ok"
