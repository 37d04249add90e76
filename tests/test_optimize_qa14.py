"""QA pass 14 on `gpuspeed optimize` and its optimized_<name>.py: what a demanding user's own functions get back.
CPU only: small real runs (--device cpu, a short bench budget) and the emitted script in a fresh process."""

import subprocess
import sys

import pytest
from optimize_script_helpers import LOAD_OPTIMIZED, optimize_text, rewrite

VIEWS = """
    import numpy as np

    TOLERANCE = dict(rtol=1e-4, atol=1e-5)  # loose enough for the float32 candidate


    def original(x, w):
        acc = np.zeros(x.shape[0])  # float32 under the float32 candidate
        for i in range(x.shape[0]):
            acc[i] = x[i] * w[i]
        k = int(np.argmax(w))  # where the slice starts depends on the values, not only on the shapes
        return acc, x[1:], w[::-2], {"tail": x[k:]}


    def inputs(rng):
        return rng.standard_normal(120), rng.standard_normal(120)
    """

CALL_VIEWS = LOAD_OPTIMIZED + '''
import numpy as np

original = opt.load_workload("_mine").original
rng = np.random.default_rng(3)
for kind in ("float64", "float32", "strided"):
    for n in (37, 120):
        if kind == "strided":
            x, w = rng.standard_normal(3 * n)[::3], rng.standard_normal((n, 2))[:, 1]
        else:
            x, w = rng.standard_normal(n).astype(kind), rng.standard_normal(n).astype(kind)
        ref = original(x, w)
        out = fn(x, w)
        views = [np.shares_memory(out[1], x), np.shares_memory(out[2], w), np.shares_memory(out[3]["tail"], x)]
        exact = [np.array_equal(out[1], ref[1]), np.array_equal(out[2], ref[2]),
                 np.array_equal(out[3]["tail"], ref[3]["tail"])]
        print(kind, n, all(views), all(exact), views, exact)
'''


@pytest.fixture(scope="module")
def views(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("views")
    run = optimize_text(tmp_path, "views", VIEWS, ["numpy"])
    return run, tmp_path


def _lines(tmp_path, script, text):
    p = tmp_path / "use_it.py"
    p.write_text(text)
    r = subprocess.run([sys.executable, str(p), str(script)], capture_output=True, text=True, timeout=180,
                       cwd=tmp_path.parent)  # another folder than the script's and the workload's
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.splitlines()


def test_a_view_of_an_argument_comes_back_as_that_view_under_a_float32_primary(views):
    """`return x[1:]`: the float32 primary cast x to float32, sliced the copy and cast the slice back, so the caller
    got a new array (writing into it left x as it was) holding x's values rounded through float32 (not x's own).
    The slice, reversed step and value-dependent start alike now come back as views of the caller's own arrays:
    its elements exactly, for the run's dtypes, the other precision and strided inputs."""
    run, tmp_path = views
    assert run.results["numpy-fp32"]["status"] == "ok", run.results["numpy-fp32"].get("reason")
    lines = _lines(tmp_path, rewrite(run, "numpy-fp32"), CALL_VIEWS)
    assert len(lines) == 6 and all(line.split()[2:4] == ["True", "True"] for line in lines), "\n".join(lines)


STEP_LOOP = """
    import numpy as np


    def original(state, forces, dt):
        for i in range(state.shape[0]):
            state[i] += forces[i] * dt  # a 3-vector expression: parallel=True forks threads for it at every step
        return state.sum()


    def inputs(rng):
        return rng.standard_normal((300, 3)), rng.standard_normal((300, 3)), 0.01
    """


def test_loop_bound_code_gets_a_serial_numba_candidate(tmp_path):
    """Numba was tried only as njit(parallel=True): a loop whose body holds small array expressions got a parfor, a
    thread fork and join, at every iteration (0.55 ms a call against 23 us for a serial njit and 365 us for the
    original, on this step loop), so a CPU run reported no speedup where njit gave 15x. A serial njit is now tried
    beside it, checked like any candidate, and the script built from it runs and passes its check from another
    folder."""
    run = optimize_text(tmp_path, "step_loop", STEP_LOOP, ["numba"])
    serial = run.results.get("numba-serial")
    assert serial and serial["status"] == "ok", serial
    assert serial["recipe"].get("parallel") is False and "serial" in serial["label"], serial
    script = rewrite(run, "numba-serial")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd="/")
    assert r.returncode == 0 and "correctness: PASS" in r.stdout and "serial" in r.stdout, r.stdout + r.stderr


NOISY = """
    import numpy as np


    def original(x):
        noise = np.random.standard_normal(x.shape)  # unseeded: another result on every call
        out = np.empty_like(x)
        for i in range(x.shape[0]):
            out[i] = x[i] + 1e-3 * noise[i]
        return out


    def inputs(rng):
        return (rng.standard_normal(200),)
    """


