"""QA pass 16 on `gpuspeed optimize` and `gpuspeed profile`: loop advice for a mirror swap and an argmax written with
`if`, no prange candidate that changes the answer, and workloads a Python developer writes (in place, tuples,
np.random inside, float16, a broken file, a decorator, inputs over the budget). CPU only: small real runs."""

import json
import subprocess
import sys
import textwrap

import pytest

GPUSPEED = [sys.executable, "-m", "gpuspeed"]

LOOPS = """
    import numpy as np


    def flip(a):
        n = a.shape[0]
        for i in range(n // 2):
            a[i], a[n - 1 - i] = a[n - 1 - i], a[i]


    def flip_twice(a):
        n = a.shape[0]
        for i in range(n):
            a[i], a[n - 1 - i] = a[n - 1 - i], a[i]


    def argmax(x):
        best = -np.inf
        idx = -1
        for i in range(x.shape[0]):
            if x[i] > best:
                best = x[i]
                idx = i
        return idx, best


    def argmax_pair(x):
        best, idx = -np.inf, -1
        for i in range(x.shape[0]):
            if x[i] > best:
                best, idx = x[i], i
        return idx, best


    def largest(x):
        best = -np.inf
        for i in range(x.shape[0]):
            if x[i] > best:
                best = x[i]
        return best
    """


def _loop(tmp_path, name: str) -> dict:
    """The one hot loop nest `gpuspeed profile --function loops.py:<name> --json` reports."""
    import contextlib
    import io
    import os

    from gpuspeed.cli import main

    p = tmp_path / "loops.py"
    p.write_text(textwrap.dedent(LOOPS))
    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(tmp_path)  # in this process (the classification is the point, not the process), from the same folder
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["profile", "--function", f"{p}:{name}", "--input", "x=float64[3000]" if name in (
                "argmax", "argmax_pair", "largest") else "a=float64[3000]", "--json"])
    finally:
        os.chdir(here)
    assert rc == 0, err.getvalue()[-2000:]
    (loop,) = json.loads(out.getvalue())["hotspots"]["hot_loops"]
    return loop


def test_profile_calls_a_swap_over_half_the_range_a_parallel_permutation(tmp_path):
    """`for i in range(n // 2): a[i], a[n - 1 - i] = a[n - 1 - i], a[i]` was "sequential: each iteration needs the
    previous one's a[i] from a[n - 1 - i]": each pair is touched by one iteration only, so its iterations are
    independent. The same swap over the whole range (each pair swapped twice) does depend on order."""
    loop = _loop(tmp_path, "flip")
    assert loop["kind"] == "parallel-map" and loop["verdict"].startswith("parallel permutation"), loop["verdict"]
    assert "a[i] and a[n - 1 - i]" in loop["verdict"]
    twice = _loop(tmp_path, "flip_twice")
    assert twice["kind"] == "sequential-loop", twice["verdict"]


def test_profile_calls_an_argmax_written_with_if_a_reduction_whose_ties_keep_the_first_index(tmp_path):
    """`if x[i] > best: best = x[i]; idx = i` was "sequential: each iteration needs the previous one's best": it is an
    argmax reduction, with its tie rule (strict `>`: the first index), and not one for prange as written."""
    loop = _loop(tmp_path, "argmax")
    verdict = loop["verdict"]
    assert loop["kind"] == "reduction" and verdict.startswith("parallel argmax reduction into best with idx"), verdict
    assert "on a tie the first iteration's index" in verdict and "not Numba prange as written" in verdict
    pair = _loop(tmp_path, "argmax_pair")  # `best, idx = x[i], i`: the same argmax
    assert pair["verdict"].startswith("parallel argmax reduction into best with idx"), pair["verdict"]
    largest = _loop(tmp_path, "largest")  # a max written with `if`: prange would lose each thread's result too
    assert largest["kind"] == "reduction" and "once it is written `best = max(best, ...)`" in largest["verdict"]


ARGMAX = """
    import numpy as np


    def original(x):
        best = -np.inf
        idx = -1
        for i in range(x.shape[0]):
            if x[i] > best:
                best = x[i]
                idx = i
        return idx, best


    def inputs(rng):
        return (rng.integers(0, 40, 5000).astype(np.float64),)  # many ties: the first index must win
    """

