"""gpuspeed optimize and its optimized_<name>.py as a Python developer with slow NumPy/PyTorch code uses them (QA pass
11), CPU only: small real runs (--device cpu, a short bench budget, few backends) and the emitted script run or
imported from another folder."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from optimize_script_helpers import LOAD_OPTIMIZED, optimize_text, rewrite


def _module(tmp_path, name, text):
    """The workload file, imported as a module of its own."""
    from gpuspeed.optimize.workload import import_workload

    p = tmp_path / f"{name}.py"
    p.write_text(textwrap.dedent(text))
    return import_workload(p, unique=True)


def test_a_numba_candidate_adds_no_lookups_of_numbas_lazy_names_per_call(tmp_path, monkeypatch):
    """numba.typed resolves Dict and List through a module __getattr__ that runs importlib.import_module on each access:
    the Numba candidate's fetch looked both up for every leaf of every call (~14 us a call: the emitted script timed a
    1 us function at 17 us, 0.10x the original, where the run had measured 1.45x)."""
    pytest.importorskip("numba")
    import numba.typed

    from gpuspeed.optimize.backends import numba_cpu

    module = _module(tmp_path, "tiny", """
        import numpy as np

        def original(x, s):
            return x.sum() * s, (np.abs(x) + s, x[:2])
        """)
    impl = numba_cpu.build(module)
    rng = np.random.default_rng(7)
    x, s = rng.standard_normal(16), float(rng.standard_normal())
    first = impl(x, s)  # compiles
    assert np.isclose(first[0], x.sum() * s)
    looked = []
    lazy = numba.typed.__getattr__

    def counting(name):
        looked.append(name)
        return lazy(name)

    monkeypatch.setattr(numba.typed, "__getattr__", counting)
    for _ in range(5):
        out = impl(x, s)
    assert looked == []
    assert np.allclose(out[1][0], np.abs(x) + s) and np.array_equal(out[1][1], x[:2])


TORCH_INPUTS = """
    import numpy as np

    def original(x, s, r):
        return np.cumsum(x) * s + r.sum(), s * 2.0

    def fast(x, s, r):  # takes torch tensors
        import torch

        return torch.cumsum(x, 0) * s + r.sum(), s * 2.0

    fast.gpuspeed_inputs = "torch"
    variants = {"fast": fast}
    """


def _odd_args(rng):
    """A reversed view, a 0-d array and a Fortran-ordered slice: arrays a user hands over as they are."""
    return (rng.standard_normal(40)[::-1], np.array(rng.standard_normal()),
            np.asfortranarray(rng.standard_normal((6, 5)))[:, 1:4])


def test_torch_inputs_keep_the_callers_shapes_and_take_reversed_views(tmp_path):
    """A variant taking torch inputs got a 0-d argument as a 1-element 1-d tensor (np.ascontiguousarray makes 0-d
    arrays 1-d), so its s * 2.0 came back shape (1,) and the variant was 'WRONG shape'; torch.compile's drop-in refused
    a reversed view (x[::-1]) with torch's 'At least one stride in the given numpy array is negative'."""
    pytest.importorskip("torch")
    from gpuspeed.optimize.backends import torch_compile, variant

    module = _module(tmp_path, "odd", TORCH_INPUTS)
    args = _odd_args(np.random.default_rng(11))
    want = module.original(*args)
    v = variant.build(module, variant="fast", device="cpu")
    assert [tuple(t.shape) for t in v.prepare(args)] == [a.shape for a in args]
    got = v(*args)
    assert got[1].shape == () and np.allclose(got[0], want[0]) and np.isclose(got[1], want[1])
    c = torch_compile.build(_module(tmp_path, "odd2", TORCH_INPUTS), device="cpu", compile_backend="eager")
    moved = c.prepare(args)
    assert [tuple(t.shape) for t in moved] == [a.shape for a in args]
    assert all(np.array_equal(t.numpy(), a) for t, a in zip(moved, args, strict=True))
    got = c(*args)
    assert np.allclose(got[0], want[0]) and np.isclose(got[1], want[1])


