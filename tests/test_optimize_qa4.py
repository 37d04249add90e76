"""Workloads as users write them (QA pass 4), CPU only: a file name with a dot or a space, --time-budget inf,
pure-Python code that writes into a list argument (and the emitted script's write-back into it and into a state
dict), --input naming a keyword-only parameter, an original that returns strings, sys.exit in user code, inputs()
that ignore their rng, a TOLERANCE of NumPy scalars, a list from inputs() meant as one argument, and Numba on
keyword-only parameters, `with np.errstate` and an original imported from a file beside the workload."""

import json
import textwrap

import numpy as np
import pytest

from gpuspeed.errors import UserError
from gpuspeed.optimize import workload as W
from gpuspeed.optimize.backends.common import Impl, in_place_call, tree_map, write_back
from gpuspeed.optimize.pipeline import optimize

TINY = '''
import numpy as np


def original(x):
    return np.sqrt(np.abs(x)) * 2.0


def inputs(rng):
    return rng.standard_normal(1000)
'''

LIST_OUT = '''
import math


def original(xs, out):
    for i, x in enumerate(xs):
        out[i] = math.sqrt(abs(x)) * 2.0


def inputs(rng):
    xs = [float(v) for v in rng.standard_normal(50)]
    return xs, [0.0] * len(xs)
'''


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


@pytest.mark.parametrize("name", ["my-work.v2.py", "my work.py"])
def test_a_workload_file_name_with_a_dot_or_a_space_gets_its_report_and_script(tmp_path, name):
    # the results study was optimize_<file stem>, refused ("bad study name") after every candidate had run,
    # leaving the PNG without report.md, the JSON or the script
    p = _write(tmp_path, name, TINY)
    out = tmp_path / "out"
    run = optimize(str(p), device="cpu", backends=["numpy"], time_budget=180, out=out)
    stem = p.stem
    assert (out / "report.md").is_file() and (out / f"optimized_{stem}.py").is_file()
    doc = json.loads(open(run.paths["json"]).read())
    assert doc["study"].startswith("optimize_my") and doc["summary"]["primary"] == "original"


