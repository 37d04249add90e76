"""optimize on code that returns None and writes its result into its arguments (`out=`-style functions, a
time step that updates its state): what it writes is the output every candidate is checked on, and the
emitted script writes into the caller's arrays as the original does."""

import importlib.util
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

from gpuspeed.optimize import candidates as C, workload
from gpuspeed.optimize.backends.common import Impl, in_place_call, returning_args, write_back
from gpuspeed.optimize.pipeline import optimize

HEAT = '''
import numpy as np

TOLERANCE = dict(rtol=1e-4, atol=1e-5)  # loose enough for the float32 candidates


def original(u, out, alpha):
    """One explicit heat step of u, written into the caller's `out`."""
    out[:] = u
    out[1:-1, 1:-1] = u[1:-1, 1:-1] + alpha * (u[2:, 1:-1] + u[:-2, 1:-1] + u[1:-1, 2:] + u[1:-1, :-2]
                                                 - 4 * u[1:-1, 1:-1])


def inputs(rng):
    return rng.standard_normal((37, 41)), np.full((37, 41), 7.0), 0.1


def writes(u, out, alpha):
    np.copyto(out, u)
    out[1:-1, 1:-1] += alpha * (u[2:, 1:-1] + u[:-2, 1:-1] + u[1:-1, 2:] + u[1:-1, :-2] - 4 * u[1:-1, 1:-1])


def returns_instead(u, out, alpha):
    res = u.copy()
    res[1:-1, 1:-1] += alpha * (u[2:, 1:-1] + u[:-2, 1:-1] + u[1:-1, 2:] + u[1:-1, :-2] - 4 * u[1:-1, 1:-1])
    return res


def writes_the_input(u, out, alpha):
    writes(u.copy(), u, alpha)


def misses_the_border(u, out, alpha):
    out[1:-1, 1:-1] = u[1:-1, 1:-1] + alpha * (u[2:, 1:-1] + u[:-2, 1:-1] + u[1:-1, 2:] + u[1:-1, :-2]
                                                 - 4 * u[1:-1, 1:-1])


variants = {"writes": writes, "returns_instead": returns_instead, "writes_the_input": writes_the_input,
            "misses_the_border": misses_the_border}
'''


def _heat(tmp_path):
    p = tmp_path / "heat_step.py"
    p.write_text(textwrap.dedent(HEAT))
    return p


def test_in_place_original_is_checked_on_what_it_writes(tmp_path):
    p = _heat(tmp_path)
    run = optimize(p, device="cpu", out=tmp_path / "out", backends=["variant", "numpy"], time_budget=120,
                   bench_budget_s=0.1)
    assert run.params["in_place"] == [1]
    assert any("writes its result into `out` (argument 1)" in n for n in run.notes), run.notes
    status = {name: r["status"] for name, r in run.results.items()}
    assert status["original"] == "ok" and status["variant:writes"] == "ok"
    # the float32 copy is written, cast back and checked against the float64 original's `out`
    assert status["numpy-fp32"] == "ok", run.results["numpy-fp32"].get("reason")
    # a returned result is not a written one; writing another argument, or leaving the border as it was, is wrong
    for bad in ("returns_instead", "writes_the_input", "misses_the_border"):
        assert status[f"variant:{bad}"] == "incorrect", (bad, run.results[f"variant:{bad}"].get("reason"))
    md = (tmp_path / "out" / "report.md").read_text()
    assert "- Output: `original` returns None and writes its result into `out` (argument 1)" in md
    script = tmp_path / "out" / "optimized_heat_step.py"
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "correctness: PASS" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("backend, precision, extra", [("numpy", "float32", {}),
                                                       ("variant", "as-written", {"variant": "writes"})])
