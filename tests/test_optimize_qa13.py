"""QA pass 13 on optimized_<name>.py: does the optimized function return exactly what the user's original returns,
for the caller's own inputs? Dtypes for float32, float64 and integer inputs (a float32 primary's results cast back to
what the original returns for them), NumPy scalars and Python numbers kept as the original's, its containers, the
arguments it hands back, keyword-only calls, strided inputs, two shapes in a row, the CPU fallback. CPU only: small
real runs (--device cpu, a short bench budget) and the emitted script imported in a subprocess."""

import subprocess
import sys
import textwrap
import types

import pytest
from optimize_script_helpers import LOAD_OPTIMIZED, optimize_text, rewrite

KINDS = """
    import numpy as np

    TOLERANCE = dict(rtol=1e-4, atol=1e-5)  # loose enough for the float32 candidate


    def original(x, w):
        acc = np.zeros(x.shape[0])  # float64 whatever the inputs: a float32 candidate makes it float32
        for i in range(x.shape[0]):
            acc[i] = x[i] * w[i]
        return acc, acc.sum(), x.sum(), float(acc[0]), acc[0] > 0, x.shape[0]


    def inputs(rng):
        return rng.standard_normal(200), rng.standard_normal(200)
    """


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("kinds")
    run = optimize_text(tmp_path, "kinds", KINDS, ["numpy", "numba"])
    return run, tmp_path


# each call's outputs described as `type:dtype` (a Python number by its type), the original's beside the optimized
# call's, on one line per input kind; each kind called twice (the first call of a new dtype may be the original's)
# and on two shapes
CALL_KINDS = LOAD_OPTIMIZED + '''
import numpy as np

original = opt.load_workload("_mine").original
rng = np.random.default_rng(5)


def describe(out):
    return " ".join(f"{type(v).__name__}:{getattr(v, 'dtype', '-')}" for v in out)


def close(a, b):
    return all(np.allclose(np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64), rtol=1e-4, atol=1e-5)
               for p, q in zip(a, b))


def make(kind, n):
    if kind.startswith("int"):
        return rng.integers(-9, 9, n).astype(kind), rng.integers(-9, 9, n).astype(kind)
    if kind == "mixed":
        return rng.standard_normal(n).astype(np.float32), rng.standard_normal(n)
    if kind == "strided":
        return rng.standard_normal(3 * n)[::3], rng.standard_normal((n, 2))[:, 1]
    return rng.standard_normal(n).astype(kind), rng.standard_normal(n).astype(kind)


for kind in ("float64", "float32", "int64", "int32", "mixed", "strided"):
    for n in (37, 64, 64):
        x, w = make(kind, n)
        ref = original(x.copy(), w.copy())
        out = fn(x, w)
        print(kind, n, describe(ref) == describe(out), close(ref, out), "|", describe(ref), "|", describe(out))
'''