def _python(folder, code, *argv):
    """A user's own script, run from another folder than the run's."""
    folder.mkdir(exist_ok=True)
    p = folder / "use.py"
    p.write_text(textwrap.dedent(code))
    r = subprocess.run([sys.executable, str(p), *map(str, argv)], capture_output=True, text=True, cwd=folder,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout, r.stderr


GAUSS = """
    import numpy as np

    TOLERANCE = dict(rtol=1e-5, atol=1e-8)


    def original(x, *, width=1.5):
        return np.exp(-x * x / width).sum(axis=1)


    def inputs(rng):
        return (rng.standard_normal((300, 64)),)
    """


@pytest.fixture(scope="module")
def gauss(tmp_path_factory):
    """One run of a float64 workload whose float32 candidate passes."""
    tmp_path = tmp_path_factory.mktemp("gauss")
    run = optimize_text(tmp_path, "gauss", GAUSS, ["numpy"])
    assert run.results["numpy-fp32"]["status"] == "ok", run.results["numpy-fp32"].get("reason")
    return run, tmp_path


CALL_WITH = '''
import importlib.util
import sys
import warnings

import numpy as np

warnings.simplefilter("error")  # a ComplexWarning (an imaginary part dropped) fails the call
spec = importlib.util.spec_from_file_location("optimized", sys.argv[1])
opt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(opt)
fn, how = opt.build_optimized()
original = opt.load_workload("_mine").original
rng = np.random.default_rng(5)
x = rng.standard_normal((7, 5))
for name, arg in (("complex128", x + 1j * rng.standard_normal((7, 5))), ("int64", rng.integers(-2, 3, (7, 5))),
                  ("float64", x), ("float32", x.astype(np.float32))):
    out, ref = fn(arg), original(arg)
    print(name, out.dtype, ref.dtype, bool(np.allclose(out, ref, rtol=1e-4, atol=1e-6)))
'''


def test_the_float32_primary_called_on_complex_or_integer_inputs_returns_the_originals_answer(gauss):
    """Called from the user's own code on complex128 inputs, the float32 primary cast its complex result to the float64
    the run's outputs had: the imaginary part was dropped (a ComplexWarning, and wrong values); on integer inputs
    (nothing to demote, the original returns float64) it cast the result to float32."""
    run, tmp_path = gauss
    script = rewrite(run, "numpy-fp32")
    out, _ = _python(tmp_path / "elsewhere", CALL_WITH, script)
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
    assert lines["complex128"] == ["complex128", "complex128", "True"], out
    assert lines["int64"] == ["float64", "float64", "True"], out
    assert lines["float64"] == ["float64", "float64", "True"], out
    assert lines["float32"] == ["float32", "float32", "True"], out


SCALARS = """
    import numpy as np


    def original(x):  # its sum made in float32 (a Python float made in float64 is held to float64's rtol: qa21)
        return float(x.astype(np.float32).sum()), int((x > 0).sum()), x * 2.0


    def single(x):  # its sum in float32, its count as an int32: numbers as the original's Python float and int are
        return np.float32(x.astype(np.float32).sum()), np.int32((x > 0).sum()), x * 2.0


    def miscounts(x):
        return float(x.sum()), np.float64((x > 0).sum()) + 0.5, x * 2.0


    variants = {"single": single, "miscounts": miscounts}


    def inputs(rng):
        return (rng.standard_normal(1000),)
    """


def test_the_scripts_check_holds_python_number_outputs_to_the_runs_rule(tmp_path):
    """The original returns a Python float and a Python int: gpuspeed.check holds them to a number's tolerance, not a
    dtype (a Python float says nothing of the precision that made it), and the run found a variant returning an
    np.float32 and an np.int32 correct; the emitted script's own check failed it ('float32[] against the original's
    float64[]'), so `python optimized_x.py` said correctness: FAIL and exited 1 for the primary the run had verified.
    A float where the original returns an int still fails there, as in the run."""
    run = optimize_text(tmp_path, "scalars", SCALARS, ["variant"])
    assert run.results["variant:single"]["status"] == "ok", run.results["variant:single"].get("reason")
    assert run.results["variant:miscounts"]["status"] == "wrong_output"
    for primary, rc in (("variant:single", 0), ("variant:miscounts", 1)):
        script = rewrite(run, primary)
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path.parent,
                           timeout=120)
        assert r.returncode == rc, (primary, r.stdout + r.stderr)
        assert ("correctness: PASS" if rc == 0 else "correctness: FAIL") in r.stdout, r.stdout