def test_emitted_script_writes_into_the_callers_arrays(tmp_path, backend, precision, extra):
    """The script's optimized function keeps the original's contract: it returns None and the caller's `out`
    (float64 here, however the candidate computed) holds the result; its own check compares what was written."""
    from gpuspeed.optimize import emit

    p = _heat(tmp_path)
    wl = workload.load(p, gpu=False)
    rec = {"name": "c", "backend": backend, "precision": precision} | extra
    row = {"name": "c", "recipe": rec, "status": "ok", "label": "x", "device_time": {"median": 1e-3}}
    run = types.SimpleNamespace(wl=wl, where="cpu", out_dir=tmp_path, params={"seeds": [1, 2, 3], "in_place": [1]},
                                choice={"primary": "c"}, results={"c": row, "original": row})
    script = tmp_path / "optimized_heat_step.py"
    script.write_text(emit.script_text(run))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "correctness: PASS" in r.stdout, r.stdout + r.stderr

    spec = importlib.util.spec_from_file_location("optimized_heat_step_t", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fn, how = mod.build_optimized()
    rng = np.random.default_rng(5)
    u = rng.standard_normal((37, 41))
    out, ref = np.full_like(u, np.nan), np.full_like(u, np.nan)
    assert fn(u, out, 0.1) is None
    wl.original(u, ref, 0.1)
    assert out.dtype == np.float64 and np.allclose(out, ref, rtol=1e-4, atol=1e-5) and not np.isnan(out).any()


def test_in_place_call_copies_back_and_casts():
    """A candidate that computes on float32 copies: the caller's float64 array gets the values, its own
    object untouched otherwise; an argument the candidate shares with the caller is not copied onto itself."""
    def prepare(args):
        return (args[0].astype(np.float32), args[1])

    def run(out32, scale):
        out32 *= scale

    impl = Impl(run, prepare, label="float32 copy")
    x = np.arange(5, dtype=np.float64) + 0.5
    keep = x
    assert in_place_call(impl, [0])(x, 3.0) is None
    assert x is keep and x.dtype == np.float64 and np.array_equal(x, (np.arange(5) + 0.5) * 3.0)
    assert returning_args(lambda a, b: None, [1, 0])(1, 2) == (2, 1)
    same = np.ones(3)
    write_back(same, same)  # nothing to copy
    torch = pytest.importorskip("torch")
    t = torch.zeros(4, dtype=torch.float64)
    write_back((t,), (np.arange(4, dtype=np.float32),))
    assert t.dtype == torch.float64 and t.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_nothing_returned_nor_written_is_a_one_line_error(tmp_path):
    p = tmp_path / "forgetful.py"
    p.write_text("import numpy as np\n\ndef original(x):\n    y = np.sin(x)\n\n"
                 "def inputs(rng):\n    return (rng.standard_normal(10),)\n")
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "optimize", str(p), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "returned None and changed none of its arguments" in r.stderr
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_plan_keeps_in_place_code_off_what_cannot_write():
    """JAX arrays cannot be written and cupy.fuse returns new arrays: neither is planned for code that writes
    into its arguments; nor is a CUDA-graph capture (a replay writes the graph's own copies)."""
    wl = workload.load("heat_stencil", gpu=True, scale=0.01)
    wl.in_place = [0]
    rows, recs = C.plan(wl, "cuda", {"float64": True})
    rows = {r["key"]: r for r in rows}
    assert not any(r["backend"] == "jax" for r in recs)
    if C.installed("jax"):
        assert "cannot be written" in rows["jax"]["why"]
    if C.installed("cupy"):
        assert rows["fuse"]["decision"] == "skipped" and "writes into its arguments" in rows["fuse"]["why"]

    def ok(t, backend):
        return {"status": "ok", "device_time": {"median": t}, "recipe": {"backend": backend, "precision": "as-written"}}

    res = {"torch-cuda": ok(5e-4, "torch"), "cupy": ok(3e-4, "cupy")}
    assert not any(r.get("graph") or r.get("fuse") for r in C.derived(res, wl, "cuda"))
    wl.in_place = None
    assert any(r.get("graph") for r in C.derived(res, wl, "cuda"))


SCALE_AND_SUM = '''
import numpy as np

TOLERANCE = dict(rtol=1e-5)


def original(x):
    """Doubles the caller's x in place and returns its column sums of sqrt|x|."""
    x *= 2.0
    return np.sqrt(np.abs(x)).sum(axis=0)


def forgets(x):
    return np.sqrt(np.abs(2.0 * x)).sum(axis=0)  # the right result, and x left as it was


def inputs(rng):
    return (rng.standard_normal((50, 30)),)


variants = {"forgets": forgets}
'''


def test_an_original_that_returns_and_also_changes_its_input(tmp_path):
    """Both what it returns and what it does to the caller's array are its output: a candidate that returns the
    right value but leaves the array alone is wrong, and the optimized script does both."""
    p = tmp_path / "scale_and_sum.py"
    p.write_text(textwrap.dedent(SCALE_AND_SUM))
    run = optimize(p, device="cpu", out=tmp_path / "out", backends=["variant", "numpy"], time_budget=120,
                   bench_budget_s=0.1)
    assert run.params["in_place"] == [0] and run.params["in_place_returns"]
    status = {name: r["status"] for name, r in run.results.items()}
    assert status["original"] == "ok" and status["variant:forgets"] == "incorrect", run.results["variant:forgets"]
    assert status["numpy-fp32"] == "ok", run.results["numpy-fp32"].get("reason")
    assert "returns its result and also changes `x` (argument 0)" in (tmp_path / "out" / "report.md").read_text()
    script = tmp_path / "out" / "optimized_scale_and_sum.py"
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and "correctness: PASS" in r.stdout, r.stdout + r.stderr
    spec = importlib.util.spec_from_file_location("optimized_scale_and_sum_t", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fn, _ = mod.build_optimized()
    x = np.random.default_rng(3).standard_normal((50, 30))
    x0 = x.copy()
    got = fn(x)
    assert np.allclose(x, 2 * x0) and np.allclose(got, np.sqrt(np.abs(2 * x0)).sum(axis=0), rtol=1e-5)


GPU_VARIANT = '''
import numpy as np
import torch


def original(x):
    return np.tanh(x) * np.float16(2.0) - x * np.float16(0.1)


def on_gpu(x):
    if not x.is_cuda:
        raise RuntimeError("the hand kernel needs a CUDA device")
    return (torch.tanh(x.float()) * 2.0 - x.float() * 0.1).half()


on_gpu.gpuspeed_inputs = "torch"


def in_float32(x):
    x32 = x.astype(np.float32)
    return (np.tanh(x32) * 2.0 - x32 * np.float32(0.1)).astype(np.float16)


variants = {"on_gpu": on_gpu, "in_float32": in_float32}


def inputs(rng):
    return (rng.standard_normal(20000).astype(np.float16),)
'''


@pytest.mark.parametrize("variant, ran_on", [("on_gpu", "cuda"), ("in_float32", "cpu")])
def test_emitted_script_of_a_variant(tmp_path, monkeypatch, variant, ran_on):
    """A variant taking torch inputs chosen on a GPU falls back to the original on a machine without one (it
    would fail on CPU tensors); a float16 output is checked under float16's tolerance, as optimize checked it."""
    from gpuspeed.optimize import emit

    p = tmp_path / "f16.py"
    p.write_text(textwrap.dedent(GPU_VARIANT))
    wl = workload.load(p, gpu=False)
    rec = {"name": f"variant:{variant}", "backend": "variant", "precision": "as-written", "variant": variant}
    row = {"name": rec["name"], "recipe": rec, "status": "ok", "label": "x", "device_time": {"median": 1e-3}}
    run = types.SimpleNamespace(wl=wl, where=ran_on, out_dir=tmp_path, params={"seeds": [1, 2, 3]},
                                choice={"primary": rec["name"]}, results={rec["name"]: row, "original": row})
    script = tmp_path / "optimized_f16.py"
    monkeypatch.setattr(emit, "_dev_name", lambda run: "an NVIDIA H200")  # written as on a GPU machine
    script.write_text(emit.script_text(run))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and "correctness: PASS" in r.stdout, r.stdout + r.stderr
    from gpuspeed.device import cuda_available

    # on a GPU machine the GPU variant runs where it was chosen
    want = f"user variant '{variant}'" if variant != "on_gpu" or cuda_available() else "the original on the CPU (no GPU)"
    assert want in r.stdout.splitlines()[0], r.stdout