def test_candidates_of_a_nondeterministic_original_are_not_called_wrong(tmp_path):
    """Against an original that does not reproduce its own output, the table and the summary called every candidate
    WRONG: a verdict nothing established (the candidate differed from the original as the original differs from
    itself). They are now 'not checkable', and none is the primary."""
    import json

    run = optimize_text(tmp_path, "noisy", NOISY, ["numba"])
    assert run.results["original"].get("nondeterministic")
    report = (tmp_path / "out" / "report.md").read_text()
    tried = [n for n, r in run.results.items() if n != "original" and r.get("status") == "unverifiable"]
    assert tried, {n: r.get("status") for n, r in run.results.items()}
    assert "WRONG" not in report, report
    assert f"| {tried[0]} | not checkable |" in report, report
    assert "not checkable: " in " ".join(run.choice["why_not_2x"]), run.choice["why_not_2x"]
    assert run.choice["primary"] == "original"
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "optimize", str(tmp_path / "noisy.py"), "--device", "cpu",
                        "--backends", "numba", "--out", str(tmp_path / "out"), "--resume", "--json"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "WRONG" not in r.stdout + r.stderr
    json.loads(r.stdout)


ROW_UPDATE = """
    import numpy as np


    def original(state, forces, dt):
        for i in range(state.shape[0]):
            state[i] += forces[i] * dt  # row i only: the iterations are independent
            if state[i, 0] > 3.0:  # an element of that same row
                state[i, 0] = 3.0
        return state


    def inputs(rng):
        return rng.standard_normal((400, 3)), rng.standard_normal((400, 3)), 0.01
    """


def test_a_row_update_read_back_by_element_is_not_a_sequential_recurrence(tmp_path, monkeypatch):
    """`state[i] += ...` then `state[i, 0]` read: the two index tuples differ in length, so the loop analysis took
    them for two elements of different iterations, called the loop a sequential recurrence, skipped every GPU
    backend "for any machine" and wrote in the report that no GPU candidate could reach 2x, for a loop whose rows
    are independent. Row i and element (i, 0) are now seen as the same iteration's."""
    from gpuspeed.optimize import analysis
    from gpuspeed.optimize import candidates as C
    from gpuspeed.optimize import workload

    monkeypatch.setattr(C, "installed", lambda name: True)
    p = tmp_path / "rows.py"
    p.write_text(__import__("textwrap").dedent(ROW_UPDATE))
    wl = workload.load(p, gpu=True)
    hot = analysis.analyze(wl, wl.make_args(0), 1e-3)
    assert not hot["sequential"], hot["hot_loops"]
    rows = {r["key"]: r for r in C.plan(wl, "cuda", hot)[0]}
    assert "sequential" not in rows and rows["cupy"]["decision"] == "tried", rows


def test_no_prange_candidate_where_parallel_iterations_would_race_on_an_array_element():
    """`for k in range(n): for i in ...: out[i] += f(x[i], k)`: every iteration of the outer loop adds into the same
    out[i], so run as numba.prange its iterations race (Numba's docs: "accumulating into the same element of `y`
    from different parallel iterations ... results in a race condition"). The prange candidate was planned anyway:
    on a machine of few cores the race lost no update in the run's 3 checks, and it became the primary (58x), a
    function that gives wrong sums now and then where more threads run. It is planned only where each iteration
    writes the arrays it shares at its own index (the loop's variable) or into its own temporaries."""
    import numpy as np

    from gpuspeed.optimize import candidates as C

    def accumulates(x, n):
        out = np.zeros_like(x)
        for k in range(n):
            for i in range(x.shape[0]):
                out[i] += np.sin(x[i] + k)
        return out

    def histogram(ids, values, n):
        sums = np.zeros(n)
        for i in range(ids.shape[0]):
            sums[ids[i]] += values[i]
        return sums

    def rows(x, w):
        out = np.empty((x.shape[0], 2))
        total = 0.0
        for i in range(x.shape[0]):
            tmp = np.zeros(2)  # its own temporary
            tmp[0] = x[i, 0] * w[i]
            tmp[1] = x[i, 1] - w[i]
            out[i] = tmp
            out[i, 0] += 1.0
            total += tmp[0]  # a scalar reduction: Numba's prange handles these
        return out, total

    class Wl:
        kind, rtol, atol, in_place, variants, module = "numpy", 1e-9, None, None, {}, np

    for fn, prange in ((accumulates, False), (histogram, False), (rows, True)):
        Wl.original = staticmethod(fn)
        _, recs = C.plan(Wl, "cpu", {"loop_bound": True, "float64": True}, requested=["numba"])
        assert ("numba-prange" in {r["name"] for r in recs}) is prange, (fn.__name__, [r["name"] for r in recs])


@pytest.mark.gpu
def test_on_a_gpu_a_view_of_an_argument_comes_back_as_that_view_from_a_cupy_primary(tmp_path):
    """The same as on the CPU, through a GPU primary: CuPy sliced its device copy of x, and the script handed back a
    host copy of the slice (float32-rounded under cupy-fp32); now the caller's own array viewed the same way."""
    import textwrap

    from gpuspeed.optimize.pipeline import optimize

    pytest.importorskip("cupy")
    p = tmp_path / "views.py"
    p.write_text(textwrap.dedent(VIEWS))
    run = optimize(p, device="cuda", out=tmp_path / "out", backends=["cupy"], time_budget=120, bench_budget_s=0.05)
    ran = [n for n in ("cupy", "cupy-fp32") if run.results.get(n, {}).get("status") == "ok"]
    assert ran, {n: r.get("status") for n, r in run.results.items()}
    for name in ran:
        lines = _lines(tmp_path, rewrite(run, name), CALL_VIEWS)
        assert len(lines) == 6 and all(line.split()[2:4] == ["True", "True"] for line in lines), (name, lines)