TORCH_DICT = """
    import torch


    def original(x, idx):
        y = torch.relu(x) * 2.0 + 1.0
        return {"y": y, "mask": y > 2.0, "counts": torch.bincount(idx, minlength=8), "corner": y[0, 0],
                "n": int((y > 2.0).sum())}


    def fused(x, idx):  # the same on the same tensors
        y = torch.relu(x).mul_(2.0).add_(1.0)
        return {"y": y, "mask": y > 2.0, "counts": torch.bincount(idx, minlength=8), "corner": y[0, 0],
                "n": int((y > 2.0).sum())}


    variants = {"fused": fused}


    def inputs(rng):
        return torch.from_numpy(rng.standard_normal((64, 48))), torch.from_numpy(rng.integers(0, 8, 100))
    """

CALL_TORCH = LOAD_OPTIMIZED + '''
import torch

original = opt.load_workload("_mine").original
x, idx = torch.randn(5, 3, dtype=torch.float64), torch.randint(0, 8, (20,))
out, ref = fn(x, idx), original(x, idx)
for k in ref:
    print(k, type(out[k]).__name__, type(ref[k]).__name__, str(getattr(out[k], "dtype", "-")),
          str(getattr(ref[k], "dtype", "-")), bool(torch.equal(torch.as_tensor(out[k]), torch.as_tensor(ref[k]))))
'''


@pytest.fixture(scope="module")
def torch_dict(tmp_path_factory):
    pytest.importorskip("torch")
    tmp_path = tmp_path_factory.mktemp("torch_dict")
    run = optimize_text(tmp_path, "tdict", TORCH_DICT, ["variant"])
    assert run.results["variant:fused"]["status"] == "ok", run.results["variant:fused"].get("reason")
    # what the run writes when PyTorch's own candidate wins (eager on the CPU here: no compile, the same code path)
    run.results["torch-cpu"] = dict(run.results["variant:fused"], name="torch-cpu", label="PyTorch on cpu (eager)",
                                    recipe={"name": "torch-cpu", "backend": "torch", "precision": "as-written",
                                            "mode": "eager", "device": "cpu"})
    return run, tmp_path


@pytest.mark.parametrize("primary", ["torch-cpu", "variant:fused"])
def test_the_optimized_function_of_a_torch_original_returns_tensors_as_the_original_does(torch_dict, primary):
    """The original takes and returns torch tensors; the optimized function handed back NumPy arrays (np.ndarray for
    a tensor, np.float64 for a 0-d one): a drop-in for PyTorch code that broke .to(), .backward() and torch ops on
    its results, and only where it ran (the CPU fallback, the original itself, returned tensors)."""
    run, tmp_path = torch_dict
    script = rewrite(run, primary)
    out, _ = _python(tmp_path / f"elsewhere_{primary.replace(':', '_')}", CALL_TORCH, script)
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
    assert rows["y"] == ["Tensor", "Tensor", "torch.float64", "torch.float64", "True"], out
    assert rows["mask"] == ["Tensor", "Tensor", "torch.bool", "torch.bool", "True"], out
    assert rows["counts"] == ["Tensor", "Tensor", "torch.int64", "torch.int64", "True"], out
    assert rows["corner"] == ["Tensor", "Tensor", "torch.float64", "torch.float64", "True"], out
    assert rows["n"] == ["int", "int", "-", "-", "True"], out