def test_an_infinite_time_budget_is_refused_before_the_original_is_blamed(tmp_path):
    # inf reached the reference calls' SIGALRM timer: "original(...) raised OverflowError: timestamp out of range"
    p = _write(tmp_path, "tiny.py", TINY)
    with pytest.raises(UserError, match="--time-budget must be a positive finite"):
        optimize(str(p), device="cpu", backends=["numpy"], time_budget=float("inf"), out=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with W._time_limit(1e12):  # a huge finite limit is no limit, not an overflow
        pass


def test_an_original_writing_into_a_python_list_is_checked_on_what_it_writes(tmp_path):
    # the list argument it fills was not seen to change: "returned None and changed none of its arguments"
    wl = W.load(_write(tmp_path, "listout.py", LIST_OUT), gpu=False)
    refs, mutates, in_place = W.reference(wl, [1, 2])
    assert mutates and in_place == [1]
    xs = wl.make_args(1)[0]
    assert refs[1] == ([math_ref(v) for v in xs],)
    assert not W.same_inputs(([1.0, 2.0],), ([1.0, 3.0],))
    assert not W.same_inputs(([1.0],), ([1.0, 2.0],))  # appended to
    assert W.same_inputs(([1.0, float("nan")],), ([1.0, float("nan")],))


def math_ref(v):
    return abs(v) ** 0.5 * 2.0


def test_the_emitted_in_place_call_writes_back_into_a_python_list():
    # every backend's prepare() rebuilds lists (tree_map): the candidate wrote into its copy, and the emitted
    # script's write-back skipped the list's numbers, leaving the caller's list as it was
    def prepare(args):
        return tree_map(lambda x: x, args)

    def run(xs, out):
        for i, x in enumerate(xs):
            out[i] = np.float32(x * 2)

    impl = Impl(run, prepare, label="copies its arguments")
    xs, out = [1.0, 2.0, 3.0], [0.0, 0.0, 0.0]
    keep = out
    assert in_place_call(impl, [1])(xs, out) is None
    assert out is keep and out == [2.0, 4.0, 6.0] and all(type(v) is float for v in out)
    grown = [1]
    write_back(grown, [1, 2, 3])
    assert grown == [1, 2, 3]
    state = {"n": 0, "a": np.zeros(2)}
    write_back(state, {"n": 5, "a": np.ones(2, dtype=np.float32)})
    assert state["n"] == 5 and state["a"].dtype == np.float64 and state["a"].tolist() == [1.0, 1.0]


def test_input_naming_a_keyword_only_parameter_is_one_line(tmp_path):
    # was passed by position: "original(...) raised TypeError: original() takes 1 positional argument but 2 were given"
    p = _write(tmp_path, "kw.py", '''
        import numpy as np


        def original(x, *, alpha):
            return alpha * np.sin(x)
    ''')
    with pytest.raises(UserError, match="'alpha' is keyword-only"):
        W.load(p, input_specs=["x=float64[10]", "alpha=float:2.0"], gpu=False)


def test_an_original_returning_strings_is_a_one_line_error(tmp_path):
    # the original's own worker failed ("could not convert string to float") and the run went on to a report
    p = _write(tmp_path, "labels.py", '''
        import numpy as np


        def original(x):
            return np.where(x > 0, "pos", "neg")


        def inputs(rng):
            return rng.standard_normal(10)
    ''')
    wl = W.load(p, gpu=False)
    with pytest.raises(UserError, match="returned a <U3 array"):
        W.reference(wl, [1])


@pytest.mark.parametrize("where", ["original", "inputs"])
def test_sys_exit_in_the_users_code_is_one_line(tmp_path, where):
    # gpuspeed exited silently with the user's exit code (sys.exit(3) -> exit 3, no message)
    p = _write(tmp_path, "quits.py", f'''
        import sys

        import numpy as np


        def original(x):
            {"sys.exit(3)" if where == "original" else "return x * 2"}


        def inputs(rng):
            {"sys.exit(3)" if where == "inputs" else "return rng.standard_normal(10)"}
    ''')
    with pytest.raises(UserError, match=r"raised SystemExit\(3\)"):
        W.reference(W.load(p, gpu=False), [1])


def test_inputs_that_ignore_their_rng_are_named_not_the_original(tmp_path):
    # np.random in inputs(): every worker's arguments differed from the references', and the report said the
    # original "does not reproduce its own output on the same inputs", every candidate WRONG
    p = _write(tmp_path, "unseeded.py", '''
        import numpy as np


        def original(x, k):
            return x * k


        def inputs(rng):
            return np.random.standard_normal(100), 3.0
    ''')
    with pytest.raises(UserError, match=r"inputs\(rng\) made other arguments for the same seed"):
        W.reference(W.load(p, gpu=False), [1, 2])
    seeded = _write(tmp_path, "seeded.py", TINY)
    W.reference(W.load(seeded, gpu=False), [1, 2])  # the same arguments again: no error


def test_a_tolerance_given_as_numpy_scalars_is_a_number(tmp_path):
    # TOLERANCE = dict(atol=np.finfo(np.float32).tiny) was refused: "atol must be a number >= 0, got np.float32(...)"
    p = _write(tmp_path, "tol.py", '''
        import numpy as np

        TOLERANCE = dict(rtol=np.finfo(np.float32).eps * 10, atol=np.float64(1e-9))


        def original(x):
            return x * 2


        def inputs(rng):
            return rng.standard_normal(10)
    ''')
    wl = W.load(p, gpu=False)
    assert type(wl.rtol) is float and wl.rtol == pytest.approx(1.1920929e-06) and wl.atol == 1e-9
    with pytest.raises(UserError, match="rtol must be a number"):
        W.load(p, rtol=float("nan"), gpu=False)


def test_numba_says_it_cannot_take_keyword_only_parameters():
    # was "failed: TypeError: not enough arguments: expected at least 3, got 1" at the first call
    pytest.importorskip("numba")
    import types

    from gpuspeed.optimize.backends import numba_cpu

    module = types.ModuleType("kwonly_workload")
    exec("def original(x, y=None, *, alpha=2.0, beta=1):\n    return alpha * x + beta\n", vars(module))
    with pytest.raises(numba_cpu.NumbaUnsupported, match=r"keyword-only parameters \(alpha, beta\)"):
        numba_cpu.build(module, func="original")


def test_a_list_from_inputs_meant_as_one_argument_gets_a_short_error_with_the_way_out(tmp_path):
    # pure-Python code's inputs() returning a list of 1000 floats: splatted into 1000 arguments, and the error
    # line described each of them (28 KB)
    p = _write(tmp_path, "listarg.py", '''
        def original(xs):
            return sum(x * x for x in xs)


        def inputs(rng):
            return [float(v) for v in rng.standard_normal(1000)]
    ''')
    with pytest.raises(UserError) as err:
        W.reference(W.load(p, gpu=False), [1])
    text = str(err.value)
    assert len(text) < 400 and "1000 arguments in all" in text and "return (the_list,)" in text


def test_numba_names_an_unsupported_context_manager_as_unavailable():
    # `with np.errstate(...)` (common in NumPy code) was "failed: CompilerError: Failed in nopython mode pipeline"
    pytest.importorskip("numba")
    import types

    from gpuspeed.optimize.backends import numba_cpu

    module = types.ModuleType("errstate_workload")
    exec("import numpy as np\n\ndef original(x):\n    with np.errstate(divide='ignore'):\n        y = np.log(x)\n"
         "    return y\n", vars(module))
    impl = numba_cpu.build(module, func="original")
    with pytest.raises(numba_cpu.NumbaUnsupported, match="Unsupported context manager"):
        impl.run(np.ones(3))


@pytest.mark.parametrize("prange", [False, True])
def test_numba_compiles_an_original_imported_from_a_file_beside_the_workload(tmp_path, monkeypatch, prange):
    # `from mycode import original`: its helper g lives in mycode, not in the workload; Numba failed with
    # "Untyped global name 'g'" (and the prange copy, exec'd in the workload's namespace, with "name 'g' is not defined")
    pytest.importorskip("numba")
    from gpuspeed.optimize.backends import numba_cpu

    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"mycode_qa4_{int(prange)}"  # one module per case: sys.modules keeps the first
    _write(tmp_path, f"{name}.py", '''
        import math


        def g(v):
            return math.sqrt(abs(v)) * 2.0


        def original(x):
            out = x.copy()
            for i in range(x.shape[0]):
                out[i] = g(x[i])
            return out
    ''')
    p = _write(tmp_path, "wl_qa4.py", f'''
        from {name} import original


        def inputs(rng):
            return rng.standard_normal(100)
    ''')
    module = W.import_workload(p, unique=True)
    impl = numba_cpu.build(module, func="original", prange=prange)
    x = np.random.default_rng(0).standard_normal(100)
    assert np.allclose(impl.run(x), np.sqrt(np.abs(x)) * 2.0)
    mine = __import__(name)
    assert not hasattr(mine.g, "py_func") and "__numba" not in vars(mine)  # the user's module untouched


def test_a_percentage_budget_without_a_gpu_is_a_note_not_an_error(tmp_path):
    # "--budget 80%" was refused on a machine without a GPU ("the device size is unknown"), though no GPU memory
    # is used there; a bad percentage is still refused
    p = _write(tmp_path, "w.py", TINY)
    run = optimize(str(p), device="cpu", backends=["numpy"], time_budget=180, out=tmp_path / "out", budget="80%")
    assert any("--budget 80% is a share of a GPU's memory" in n for n in run.notes)
    doc = json.loads(open(run.paths["json"]).read())
    assert doc["params"]["budget_bytes"] is None
    with pytest.raises(UserError, match="percentage must be in"):
        optimize(str(p), device="cpu", backends=["numpy"], time_budget=180, out=tmp_path / "out2", budget="180%")


def test_the_alternative_is_never_slower_than_the_original():
    # the report offered as "alternative" the fastest correct candidate of another backend, even one slower than
    # the original (a CPU loop 3x slower beside a GPU primary)
    from pathlib import Path

    from gpuspeed.optimize.pipeline import OptimizeRun, choose
    from gpuspeed.stats import summarize

    def row(name, backend, seconds):
        rng = np.random.default_rng(len(name))
        t = summarize(seconds * (1 + 0.01 * rng.standard_normal(15)), name=name, device="cpu", mode="cpu").to_dict()
        return {"name": name, "status": "ok", "recipe": {"name": name, "backend": backend}, "device_time": t,
                "e2e_time": t, "label": name}

    results = {r["name"]: r for r in (row("original", "original", 1e-2), row("cupy", "cupy", 1e-4),
                                      row("numba", "numba", 3e-2))}
    run = OptimizeRun(wl=None, where="cpu", out_dir=Path("."), params={}, results=results)
    choice = choose(run)
    assert choice["primary"] == "cupy" and choice["alternative"] is None
    results["jax"] = row("jax", "jax", 5e-3)  # faster than the original: offered
    assert choose(run)["alternative"] == "jax"
