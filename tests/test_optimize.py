"""gpuspeed optimize on the CPU: workload errors, the pipeline over every bundled example at small
inputs, resume, chunking and the axis proposal, and the emitted script running green without a GPU."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gpuspeed.cli import main
from gpuspeed.errors import UserError
from gpuspeed.optimize import budget, workload
from gpuspeed.optimize.backends.chunking import chunked
from gpuspeed.optimize.backends.common import Demoted, Impl, rebind
from gpuspeed.optimize.pipeline import optimize
from gpuspeed.optimize.runner import read_jsonl


def _write(tmp_path, text, name="wl.py"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


GOOD = """
import numpy as np
TOLERANCE = dict(rtol=1e-5, atol=1e-6)
def original(x):
    return np.sin(x) * 2.0 + x
def inputs(rng):
    return (rng.standard_normal(1000),)
"""


@pytest.mark.parametrize("text, message", [
    ("import numpy as np\ndef inputs(rng):\n    return (np.ones(3),)\n", "defines no function 'original'"),
    ("def original(x):\n    return x\ndef inputs(rng):\n    raise RuntimeError('boom')\n", "inputs(rng) raised RuntimeError"),
    ("def original(x:\n    return x\n", "syntax error"),
    ("import numpy as np\ndef original(x):\n    raise ValueError('bad')\ndef inputs(rng):\n    return (np.ones(3),)\n",
     "raised ValueError: bad"),
    ("def original(x):\n    return x\n", "defines no inputs(rng)"),
    ("import numpy as np\nTOLERANCE = 3\ndef original(x):\n    return x\ndef inputs(rng):\n    return (np.ones(3),)\n",
     "TOLERANCE must be"),
    ("import not_a_module_xyz\n", "importing"),
])
def test_bad_workloads_are_one_line_errors(tmp_path, capsys, text, message):
    p = _write(tmp_path, text)
    out = tmp_path / "out"
    rc = main(["optimize", str(p), "--out", str(out), "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2
    # exactly one line: no blank line from a progress bar opened before the error either
    assert err.startswith("gpuspeed: error:") and err.count("\n") == 1 and message in err, repr(err)
    assert not out.exists() or not any(out.iterdir())  # nothing half-written


def test_unparsable_input_spec(tmp_path, capsys):
    p = _write(tmp_path, "def original(x):\n    return x\n")
    rc = main(["optimize", str(p), "--input", "x=float99[3]", "--device", "cpu", "--out", str(tmp_path / "o")])
    assert rc == 2 and "bad input spec" in capsys.readouterr().err


def test_input_specs_make_numpy_arrays(tmp_path):
    p = _write(tmp_path, "def original(n, x):\n    return x * n\n")
    wl = workload.load(p, input_specs=["x=float32[4,3]", "n=int:5"], gpu=False)
    args = wl.make_args(1)
    assert isinstance(args[1], np.ndarray) and args[1].shape == (4, 3) and args[0] == 5  # parameter order


def test_pipeline_small_end_to_end_and_resume(tmp_path):
    p = _write(tmp_path, GOOD)
    out = tmp_path / "run"
    run = optimize(p, device="cpu", out=out, time_budget=120)
    assert run.results["original"]["status"] == "ok"
    assert run.results["numpy-fp32"]["status"] == "ok"  # float32 is within 1e-5 here
    assert run.choice["primary"] in ("numpy-fp32", "original", "numba", "numba-serial", "numba-prange")  # the fastest here
    for name in ("report.md", "optimize_wl.json", "optimize_wl.png", "optimized_wl.py", "candidates.jsonl"):
        assert (out / name).is_file(), name
    md = (out / "report.md").read_text()
    for section in ("## A — Summary", "## B — Primary code", "## C — Alternative", "## D — Benchmark",
                    "## E — How to profile"):
        assert section in md
    doc = json.loads((out / "optimize_wl.json").read_text())
    assert doc["summary"]["correct"] is True and doc["study"] == "optimize_wl"
    lines = read_jsonl(out / "candidates.jsonl")
    names = {r["name"] for r in lines}  # Numba and JAX join where installed
    assert {"original", "numpy-fp32"} <= names <= {"original", "numpy-fp32", "numba", "numba-serial", "numba-prange", "jax",
                                                     "jax-fp32"}
    # an interrupted run: drop the last line, resume: the kept line is reused, the lost one re-run
    (out / "candidates.jsonl").write_text(json.dumps(lines[0]) + "\n")
    run2 = optimize(p, device="cpu", out=out, time_budget=120, resume=True)
    assert run2.results["original"].get("resumed") and not run2.results["numpy-fp32"].get("resumed")
    assert run2.params["seeds"] == run.params["seeds"]


def test_demotion_rejected_outside_tolerance(tmp_path):
    p = _write(tmp_path, GOOD.replace("rtol=1e-5, atol=1e-6", "rtol=1e-6, atol=1e-9").replace("1000", "200000")
               .replace("np.sin(x) * 2.0 + x", "np.cumsum(x * 2.0)"))
    run = optimize(p, device="cpu", out=tmp_path / "r", time_budget=120)
    assert run.results["numpy-fp32"]["status"] == "incorrect"  # float32 cumsum drifts past 1e-6


def test_emitted_script_runs_green_without_gpu(tmp_path):
    p = _write(tmp_path, GOOD)
    run = optimize(p, device="cpu", out=tmp_path / "r", time_budget=120)
    script = Path(run.paths["script"])
    r = subprocess.run([sys.executable, str(script), "--bench", "--cpu"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ""})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "correctness: PASS" in r.stdout and "optimized" in r.stdout
    # a machine without one of the workload's own imports (SciPy, say): one line naming it, no traceback
    p.write_text("import not_installed_anywhere_xyz\n" + p.read_text())
    r = subprocess.run([sys.executable, str(script), "--cpu"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ""})
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "not_installed_anywhere_xyz, which is not installed here" in r.stderr.strip().splitlines()[-1]


def test_demoted_namespace_and_rebind():
    d = Demoted(np)
    assert d.zeros(3).dtype == np.float32 and d.float64 is np.float32 and d.arange(3).dtype == np.int64
    assert d.zeros(3, dtype=np.float64).dtype == np.float32 and d.linspace(0, 1, 5).dtype == np.float32
    import types

    m = types.ModuleType("m")
    exec("import numpy as np\nfrom numpy import exp\ndef f(x):\n    return exp(np.zeros(2) + x)\n", m.__dict__)
    rebind(m, np, demote=True)
    assert m.f(1.0).dtype == np.float32


def test_rebind_keeps_numpy_host_settings_for_a_library_without_them():
    """CuPy and jax.numpy have no errstate/seterr: user code that sets them must run there unchanged."""
    import types

    xp = types.ModuleType("fakexp")  # an array module with NumPy's functions but none of its settings
    xp.log, xp.where, xp.asarray = np.log, np.where, np.asarray
    m = types.ModuleType("m2")
    exec("import numpy as np\ndef f(x):\n    with np.errstate(divide='ignore'):\n"
         "        return np.where(x > 0, np.log(x), 0.0)\n", m.__dict__)
    rebind(m, xp)
    assert m.np is not xp and m.np.log is np.log and m.np.errstate is np.errstate
    assert m.f(np.array([0.0, np.e])).tolist() == [0.0, 1.0]
    with pytest.raises(AttributeError):
        getattr(m.np, "polyfit")  # noqa: B009 - only the host settings fall back to NumPy, never an array function
    m = types.ModuleType("m3")
    exec("import numpy\n", m.__dict__)
    rebind(m, np)
    assert m.numpy is np  # NumPy itself is bound as is


def test_chunked_matches_whole_and_axis_proposal(tmp_path):
    p = _write(tmp_path, """
        import numpy as np
        def original(a, b):
            return np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)), a.sum(axis=1)
        def inputs(rng, scale=1.0):
            return rng.standard_normal((int(300 * scale), 3)), rng.standard_normal((50, 3))
        """)
    wl = workload.load(p, gpu=False, scale=1.0)
    prop = budget.propose_axes(wl)
    assert prop["axes"] == {0: 0} and prop["out_axes"] == [0, 0], prop
    args = wl.make_args(3)
    impl = chunked(Impl(wl.original), prop["axes"], prop["out_axes"], 64)
    whole = wl.original(*args)
    parts = impl(*args)
    assert all(np.array_equal(w, c) for w, c in zip(whole, parts, strict=True))


def test_no_axis_for_a_recurrence(tmp_path):
    p = _write(tmp_path, """
        import numpy as np
        def original(x):
            return np.cumsum(x, axis=0)
        def inputs(rng, scale=1.0):
            return (rng.standard_normal((400, 4)),)
        """)
    prop = budget.propose_axes(workload.load(p, gpu=False))
    assert prop["axes"] == {0: 1}  # columns are independent, rows are not


def test_bad_backend_and_target(tmp_path):
    p = _write(tmp_path, GOOD)
    with pytest.raises(UserError, match="unknown backend"):
        optimize(p, device="cpu", backends=["nope"], out=tmp_path / "r")
    with pytest.raises(UserError, match="target-gpu"):
        optimize(p, device="cpu", target_gpu="Voodoo 2", out=tmp_path / "r")


EXAMPLES = workload.bundled_examples()


def test_at_least_eight_examples():
    assert len(EXAMPLES) >= 8 and workload.DEFAULT_EXAMPLE in EXAMPLES


@pytest.mark.slow
@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_cpu_path(tmp_path, name):
    """No GPU: no crash and a correct report for every bundled example at small inputs."""
    if "from scipy" in (workload.EXAMPLES_DIR / f"{name}.py").read_text():
        pytest.importorskip("scipy")
    # two jobs: one candidate compiles while another is checked (timing stays one at a time): ~1/3 less time here
    run = optimize(name, device="cpu", out=tmp_path / name, scale=0.01, time_budget=90, bench_budget_s=0.05, jobs=2)
    assert run.results["original"]["status"] == "ok", run.results["original"]
    md = (tmp_path / name / "report.md").read_text()
    assert "## A — Summary" in md and "## E — How to profile" in md
    for r in run.results.values():  # every candidate's status is one the report explains
        assert r["status"] in ("ok", "incorrect", "wrong_output", "unavailable", "error", "skipped", "timeout"), r
    assert run.results[run.choice["primary"]]["status"] == "ok"  # the original at worst


@pytest.mark.parametrize("backend, extra", [("cupy", {"fuse": True}), ("torch_compile", {"mode": "reduce-overhead"}),
                                            ("torch", {"mode": "eager", "graph": True}), ("numba", {"prange": True}),
                                            ("jax", {}), ("numpy", {}), ("variant", {"variant": "v"}), ("original", {})])
def test_emitted_script_compiles_for_every_backend(tmp_path, backend, extra):
    """The script pastes the backend's source into a function: it must compile, and without the backend's
    library (or a GPU) fall back to the original and pass its own correctness test."""
    import types

    from gpuspeed.optimize import emit

    p = _write(tmp_path, GOOD + "variants = {'v': original}\n")
    wl = workload.load(p, gpu=False)
    rec = {"name": "c", "backend": backend, "precision": "as-written"} | extra
    row = {"name": "c", "recipe": rec, "status": "ok", "label": "x", "device_time": {"median": 1e-3}}
    run = types.SimpleNamespace(wl=wl, where="cpu", out_dir=tmp_path, params={"seeds": [1, 2, 3]},
                                choice={"primary": "c"}, results={"c": row, "original": row})
    text = emit.script_text(run)
    compile(text, "optimized.py", "exec")
    script = tmp_path / "optimized_wl.py"
    script.write_text(text)
    r = subprocess.run([sys.executable, str(script), "--cpu"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "correctness: PASS" in r.stdout, r.stdout + r.stderr


def test_projection_from_the_roofline(monkeypatch):
    """A memory-bound fp32 primary keeps its fraction of the roof; a compute-bound fp64 one hits the target's
    FP64 cliff."""
    import types

    from gpuspeed import device as _device
    from gpuspeed.optimize import pipeline

    h200 = _device.DeviceInfo(kind="cuda", name="NVIDIA H200")
    monkeypatch.setattr(_device, "get_device", lambda where="auto", index=None: h200)
    sheet_h, sheet_t = _device.datasheet_for("H200"), _device.datasheet_for("RTX 4070 Laptop")

    def run_with(precision, flops, traffic, t):
        row = {"recipe": {"backend": "cupy", "precision": precision}, "device_time": {"median": t},
               "traffic_bytes": traffic, "peak_bytes": 2**30}
        return types.SimpleNamespace(choice={"primary": "c"}, results={"c": row}, where="cuda", params={"budget_bytes": 2**33},
                                     hot={"float64": True, "intensity": {"flops_full": flops, "source": "test"}})

    # 1 GB at 50 % of the H200's bandwidth, 0.25 FLOP/B: memory-bound on both cards
    t = 1e9 / (0.5 * sheet_h.mem_GBps * 1e9)
    pr = pipeline.project(run_with("float32", 0.25e9, 1e9, t), "RTX 4070 Laptop")
    assert pr["bound_target"] == "memory" and abs(pr["pct_of_roof_here"] - 50) < 1e-6
    assert abs(pr["projected_s"] - 1e9 / (0.5 * sheet_t.mem_GBps * 1e9)) / pr["projected_s"] < 1e-9
    # 100 FLOP/B in float64: the 4070's 0.31 TFLOP/s FP64 roof decides
    pr = pipeline.project(run_with("as-written", 100e9, 1e9, 100e9 / (0.5 * sheet_h.fp64_TFLOPs * 1e12)),
                          "RTX 4070 Laptop")
    assert pr["unit"] == "fp64" and pr["bound_target"] == "compute"
    assert abs(pr["projected_s"] - 100e9 / (0.5 * sheet_t.fp64_TFLOPs * 1e12)) / pr["projected_s"] < 1e-9


def test_flop_count_of_numpy_code():
    from gpuspeed.optimize import flops

    a, b = np.ones((8, 4)), np.ones((4, 3))
    r = flops.intensity(lambda x, y: (x @ y).sum() + np.sin(x).max(), (a, b))
    # matmul, its sum, sin, max; the final add of two NumPy scalars is not followed (a lower bound)
    assert r["flops"] == 2 * 4 * 8 * 3 + 24 + 32 + 32


def test_plan_on_a_gpu_machine():
    """The plan's GPU rows and recipes (planned here, run on the device): drop-ins, float32 within the
    tolerance, TF32 for float32 matmul code, sequential recurrences kept off the array backends."""
    from gpuspeed.optimize import candidates as C

    def names(name, hot):
        wl = workload.load(name, gpu=True, scale=0.01)
        rows, recs = C.plan(wl, "cuda", hot)
        return {r["name"] for r in recs}, {r["key"]: r for r in rows}

    recs, rows = names("black_scholes", {"float64": True})
    assert {"torch-compile", "torch-compile-fp32"} <= recs and rows["torch_compile"]["decision"] == "tried"
    # array code on a GPU: the CPU candidates (slow to time, holding the machine) cannot win and are skipped
    assert "numpy-fp32" not in recs and "numba" not in recs and "GPU run" in rows["numpy"]["why"]
    if C.installed("cupy"):
        assert rows["fuse"]["decision"] == "tried"  # black_scholes is elementwise: cupy.fuse may trace it
    recs, rows = names("ema_filter", {"float64": True, "loop_bound": True, "sequential": True})
    assert "torch-compile" not in recs and "sequential" in rows["torch_compile"]["why"]
    if C.installed("numba"):  # a loop the GPU array backends cannot take: Numba's CPU compile can win
        assert "numba" in recs
    if C.installed("cupy"):
        recs, rows = names("heat_stencil", {"float64": True})
        assert rows["fuse"]["decision"] == "skipped" and "loops" in rows["fuse"]["why"]
    recs, rows = names("torch_mlp", {"float64": False})
    assert {"torch-cuda", "torch-compile", "torch-compile-tf32"} <= recs and "torch-cuda-fp32" not in recs
    recs, rows = names("histogram", {"float64": True})
    assert "torch-compile-fp32" not in recs and "rtol 1e-12" in rows["precision"]["why"]  # no TOLERANCE: no float32

    def ok(t, backend="torch_compile", precision="as-written"):
        return {"status": "ok", "device_time": {"median": t}, "recipe": {"backend": backend, "precision": precision}}

    res = {"torch-compile": ok(2e-3), "torch-compile-fp32": ok(1e-3, precision="float32"),
           "torch-cuda": ok(5e-4, "torch"), "cupy": ok(3e-3, "cupy")}
    more = {r["name"]: r for r in C.derived(res, None, "cuda")}
    assert more["torch-compile-fp32-reduce-overhead"]["precision"] == "float32"  # modes on the faster precision
    assert more["torch-cuda-graph"]["graph"] is True and more["cupy-fuse"]["fuse"] is True
    assert C.derived(res, None, "cpu") == []


def test_emitted_script_passes_spec_inputs_in_parameter_order(tmp_path):
    import types

    from gpuspeed.optimize import emit

    p = _write(tmp_path, "import numpy as np\ndef original(x, n):\n    return np.tanh(x) * n\n")
    wl = workload.load(p, input_specs=["n=int:3", "x=float32[64,8]"], gpu=False)
    row = {"name": "original", "recipe": {"name": "original", "backend": "original"}, "status": "ok",
           "device_time": {"median": 1e-3}}
    run = types.SimpleNamespace(wl=wl, where="cpu", out_dir=tmp_path, params={"seeds": [1, 2, 3]},
                                choice={"primary": "original"}, results={"original": row})
    text = emit.script_text(run)
    assert "ARG_ORDER = ['x', 'n']" in text
    ns = {"__file__": str(tmp_path / "optimized_wl.py"), "__name__": "optimized"}
    exec(compile(text, "optimized_wl.py", "exec"), ns)
    args = ns["make_args"](ns["load_workload"]("_t"), 5)
    assert args[1] == 3 and np.array_equal(args[0], wl.make_args(5)[0])  # the same values gpuspeed made