def test_a_rerun_interrupted_in_the_same_folder_leaves_none_of_the_last_runs_results_beside_its_own(gauss, tmp_path):
    """A second run in the same --out, stopped (Ctrl-C) while its candidates ran, removed the last run's report.md but
    left its optimize_<name>.json (the results the README and notebooks read), its plot and optimized_<name>.py beside
    the new run's candidates: results of the old code, looking like this run's."""
    import shutil

    from gpuspeed.optimize.pipeline import optimize

    first, _ = gauss
    out = tmp_path / "out"
    shutil.copytree(first.out_dir, out)  # a finished run's folder
    made = {p.name for p in out.iterdir()}
    assert {"report.md", "optimize_gauss.json", "optimize_gauss.png", "optimized_gauss.py"} <= made, made

    def stop(label, done, total):
        if label.startswith("candidate"):
            raise KeyboardInterrupt  # Ctrl-C as the first candidate starts

    (tmp_path / "gauss.py").write_text(textwrap.dedent(GAUSS).replace("x * x", "x * x + 1.0"))  # the code changed
    with pytest.raises(KeyboardInterrupt):
        optimize(tmp_path / "gauss.py", device="cpu", out=out, backends=["numpy"], time_budget=180, bench_budget_s=0.05,
                 progress=stop)
    left = {p.name for p in out.iterdir()}
    assert not left & {"report.md", "optimize_gauss.json", "optimize_gauss.png", "optimized_gauss.py"}, left
    assert {"run.json", "refs.pkl", "candidates.jsonl"} <= left, left  # what --resume continues from


CALL_BY_KEYWORD = LOAD_OPTIMIZED + '''
import numpy as np

original = opt.load_workload("_mine").original
x = np.random.default_rng(3).standard_normal((9, 4))
for name, kwargs in (("by_name", {}), ("width", {"width": 0.5})):
    out, ref = fn(x=x, **kwargs), original(x=x, **kwargs)
    print(name, out.dtype, bool(np.allclose(out, ref, rtol=1e-5)))
try:
    fn(x, y=x)
except TypeError as exc:  # as the original: an argument it does not take
    print("unknown", "TypeError", str(exc).split(":")[0] if ":" in str(exc) else str(exc))
print("device", opt.timing_device(fn), "label", getattr(getattr(fn, "impl", fn), "label", "?").replace(" ", "_"))
'''


def test_the_optimized_function_takes_its_arguments_by_keyword_as_the_original_does(gauss):
    """original(x, *, width=1.5): a caller writing fn(x=x) got "Impl.__call__() got an unexpected keyword argument 'x'"
    (the optimized function took positions only); one giving width=0.5 (a keyword-only argument the run never passed,
    and the candidates cannot take) got the same TypeError: it now gets the original's answer for it."""
    run, tmp_path = gauss
    script = rewrite(run, "numpy-fp32")
    out, _ = _python(tmp_path / "keywords", CALL_BY_KEYWORD, script)
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
    assert rows["by_name"] == ["float64", "True"], out
    assert rows["width"] == ["float64", "True"], out
    assert rows["unknown"][0] == "TypeError", out
    assert rows["device"] == ["cpu", "label", "NumPy_(float32)_on_the_CPU"], out


# --- the torch backends leave the caller's process settings as they were

TORCH_MATMUL = '''
import torch


def original(a, b):
    return torch.tanh(a @ b) + torch.ones(a.shape[0], b.shape[1], dtype=a.dtype)  # makes a tensor of its own


def inputs(rng):
    return torch.from_numpy(rng.standard_normal((8, 5))), torch.from_numpy(rng.standard_normal((5, 3)))
'''