def _lines(tmp_path, script, text=CALL_KINDS):
    p = tmp_path / "use_it.py"
    p.write_text(text)
    r = subprocess.run([sys.executable, str(p), str(script)], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.splitlines()


def _mismatches(lines):
    return [line for line in lines if not line.split()[2:4] == ["True", "True"]]


def test_a_float32_primary_returns_the_originals_dtypes_for_integer_and_mixed_inputs(kinds):
    """The float32 primary (its np.zeros made float32) returned float32 where the original returns float64 for
    integer inputs (the cast back applied only to floating-point inputs), and the run's float64 dtypes for a mix of
    float32 and float64 arrays, whatever the original returns on those. Each call now returns the original's dtypes
    for its own inputs: float64 and float32 as the run found them, other dtypes as the original returned them."""
    run, tmp_path = kinds
    assert run.results["numpy-fp32"]["status"] == "ok", run.results["numpy-fp32"].get("reason")
    lines = _lines(tmp_path, rewrite(run, "numpy-fp32"))
    assert len(lines) == 18 and not _mismatches(lines), "\n".join(lines)


def test_a_numba_primary_returns_numpy_scalars_where_the_original_does(kinds):
    """Numba hands back a Python float for acc.sum() (np.float64 from the original, np.float32 for float32 inputs),
    a Python bool for acc[0] > 0 (np.bool_) and a Python int for an int64 sum: a caller's r.dtype or r.item() failed,
    and a float32 sum became a strong float64 in later arithmetic. Each comes back as the original's NumPy scalar."""
    run, tmp_path = kinds
    assert run.results["numba"]["status"] == "ok", run.results["numba"].get("reason")
    lines = _lines(tmp_path, rewrite(run, "numba"))
    assert len(lines) == 18 and not _mismatches(lines), "\n".join(lines)
    first = lines[0].split("|")
    assert first[1].split() == ["ndarray:float64", "float64:float64", "float64:float64", "float:-", "bool:bool",
                                "int:-"], lines[0]


def test_the_script_holds_the_originals_output_form_for_the_runs_dtypes_and_the_other_precision(kinds):
    """The emitted script knows what the original returns on the run's inputs and on those in float32 (one call of
    the original each, at emit), so neither is answered by the original in the script."""
    run, _ = kinds
    script = rewrite(run, "numba").read_text()
    forms = script.split("\nOUT_FORMS = ", 1)[1].split("\n}\n", 1)[0] + "\n}"
    import ast

    forms = ast.literal_eval(forms)
    assert forms[(("ndarray:float64", 2),)][0] == ("array:float64", "scalar:float64", "scalar:float64", "python:float",
                                                   "scalar:bool", "python:int")
    assert forms[(("ndarray:float32", 2),)][0][2] == "scalar:float32"


RETURNS_INPUT = """
    import numpy as np

    TOLERANCE = dict(rtol=1e-4, atol=1e-5)  # loose enough for the float32 candidate


    def original(x, w, *, scale=1.0):
        y = np.zeros(x.shape)  # float32 under the float32 candidate
        y += x * w * scale
        return {"x": x, "y": y, "same": [y, y], "parts": [p.sum() for p in np.array_split(y, len(y) // 25)]}


    def inputs(rng):
        return rng.standard_normal(200), rng.standard_normal(200) + 2.0
    """


@pytest.fixture(scope="module")
def returns_input(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("returns_input")
    run = optimize_text(tmp_path, "passthrough", RETURNS_INPUT, ["numpy"])
    return run, tmp_path


CALL_RETURNS_INPUT = LOAD_OPTIMIZED + '''
import numpy as np

original = opt.load_workload("_mine").original
rng = np.random.default_rng(9)
x, w = rng.standard_normal(50), rng.standard_normal(50) + 2.0
r = fn(x, w)
print("x", r["x"] is x, bool(np.array_equal(r["x"], x)), r["x"].dtype)
print("twice", r["same"][0] is r["same"][1], r["same"][0] is r["y"], type(r["same"]).__name__, list(r))
print("parts", len(r["parts"]), {type(v).__name__ for v in r["parts"]})  # 2 here, 8 on the run's inputs
r2 = fn(x, w, scale=3.0)  # scale is keyword-only: the call is the original's, as written (float64)
ref = original(x, w, scale=3.0)
print("keyword", r2["y"].dtype, bool(np.array_equal(r2["y"], ref["y"])))
'''


def test_the_optimized_call_hands_back_an_argument_the_original_returns_unchanged(returns_input):
    """`return {"x": x, ...}`, x only read: the float32 primary returned a float32 copy of x cast back (x is not the
    caller's array, and its values rounded to float32); `[y, y]` came back as two arrays. The caller's own x comes
    back, and one array twice."""
    run, tmp_path = returns_input
    assert run.results["numpy-fp32"]["status"] == "ok", run.results["numpy-fp32"].get("reason")
    lines = _lines(tmp_path, rewrite(run, "numpy-fp32"), CALL_RETURNS_INPUT)
    assert "x True True float64" in lines, lines
    assert "twice True True list ['x', 'y', 'same', 'parts']" in lines, lines
    assert "parts 2 {'float64'}" in lines, lines  # a list as long as the call makes it, each of the original's kind


def test_a_keyword_only_call_gets_the_original_as_written(returns_input):
    """A call giving a keyword-only argument is the original's: it ran the original of the module the float32
    primary was built from, whose np.zeros the build had made float32 (float32 results, rounded, from 'the original')."""
    run, tmp_path = returns_input
    lines = _lines(tmp_path, rewrite(run, "numpy-fp32"), CALL_RETURNS_INPUT)
    assert "keyword float64 True" in lines, lines


TORCH = """
    import torch

    TOLERANCE = dict(rtol=1e-4, atol=1e-5)


    def original(x, w):
        h = x * w
        return {"h": h, "x2": x * 2, "s": h.sum(), "f": h.sum().item(), "n": int(h.shape[0])}, [x, h]


    def inputs(rng):
        gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
        return torch.randn(64, generator=gen, dtype=torch.float64), torch.randn(64, generator=gen, dtype=torch.float64)
    """

CALL_TORCH = LOAD_OPTIMIZED + '''
import torch
from gpuspeed.optimize.backends.common import leaves

original = opt.load_workload("_mine").original
gen = torch.Generator().manual_seed(3)


def describe(out):
    return " ".join(f"{type(v).__name__}:{str(getattr(v, 'dtype', '-')).replace('torch.', '')}:"
                    f"{tuple(getattr(v, 'shape', ()))}" for v in leaves(out))


for kind in ("float64", "float32", "int64", "mixed", "strided"):
    for n in (20, 33):
        if kind == "int64":
            x, w = torch.randint(-9, 9, (n,), generator=gen), torch.randint(-9, 9, (n,), generator=gen)
        elif kind == "mixed":  # the original returns x * 2 in float32, h in float64
            x, w = torch.randn(n, generator=gen), torch.randn(n, generator=gen, dtype=torch.float64)
        elif kind == "strided":
            x, w = torch.randn(2 * n, generator=gen, dtype=torch.float64)[::2], torch.randn(n, 3, generator=gen,
                                                                                            dtype=torch.float64)[:, 1]
        else:
            x, w = (torch.randn(n, generator=gen, dtype=getattr(torch, kind)) for _ in range(2))
        ref = original(x.clone(), w.clone())
        fn(x, w)
        out = fn(x, w)
        same = describe(ref) == describe(out) and all(torch.allclose(torch.as_tensor(a, dtype=torch.float64),
                                                                     torch.as_tensor(b, dtype=torch.float64),
                                                                     rtol=1e-4, atol=1e-5)
                                                      for a, b in zip(leaves(ref), leaves(out)))
        print(kind, n, same, out[1][0] is x, out[1][1] is out[0]["h"], "|", describe(ref), "|", describe(out))
print("check", opt.check_against_original(fn))
'''


def test_a_pytorch_float32_primary_returns_what_the_pytorch_original_returns(tmp_path):
    """A PyTorch original's float32 primary (eager torch on the CPU here): x * 2 on float32 x beside float64 w came
    back float64 (the run's float64 inputs' dtype, where the original returns float32), the caller's x in the result a
    float32 round trip of it (not x), and h twice two tensors. Each now comes back as from the original."""
    pytest.importorskip("torch")
    from gpuspeed.optimize import emit, workload

    p = tmp_path / "tmix.py"
    p.write_text(textwrap.dedent(TORCH))
    wl = workload.load(p, gpu=False)
    rec = {"name": "t32", "backend": "torch", "precision": "float32", "mode": "eager", "device": "cpu"}
    row = {"name": "t32", "recipe": rec, "status": "ok", "label": "torch fp32", "device_time": {"median": 1e-3}}
    run = types.SimpleNamespace(wl=wl, where="cpu", out_dir=tmp_path, params={"seeds": [1, 2, 3]},
                                choice={"primary": "t32"}, results={"t32": row, "original": row})
    script = tmp_path / "optimized_tmix.py"
    script.write_text(emit.script_text(run))
    lines = _lines(tmp_path, script, CALL_TORCH)
    calls = [line for line in lines if line.split()[0] in ("float64", "float32", "int64", "mixed", "strided")]
    assert len(calls) == 10 and all(line.split()[2:5] == ["True"] * 3 for line in calls), "\n".join(lines)
    assert "check True" in lines and any(line.startswith("correctness: PASS") for line in lines), lines


CALL_FALLBACK = LOAD_OPTIMIZED + '''
import numpy as np

original = opt.load_workload("_mine").original
rng = np.random.default_rng(2)
print(how)
for dtype in ("float64", "float32", "int64"):
    x, w = (rng.standard_normal(40) * 5).astype(dtype), (rng.standard_normal(40) * 5).astype(dtype)
    ref, out = original(x, w), fn(x, w)
    print(dtype, all(type(a) is type(b) and np.array_equal(a, b) for a, b in zip(ref, out)))
'''


def test_a_gpu_primary_falls_back_to_the_original_exactly_without_a_gpu(kinds):
    """A CuPy primary's script on a machine without a GPU runs the original, as written: the same values and types
    as the original's, for float64, float32 and integer inputs."""
    run, tmp_path = kinds
    rec = {"name": "cupy-fp32", "backend": "cupy", "precision": "float32"}
    run.results["cupy-fp32"] = {"name": "cupy-fp32", "recipe": rec, "status": "ok", "label": "CuPy (float32)",
                                "device_time": {"median": 1e-4}}
    try:
        lines = _lines(tmp_path, rewrite(run, "cupy-fp32"), CALL_FALLBACK)
    finally:
        del run.results["cupy-fp32"]
    assert lines == ["the original on the CPU (no GPU)", "float64 True", "float32 True", "int64 True"], lines


def test_the_script_skips_its_calls_of_a_slow_original(kinds, monkeypatch):
    """The emitted script's extra calls of the original (its output's form on the run's inputs and in the other
    precision) are to be skipped where its reference calls took long: the run never recorded how long they took,
    so an original taking minutes was called again at emit, whatever OTHER_PRECISION_MAX_S said."""
    from gpuspeed.optimize import emit

    run, _ = kinds
    assert run.params["reference_s"] > 0
    calls = []
    original = run.wl.original

    def counted(*args):
        calls.append(1)
        return original(*args)

    monkeypatch.setattr(run.wl, "original", counted)
    run.choice = {"primary": "numba"}
    emit.script_text(run)
    assert len(calls) == 2  # the run's inputs, and in float32
    calls.clear()
    monkeypatch.setattr(emit, "OTHER_PRECISION_MAX_S", run.params["reference_s"] / 2)
    text = emit.script_text(run)
    assert not calls
    forms = text.split("\nOUT_FORMS = ", 1)[1].split("\n}\n", 1)[0]
    assert "(('ndarray:float64', 2),): [('array:float64'" in forms  # read off the run's references
    assert "(('ndarray:float32', 2),): None," in forms  # as computed


@pytest.mark.parametrize("text, args, message", [
    ("import numpy as np\ndef original(x):\n    return x, None\ndef inputs(rng):\n    return (rng.random(4),)\n",
     [], "returned a NoneType"),
    ("def original(x):\n    return x * 2\n", ["--input", "x=float64[3]", "--input", "x=float64[4]"], "given twice"),
    ("def original(x):\n    return x * 2\n", ["--input", "x=float64[3]", "--time-budget", "nan"], "--time-budget"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, text, args, message):
    from gpuspeed.cli import main

    p = tmp_path / "bad_wl.py"
    p.write_text(text)
    rc = main(["optimize", str(p), "--device", "cpu", "--out", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("gpuspeed: error:") and err.count("\n") == 1 and message in err, repr(err)


def test_resume_refuses_a_run_begun_on_another_device(tmp_path):
    # --resume reuses the finished candidates' timings: a run folder begun on another machine (an H200's resumed on
    # an H100, or copied to another CPU) would mix that device's times into this one's ranking
    import json

    from gpuspeed.errors import UserError
    from gpuspeed.optimize import optimize

    text = """
        import numpy as np

        def original(x):
            return np.sin(x) * 2.0 + x

        def inputs(rng):
            return (rng.standard_normal(500),)
        """
    run = optimize_text(tmp_path, "elsewhere", text, ["numpy"])
    run_file = run.out_dir / "run.json"
    saved = json.loads(run_file.read_text())
    assert saved["device_name"]  # the machine's device, by name, beside 'cpu' / 'cuda'
    run_file.write_text(json.dumps(saved | {"device_name": "NVIDIA H200"}))
    with pytest.raises(UserError, match=r"device_name 'NVIDIA H200' there, '.+' now"):
        optimize(run.wl.path, device="cpu", out=run.out_dir, backends=["numpy"], time_budget=180,
                 bench_budget_s=0.05, resume=True)