LARGEST = """
    import numpy as np


    def original(x):
        best = -np.inf
        for i in range(x.shape[0]):
            if x[i] > best:
                best = x[i]
        return best


    def inputs(rng):
        return (rng.standard_normal(5000),)
    """

FLIP = """
    def original(a):
        n = a.shape[0]
        for i in range(n // 2):
            a[i], a[n - 1 - i] = a[n - 1 - i], a[i]


    def inputs(rng):
        return (rng.standard_normal(5001),)
    """


def _numba_row(run) -> dict:
    (row,) = [r for r in run.plan_rows if r["key"] == "numba"]
    return row


def test_optimize_plans_no_prange_candidate_for_a_conditional_update(tmp_path):
    """prange does not reduce `if x[i] > best: best = x[i]`: compiled so, it returned -inf (each thread's best lost).
    optimize planned that candidate for the max (it failed its check) and, once the argmax is a reduction, would
    have for the argmax: neither is planned, the plan says why, and the argmax's answer keeps the first index."""
    from optimize_script_helpers import LOAD_OPTIMIZED, optimize_text

    for name, text in (("largest", LARGEST), ("argmax_ties", ARGMAX)):
        (tmp_path / name).mkdir()
        run = optimize_text(tmp_path / name, name, text, ["numba"])
        assert "numba-prange" not in run.results, (name, run.results["numba-prange"].get("reason"))
        assert "no prange candidate" in _numba_row(run)["why"] and "does not reduce" in _numba_row(run)["why"]
        assert run.results["numba-serial"]["status"] == "ok"
    report = (run.out_dir / "report.md").read_text()  # its lever: a reduction, not one thread per outer iteration
    assert "is a reduction: parallel argmax reduction" in report and "one thread per outer iteration" not in report
    script = run.out_dir / "optimized_argmax_ties.py"
    use = tmp_path / "use_it.py"
    use.write_text(LOAD_OPTIMIZED + textwrap.dedent("""
        import numpy as np
        x = np.array([1.0, 7.0, 3.0, 7.0, 7.0, 2.0])
        idx, best = fn(x)
        print(how, idx, best)
        """))
    r = subprocess.run([sys.executable, str(use), str(script)], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.split()[-2:] == ["1", "7.0"], r.stdout + r.stderr


def test_optimize_plans_prange_for_a_swap_over_half_the_range_and_it_gives_the_originals_answer(tmp_path):
    """The mirror swap is a parallel permutation: its prange candidate is planned and checked against the original."""
    from optimize_script_helpers import optimize_text

    run = optimize_text(tmp_path, "flip", FLIP, ["numba"])
    assert run.results["numba-prange"]["status"] == "ok", run.results["numba-prange"].get("reason")
    assert "no prange candidate" not in _numba_row(run)["why"]


@pytest.mark.parametrize("text, why", [
    ("""
    def original(x):
        out = x.copy()
        k = 0
        for i in range(x.shape[0]):
            out[i] = x[i] + k
            k += 1
        return out
    """, "read the counter k"),
    ("""
    def original(x):
        out = x.copy()
        acc = 0.0
        for i in range(x.shape[0]):
            for j in range(x.shape[1]):
                acc = acc * 0.5 + x[i, j]
                out[i, j] = acc
        return out
    """, "carry acc"),
])
def test_optimize_plans_no_prange_candidate_for_a_value_carried_between_iterations(tmp_path, text, why):
    """A counter read in the loop, or a value carried through a nest of few outer iterations (not 'sequential' by the
    hotspot rule), got a prange candidate: prange counts per thread and starts each thread from the initial value."""
    import numpy as np  # noqa: F401  (the workload's inputs)
    from optimize_script_helpers import optimize_text

    body = textwrap.dedent(text) + textwrap.dedent("""

    def inputs(rng):
        return (rng.standard_normal((40, 300)),)
    """)
    run = optimize_text(tmp_path, "carried", "import numpy as np\n" + body, ["numba"])
    assert "numba-prange" not in run.results, run.results["numba-prange"]
    assert why in _numba_row(run)["why"], _numba_row(run)["why"]


DECORATED = """
    import functools
    import sys

    import numpy as np


    def counted(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            print("through the decorator", file=sys.stderr)
            return fn(*args, **kwargs)
        return wrapper


    def bare(fn):
        def wrapper(*args, **kwargs):
            return fn(*args, **kwargs)
        return wrapper


    @counted
    def square(v):
        return v * v


    @counted
    def original(x):
        out = np.empty_like(x)
        for i in range(x.shape[0]):
            out[i] = square(x[i]) + 1.0
        return out


    @bare
    def unwrapped(x):
        out = np.empty_like(x)
        for i in range(x.shape[0]):
            out[i] = x[i] * x[i] + 1.0
        return out


    def inputs(rng):
        return (rng.standard_normal(20000),)
    """


def test_numba_compiles_the_function_under_a_decorator_and_keeps_the_decorator_around_it(tmp_path):
    """`@my_timer` (functools.wraps) over original: Numba compiled the wrapper's `*args, **kwargs` and every Numba
    candidate 'failed: UnsupportedBytecodeError: Use of unsupported opcode (DICT_MERGE)', as if the code had crashed.
    It compiles the function the decorator wraps and calls it through the decorator; a decorator without
    functools.wraps, whose function cannot be found, makes Numba 'unavailable' with the reason, not 'failed'. A helper
    under such a decorator is compiled as the function it wraps (compiled code cannot call the Python wrapper)."""
    from optimize_script_helpers import LOAD_OPTIMIZED, optimize_text

    run = optimize_text(tmp_path, "decorated", DECORATED, ["numba"])
    for name in ("numba", "numba-serial"):
        assert run.results[name]["status"] == "ok", (name, run.results[name].get("reason"))
    use = tmp_path / "use_it.py"
    use.write_text(LOAD_OPTIMIZED + textwrap.dedent("""
        import numpy as np
        out = fn(np.arange(4.0))
        print(how, out.tolist())
        """))
    script = run.out_dir / "optimized_decorated.py"
    r = subprocess.run([sys.executable, str(use), str(script)], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0 and "[1.0, 2.0, 5.0, 10.0]" in r.stdout and "Numba" in r.stdout, r.stdout + r.stderr
    assert "through the decorator" in r.stderr
    bare = optimize_text(tmp_path, "decorated", DECORATED, ["numba"], func="unwrapped")
    row = bare.results["numba-serial"]
    assert row["status"] == "unavailable" and "cannot compile" in row["reason"], row


SEEDED = """
    import numpy as np


    def original(x):
        np.random.seed(0)
        noise = np.random.standard_normal(x.shape[0])
        out = np.empty_like(x)
        for i in range(x.shape[0]):
            out[i] = x[i] * 2.0 + noise[i] * 0.1
        return out


    def inputs(rng):
        return (rng.standard_normal(20000),)
    """


@pytest.mark.skipif((__import__("os").cpu_count() or 1) < 2, reason="Numba's threads draw per thread: needs 2 cores")
def test_a_candidate_that_differs_from_a_seeded_random_original_says_its_generator_may_be_why(tmp_path):
    """`np.random.seed(0)` then draws: the original is deterministic, but Numba parallel=True draws per thread, so its
    numbers differ and it was 'WRONG: 50000/100000 over tolerance' with nothing to say the generator, not the
    computation, differs. The row and the run's notes now say so (the serial njit draws NumPy's stream: correct)."""
    from optimize_script_helpers import optimize_text

    run = optimize_text(tmp_path, "seeded", SEEDED, ["numba"])
    assert run.results["numba-serial"]["status"] == "ok", run.results["numba-serial"].get("reason")
    row = run.results["numba"]
    assert row["status"] == "incorrect", row
    assert "the original draws random numbers (`np.random.standard_normal`, line 7)" in row["reason"], row["reason"]
    assert any("pass the random numbers in as an argument" in n and "numba" in n for n in run.notes), run.notes


def test_the_script_answers_dtypes_the_run_never_saw_in_the_originals_kinds_or_lets_the_original_answer(tmp_path):
    """A max written with `best = -np.inf; if x[i] > best: best = x[i]` over int64 arrays: the original returns
    np.int64(9), Numba unifies best to float64 and returns 9.0. The script's first call on int64 arguments is the
    original's (it learns the form), but every later call handed the caller a float where the original gives an
    integer (no cast back: float to int could lose data). The first optimized answer on dtypes the run did not check
    is now held to the original's kinds; one that differs leaves those dtypes to the original, said once on stderr."""
    from optimize_script_helpers import LOAD_OPTIMIZED, optimize_text

    run = optimize_text(tmp_path, "largest", LARGEST, ["numba"])
    assert run.choice["primary"].startswith("numba"), run.choice
    use = tmp_path / "use_it.py"
    use.write_text(LOAD_OPTIMIZED + textwrap.dedent("""
        import numpy as np
        x = np.array([3, 9, 1, 9], dtype=np.int64)
        print(how, [type(fn(x)).__name__ for _ in range(3)], type(fn(x.astype(np.float64))).__name__)
        """))
    script = run.out_dir / "optimized_largest.py"
    r = subprocess.run([sys.executable, str(use), str(script)], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip().endswith("['int64', 'int64', 'int64'] float64"), r.stdout + r.stderr
    assert "the original answers these calls" in r.stderr, r.stderr


def test_a_syntax_error_in_a_module_the_workload_imports_names_that_module(tmp_path):
    """`from helpers import f` with `def f(x)` (no colon) in helpers.py: the error named the workload file
    ('work.py:1: syntax error: expected ':''), whose line 1 is `import numpy as np`. It names helpers.py now."""
    (tmp_path / "helpers.py").write_text("def f(x)\n    return x\n")
    (tmp_path / "work.py").write_text(textwrap.dedent("""
        import numpy as np
        from helpers import f


        def original(x):
            return f(x)


        def inputs(rng):
            return (rng.standard_normal(10),)
        """))
    r = subprocess.run([*GPUSPEED, "optimize", "work.py", "--device", "cpu", "--out", "out"], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("gpuspeed: error: ") and "helpers.py:1: syntax error" in line, line
    assert not (tmp_path / "out").exists()


SEEDED_ARRAYS = """
    import numpy as np


    def original(x):
        np.random.seed(0)
        return x * 2.0 + np.random.standard_normal(x.shape) * 0.1


    def inputs(rng):
        return (rng.standard_normal((512, 256)),)
    """


@pytest.mark.gpu
def test_on_a_gpu_a_cupy_candidate_of_a_seeded_random_original_says_its_generator_may_be_why(tmp_path):
    """CuPy's np.random (rebound to cupy.random) draws other numbers from seed 0 than NumPy: its WRONG row now says
    that the original draws random numbers, and the run's notes say such candidates cannot match it."""
    from gpuspeed.optimize.pipeline import optimize

    pytest.importorskip("cupy")
    p = tmp_path / "seeded_arrays.py"
    p.write_text(textwrap.dedent(SEEDED_ARRAYS))
    run = optimize(p, device="cuda", out=tmp_path / "out", backends=["cupy"], time_budget=120, bench_budget_s=0.05)
    wrong = [r for r in run.results.values() if r.get("status") == "incorrect"]
    assert wrong, {n: (r.get("status"), r.get("reason")) for n, r in run.results.items()}
    assert all("the original draws random numbers (`np.random.standard_normal`, line 7)" in r["reason"] for r in wrong)
    assert any("pass the random numbers in as an argument" in n for n in run.notes), run.notes


@pytest.mark.parametrize("text, name", [
    ("""
    def original(a):
        ok = True
        for i in range(1, a.shape[0]):
            if a[i] < a[i - 1]:
                ok = False
        return ok
    """, "ok"),
    ("""
    def original(a):
        where = -1
        for i in range(a.shape[0]):
            if a[i] < 0:
                where = i
        return where
    """, "where"),
])
def test_optimize_plans_no_prange_candidate_for_a_name_the_loop_sets_and_the_code_reads_after_it(tmp_path, text, name):
    """`ok = False` (an is-sorted flag) or `where = i` (the last negative) set under an `if` in the loop and returned:
    compiled with prange, Numba keeps each thread's copy to itself and returned True and -1 (the values before the
    loop) for an array with one element out of order or negative. optimize planned that candidate."""
    from optimize_script_helpers import optimize_text

    body = "import numpy as np\n" + textwrap.dedent(text) + textwrap.dedent("""

    def inputs(rng):
        a = np.sort(rng.standard_normal(20000)) + 10.0
        a[rng.integers(1, 20000)] = -1.0  # one element out of order, and negative
        return (a,)
    """)
    run = optimize_text(tmp_path, "flag", body, ["numba"])
    assert "numba-prange" not in run.results, run.results["numba-prange"]
    assert f"assign {name}, which the code reads after the loop" in _numba_row(run)["why"], _numba_row(run)["why"]
    assert run.results["numba-serial"]["status"] == "ok"


EMA = """
    import numpy as np


    def original(x, alpha):
        y = np.empty_like(x)
        acc = 0.0
        for i in range(x.shape[0]):
            acc = alpha * x[i] + (1.0 - alpha) * acc
            y[i] = acc
        return y


    def inputs(rng):
        return rng.standard_normal(20000), 0.1
    """


def test_the_lever_for_a_sequential_loop_is_not_one_gpu_thread_per_iteration(tmp_path):
    """ema_filter's report (results/nvidia-h200/optimize/ema_filter) gave as a lever 'a hand kernel (Triton / Numba
    CUDA, one thread per outer iteration)' for a loop whose iterations each need the previous one's: threads over it
    would give a wrong answer. The lever says the loop is sequential, and what runs it."""
    from optimize_script_helpers import optimize_text

    run = optimize_text(tmp_path, "ema", EMA, ["numba"])
    assert run.hot.get("sequential"), run.hot
    report = (run.out_dir / "report.md").read_text()
    assert "one thread per outer iteration" not in report
    assert "is sequential: its iterations cannot be GPU threads" in report


def test_a_swap_whose_bound_changes_inside_the_loop_is_no_permutation():
    """The mirror of i is n - 1 - i only while n holds still: `n = n - 1` inside the loop moves it, and iterations
    then touch each other's elements (the loop was called a parallel permutation)."""
    from gpuspeed.profiling.loops import loop_nests

    src = ("def f(a, n):\n    for i in range(n // 2):\n        a[i], a[n - 1 - i] = a[n - 1 - i], a[i]\n"
           "        n = n - 1\n")
    (loop,) = loop_nests(src, 1, {}, 0.0)
    assert loop["kind"] == "sequential-loop", loop["verdict"]


def test_profiling_a_decorated_function_prints_no_line_profiler_warning(tmp_path):
    """`gpuspeed profile` (and optimize's hotspot pass) of code under a functools.wraps decorator printed line_profiler's
    'UserWarning: Adding a function with a `.__wrapped__` attribute ...' and the source line that raised it: the
    wrapper's own code is timed on purpose (cProfile found it hot)."""
    (tmp_path / "decorated.py").write_text(textwrap.dedent(DECORATED))
    r = subprocess.run([*GPUSPEED, "profile", "--function", "decorated.py:original", "--input", "x=float64[2000]"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Hot loop nests" in r.stdout and "UserWarning" not in r.stderr and "__wrapped__" not in r.stderr, r.stderr


OVERLAP = """
    import numpy as np


    def original(a):
        b = a.copy()
        b[1:] += b[:-1]
        return b


    def inputs(rng):
        return (rng.standard_normal(5000),)
    """


def test_a_wrong_candidate_of_an_overlapping_in_place_slice_update_says_why(tmp_path):
    """`b[1:] += b[:-1]`: NumPy buffers the overlapping operands (each element plus its old neighbour), Numba updates
    element by element (a running sum): every Numba candidate was 'WRONG: 4999/5000 over tolerance' with nothing to
    say that the original's overlap, not the compiler's arithmetic, is what differs. The row says so now."""
    from optimize_script_helpers import optimize_text

    run = optimize_text(tmp_path, "overlap", OVERLAP, ["numba"])
    wrong = [r for r in run.results.values() if r.get("status") == "incorrect"]
    assert wrong, {n: r.get("status") for n, r in run.results.items()}
    for r in wrong:
        assert "overlapping slice of the same array (`b[1:] += b[:-1]`, line 7)" in r["reason"], r["reason"]


HALF = """
    import numpy as np


    def original(x, w):
        return np.tanh(x @ w) * 0.5 + x.mean()


    def inputs(rng):
        return rng.standard_normal((64, 32)).astype(np.float16), rng.standard_normal((32, 16)).astype(np.float16)
    """


def test_numba_on_float16_inputs_says_it_has_no_float16(tmp_path):
    """float16 arguments: Numba raises a bare NotImplementedError('float16') while typing them, and the row read
    'Numba nopython mode cannot compile original: float16'. It says what is missing now; the original's answer (the
    script's fallback) stays the checked one."""
    from optimize_script_helpers import optimize_text

    run = optimize_text(tmp_path, "half", HALF, ["numba"])
    row = run.results["numba"]
    assert row["status"] == "unavailable" and "its CPU target has no float16 type" in row["reason"], row
    r = subprocess.run([sys.executable, str(run.out_dir / "optimized_half.py")], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0 and "correctness: PASS" in r.stdout, r.stdout + r.stderr