@pytest.mark.parametrize("backend", ["torch_native", "torch_compile"])
def test_building_a_torch_candidate_changes_no_setting_of_the_callers_process(tmp_path, backend):
    # the emitted script builds its primary in the user's own process: build() set torch's default device for the
    # whole thread (the user's later torch.zeros() landed on the GPU) and TF32 for every matmul the user ran after
    import importlib

    import torch

    mod = importlib.import_module(f"gpuspeed.optimize.backends.{backend}")
    module = _module(tmp_path, f"tm_{backend}", TORCH_MATMUL if backend == "torch_native" else TORCH_MATMUL.replace(
        "torch.from_numpy(", "(").replace("torch.tanh(", "__import__('numpy').tanh(").replace(
        "torch.ones(a.shape[0], b.shape[1], dtype=a.dtype)", "__import__('numpy').ones((a.shape[0], b.shape[1]))"))
    before = (torch.get_default_device(), torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
              torch._dynamo.config.numpy_default_float)
    kw = {"compile_backend": "eager"} if backend == "torch_compile" else {}
    impl = mod.build(module, precision="tf32", device="meta" if backend == "torch_native" else "cpu", **kw)
    rng = np.random.default_rng()
    args = module.inputs(rng)
    out = impl.run(*impl.prepare(args))
    if backend == "torch_native":  # its own tensors were made where it runs (the default device, inside the call)
        assert out.device.type == "meta"
    after = (torch.get_default_device(), torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch._dynamo.config.numpy_default_float)
    assert after == before, (before, after)
    assert torch.zeros(2).device.type == "cpu"


@pytest.mark.gpu
def test_a_torch_candidate_on_the_gpu_makes_its_tensors_there_and_leaves_the_callers_default(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from gpuspeed.optimize.backends import torch_native

    module = _module(tmp_path, "tm_gpu", TORCH_MATMUL)
    impl = torch_native.build(module, precision="tf32", device="cuda")
    args = module.inputs(np.random.default_rng())
    out = impl.run(*impl.prepare(args))
    assert out.device.type == "cuda"  # torch.ones() inside the call was made on the GPU (else: a device mismatch)
    assert torch.get_default_device().type == "cpu" and not torch.backends.cuda.matmul.allow_tf32
    want = (torch.tanh(args[0] @ args[1]) + 1).to(torch.float64)
    assert torch.allclose(impl.fetch(out) if not isinstance(impl.fetch(out), np.ndarray) else
                          torch.from_numpy(impl.fetch(out)), want, rtol=1e-12, atol=1e-12)


# --- a chunked primary of a PyTorch original returns tensors too

TORCH_ROWS = '''
import torch

TOLERANCE = dict(rtol=1e-9, atol=1e-12)


def original(x):
    return torch.tanh(x) * 2.0


def rows(x):
    return 2.0 * torch.tanh(x)


rows.gpuspeed_inputs = "torch"
variants = {"rows": rows}
BATCH_AXIS = {0: 0}


def inputs(rng):
    return (torch.from_numpy(rng.standard_normal((40, 6))),)
'''

CALL_ROWS = LOAD_OPTIMIZED + '''
import torch

x = torch.randn(9, 6, dtype=torch.float64)
out = fn(x)
print(type(out).__name__, str(out.dtype), bool(torch.equal(out, torch.tanh(x) * 2.0)), "chunked" in how)
'''


def test_a_chunked_primary_of_a_torch_original_returns_tensors(tmp_path):
    # the chunk pipeline assembles NumPy arrays: a chunked primary (an over-budget run on a GPU) of a PyTorch original
    # handed its caller NumPy where the original returns tensors
    pytest.importorskip("torch")
    run = optimize_text(tmp_path, "trows", TORCH_ROWS, ["variant"])
    row = run.results["variant:rows"]
    assert row["status"] == "ok", row.get("reason")
    row["recipe"] = dict(row["recipe"], chunk={"axes": {0: 0}, "out_axes": [0]})  # what an over-budget run records
    row["chunk_size"] = 4
    script = rewrite(run, "variant:rows")
    out, _ = _python(tmp_path / "elsewhere", CALL_ROWS, script)
    assert out.split() == ["Tensor", "torch.float64", "True", "True"], out
