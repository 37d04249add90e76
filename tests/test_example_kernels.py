"""The bundled examples' hand kernels (gpuspeed/examples/hand_kernels) on the CPU: every Triton kernel under
TRITON_INTERPRET=1 (each autotune config), every Numba CUDA kernel under NUMBA_ENABLE_CUDASIM=1, on small
and odd shapes that do not divide the blocks, against the example's own float64 `original` through
gpuspeed.check under the example's TOLERANCE (exact for the integer outputs), outputs poisoned first.

The interpreters must be on before Triton and Numba define the kernels, and other tests may already have
imported them, so the checks run in one child process (this file run as a script) that prints one JSON
line per case; the tests read those lines.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
HAS_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None

# (case id, example, kernel module, launcher, "triton" | "numba")
CASES = [
    ("row_normalize-triton", "row_normalize_loop", "row_normalize", "normalize_rows_triton", "triton"),
    ("row_stats-triton", "row_stats", "row_stats", "row_stats_triton", "triton"),
    ("row_stats-numba", "row_stats", "row_stats", "row_stats_numba", "numba"),
    ("pairwise-triton", "pairwise_distance", "pairwise_distance", "pairwise_triton", "triton"),
    ("pairwise-numba", "pairwise_distance", "pairwise_distance", "pairwise_numba", "numba"),
    ("heat-triton", "heat_stencil", "heat_stencil", "heat_triton", "triton"),
    ("heat-numba", "heat_stencil", "heat_stencil", "heat_numba", "numba"),
    ("histogram-triton", "histogram", "histogram", "histogram_triton", "triton"),
    ("histogram-numba", "histogram", "histogram", "histogram_numba", "numba"),
    ("mandelbrot-triton", "mandelbrot", "mandelbrot", "mandelbrot_triton", "triton"),
    ("mandelbrot-numba", "mandelbrot", "mandelbrot", "mandelbrot_numba", "numba"),
    # float32 variants (precision = "float32"): given float32 inputs as optimize gives them, judged against the
    # float64 original under the example's TOLERANCE
    ("row_normalize-triton-fp32", "row_normalize_loop", "row_normalize", "normalize_rows_triton_fp32", "triton"),
    ("heat-triton-fp32", "heat_stencil", "heat_stencil", "heat_triton_fp32", "triton"),
]
FP32 = {"normalize_rows_triton_fp32": ("CONFIGS_F32", "triton_fp32"), "heat_triton_fp32": ("CONFIGS_F32", "triton_fp32")}


# ---- the child process ------------------------------------------------------------------------------

def _args(example: str, shape_id: int, seed: int, numba: bool) -> tuple:
    """Small inputs in the example's own style; shape_id picks a second shape (a long row, a tiny grid)."""
    rng = np.random.default_rng(seed)
    if example == "row_normalize_loop":
        rows, cols = ((37, 53), (3, 4500))[shape_id]  # 4500 > MAX_BLOCK: the chunked three-pass path
        return (rng.standard_normal((rows, cols)) * rng.uniform(0.5, 2.0, (rows, 1)) + rng.uniform(-1, 1),)
    if example == "row_stats":  # simulated: 11 rows, two blocks of 8 warps (the second partial), not 37's five
        rows, cols = ((37, 53), (3, 4500))[shape_id] if not numba else ((11, 53), (3, 4500))[shape_id]
        return rng.standard_normal((rows, cols)) + rng.uniform(-1, 1, (rows, 1)), rng.uniform(0.5, 1.5, cols)
    if example == "pairwise_distance":
        n, m = ((37, 53), (1, 130))[shape_id] if not numba else ((37, 71), (5, 3))[shape_id]
        a = rng.standard_normal((n, 3))
        b = np.concatenate([a[:2], rng.standard_normal((m - 2, 3))]) if m > 2 else rng.standard_normal((m, 3))
        return a, b  # b repeats two points of a: distance exactly 0 must come out 0
    if example == "heat_stencil":
        rows, cols = ((37, 53), (3, 3))[shape_id] if not numba else ((11, 35), (3, 3))[shape_id]
        return rng.random((rows, cols)), 0.2, (3 if not numba else 2) + shape_id
    if example == "histogram":
        n = 10_007 if not numba else 509
        x = rng.standard_normal(n) * 1.5
        bins, lo, hi = ((256, -4.0, 4.0), (37, -2.5, 3.1), (7, 1.0, 1.0))[shape_id]
        edges = np.linspace(lo, hi, bins + 1) if lo < hi else np.linspace(lo - 0.5, hi + 0.5, bins + 1)
        x[: min(len(edges), 200)] = edges[:200]  # values exactly on the edges, hi included
        x[200:205] = [np.nan, lo - 1e-9, hi + 1e-9, np.inf, -np.inf]  # dropped, as NumPy drops them
        near = edges[: min(len(edges), 100)]  # an ulp either side of an edge: where the index estimate is off by one
        x[205:205 + len(near)] = np.nextafter(near, np.inf)
        x[205 + len(near):205 + 2 * len(near)] = np.nextafter(near, -np.inf)
        return x, bins, lo, hi
    if example == "mandelbrot":
        from gpuspeed.examples import mandelbrot as ex

        xs, ys, it = ex.inputs(rng, scale=0.02)
        return (xs[:37], ys[:13], it // 2 - 5) if shape_id == 0 else (xs[:5], ys[:3], 17)  # fewer steps: interpreted
    raise KeyError(example)


def _out_buffers(example: str, args: tuple, fp32: bool = False):
    """Poisoned output buffers for the launchers that take `out` (gpuspeed.poison: NaN / the int max)."""
    import torch

    from gpuspeed import poison

    if example == "row_normalize_loop":
        return poison(torch.empty(args[0].shape, dtype=torch.float32 if fp32 else torch.float64))
    if example == "row_stats":
        return tuple(poison(torch.empty(args[0].shape[0], dtype=torch.float64)) for _ in range(3))
    if example == "pairwise_distance":
        return poison(torch.empty((args[0].shape[0], args[1].shape[0]), dtype=torch.float64))
    if example == "mandelbrot":
        return poison(torch.empty((len(args[1]), len(args[0])), dtype=torch.int64))
    return None  # heat_stencil (its own ping-pong buffers), histogram (counts start at zero)


def _check_case(case) -> dict:
    import importlib

    from gpuspeed import check

    cid, example, module, launcher, kind = case
    if kind == "numba" and not HAS_NUMBA_CUDA:
        return {"id": cid, "skipped": "numba-cuda is not installed (its simulator runs these kernels)"}
    ex = importlib.import_module(f"gpuspeed.examples.{example}")
    fn = getattr(importlib.import_module(f"gpuspeed.examples.hand_kernels.{module}"), launcher)
    tol = getattr(ex, "TOLERANCE", {})
    mod = importlib.import_module(f"gpuspeed.examples.hand_kernels.{module}")
    fp32 = launcher in FP32
    configs = [None] if kind == "numba" else getattr(mod, FP32[launcher][0]) if fp32 else mod.CONFIGS
    runs = []
    # every config once on the first shape; the first config on three seeds and on the second shape
    for cfg_i, cfg in enumerate(configs):
        for seed in ((0, 1, 2) if cfg_i == 0 else (0,)):
            runs.append((cfg, 0, seed))
    runs.append((configs[0], 1, 3))
    if kind == "numba":
        runs = [(None, 0, 0), (None, 0, 1), (None, 1, 2)]  # the simulator is slow: three runs
    results = []
    for cfg, shape_id, seed in runs:
        args = _args(example, shape_id, seed, kind == "numba")
        before = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args]
        ref = ex.original(*[np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args])
        kw = {} if kind == "numba" else {"config": cfg}
        out = _out_buffers(example, args, fp32)
        if out is not None:
            kw["out"] = out
        # a float32 variant gets float32 inputs, as the optimize worker casts them before the timing
        call_args = tuple(a.astype(np.float32) if fp32 and isinstance(a, np.ndarray) and a.dtype == np.float64 else a
                          for a in args)
        got = fn(*call_args, **kw)
        leaves = got if isinstance(got, tuple) else (got,)
        host = tuple(t.cpu().numpy() for t in leaves)
        want_dtypes = [np.dtype(np.float32) if fp32 else np.asarray(r).dtype
                       for r in (ref if isinstance(ref, tuple) else (ref,))]
        dtypes_ok = all(h.dtype == w for h, w in zip(host, want_dtypes, strict=True))
        host = tuple(h.astype(np.float64) for h in host) if fp32 else host  # cast back, as the worker's fetch does
        host = host if isinstance(ref, tuple) else host[0]
        res = check(host, ref, **tol)
        same_in = all(np.array_equal(a, b, equal_nan=True) if isinstance(a, np.ndarray) else a == b
                      for a, b in zip(args, before, strict=True))
        label = f"{cfg.kwargs} warps {cfg.num_warps} stages {cfg.num_stages}" if cfg else None
        results.append({"config": label, "shape": shape_id, "seed": seed,
                        "passed": bool(res.passed and dtypes_ok and same_in), "summary": res.summary,
                        "dtypes_ok": dtypes_ok, "inputs_unchanged": same_in})
    # the example's variants dict points at this launcher (called through it on the GPU tests)
    name = FP32[launcher][1] if fp32 else "triton" if kind == "triton" else "numba_cuda"
    target = ex.variants[name].target
    precision = getattr(ex.variants[name], "precision", None)
    results.append({"config": "variants dict", "shape": 0, "seed": None,
                    "passed": target == (mod.__name__, launcher) and precision == ("float32" if fp32 else None),
                    "summary": f"variants[{name!r}] -> {target}, precision {precision}"})
    return {"id": cid, "runs": results, "configs": len(configs)}


def _refuses_without_device() -> dict:
    """Without a GPU the examples' variants refuse in one line, even under the interpreters (an ImportError,
    so the optimize worker records them as unavailable instead of timing interpreted kernels); a launcher
    given host tensors without an interpreter refuses too."""
    import torch

    from gpuspeed.examples import row_stats as ex
    from gpuspeed.examples.hand_kernels import KernelUnavailable
    from gpuspeed.examples.hand_kernels.row_stats import row_stats_triton

    said = []
    try:
        ex.variants["triton"](*_args("row_stats", 0, 0, False))
    except KernelUnavailable as exc:
        said.append(str(exc))
    saved = os.environ.pop("TRITON_INTERPRET")
    try:
        row_stats_triton(*(torch.from_numpy(a) for a in _args("row_stats", 0, 0, False)))
    except KernelUnavailable as exc:
        said.append(str(exc))
    finally:
        os.environ["TRITON_INTERPRET"] = saved
    ok = len(said) == 2 and all("\n" not in s and "CUDA device" in s for s in said) and \
        issubclass(KernelUnavailable, ImportError)
    return {"id": "refuses", "passed": ok, "summary": " | ".join(said) or "ran without a device"}


def _histogram_edges_paths() -> dict:
    """The Triton histogram computes its edges as i * step + lo where that gives np.linspace's edges bit for bit
    (checked on the host per bin count and range) and gathers NumPy's edges otherwise (a range whose step
    underflows): both paths bin the edge cases as NumPy does."""
    import torch

    from gpuspeed.examples.hand_kernels import histogram as H

    plans = {(b, lo, hi): H._edges_host(b, lo, hi)[4] for b, lo, hi in
             ((256, -4.0, 4.0), (37, -2.5, 3.1), (7, 1.0, 1.0), (1000, -3.3, 2.9), (3, 0.0, 5e-324))}
    runs = []
    real = H._edges_host
    for forced in (None, False):
        H._EDGES.clear()
        H._edges_host = real if forced is None else (lambda *a: real(*a)[:4] + (False,))
        try:
            for shape_id in (0, 1, 2):
                x, bins, lo, hi = _args("histogram", shape_id, 5, False)
                got = H.histogram_triton(torch.from_numpy(x), bins, lo, hi).numpy()
                runs.append(bool(np.array_equal(got, np.histogram(x, bins=bins, range=(lo, hi))[0])))
        finally:
            H._edges_host = real
            H._EDGES.clear()
    ok = all(runs) and plans == {(256, -4.0, 4.0): True, (37, -2.5, 3.1): True, (7, 1.0, 1.0): True,
                                 (1000, -3.3, 2.9): True, (3, 0.0, 5e-324): False}
    return {"id": "histogram-edges", "passed": ok, "summary": f"arith plans {plans}; runs {runs}"}


def _heat_steps_into_out() -> dict:
    """The stencil's step chains, as its graph path calls them: n steps from the caller's grid (never written)
    through at most two fresh buffers, the last into a given (poisoned) `out`, which is returned; the first and
    the last step of a graphed call are such chains of one step."""
    import torch

    from gpuspeed import check, poison
    from gpuspeed.examples import heat_stencil as ex
    from gpuspeed.examples.hand_kernels import heat_stencil as H

    runs = []
    grid, alpha, _ = _args("heat_stencil", 0, 7, False)
    u = torch.from_numpy(grid)
    coeff = H._alpha(alpha, u.device)
    for n in (1, 2, 3, 4):
        ref = ex.original(np.array(grid, copy=True), alpha, n)
        for given in (False, True):
            out = poison(torch.empty_like(u)) if given else None
            got = H._triton_steps(u, coeff, n, H.CONFIGS[0], H.heat_step_kernel, out)
            dsts = H._buffers(u, n, out)
            shape_ok = (len(dsts) == n and len({id(d) for d in dsts if d is not out}) <= 2
                        and all(d is not u for d in dsts) and (not given or dsts[-1] is out)
                        and all(a is not b for a, b in zip(dsts[:-1], dsts[1:], strict=True)))
            runs.append(bool(check(got, ref, **ex.TOLERANCE).passed and (got is out or not given) and shape_ok
                             and np.array_equal(u.numpy(), grid)))
    return {"id": "heat-steps-out", "passed": all(runs), "summary": f"steps 1-4, out none/given: {runs}"}


def child_main() -> int:
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    wanted = set(sys.argv[1:])
    for case in CASES:
        if wanted and case[0] not in wanted:
            continue
        try:
            t0 = time.perf_counter()  # the child's own cost per case, to keep the file fast (not a benchmark)
            line = _check_case(case)
            line["wall_s"] = round(time.perf_counter() - t0, 2)
        except Exception as exc:  # noqa: BLE001 - reported to the parent as this case's failure
            import traceback

            line = {"id": case[0], "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
        print(json.dumps(line), flush=True)
    if not torch.cuda.is_available() and (not wanted or "refuses" in wanted):
        print(json.dumps(_refuses_without_device()), flush=True)
    if not wanted or "histogram-edges" in wanted:
        print(json.dumps(_histogram_edges_paths()), flush=True)
    if not wanted or "heat-steps-out" in wanted:
        print(json.dumps(_heat_steps_into_out()), flush=True)
    return 0


# ---- the tests --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def child_results(interpreter_child):
    return interpreter_child(__file__, timeout=600)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_kernel_matches_the_original_under_the_interpreter(child_results, case):
    d = child_results.get(case[0])
    assert d is not None, f"{case[0]}: no result from the child"
    if "skipped" in d:
        pytest.skip(d["skipped"])
    assert "error" not in d, d.get("traceback", d.get("error"))
    failed = [r for r in d["runs"] if not r["passed"]]
    assert not failed, failed
    if case[4] == "triton":
        mod_configs = {r["config"] for r in d["runs"]} - {"variants dict"}
        assert len(mod_configs) == d["configs"] >= 2  # every autotune config ran
    assert any(r["shape"] == 1 for r in d["runs"])  # and the second, odd shape


def test_histogram_edges_computed_where_they_match_linspace_else_gathered(child_results):
    d = child_results.get("histogram-edges")
    assert d is not None and d["passed"], d


def test_heat_steps_write_their_last_step_into_a_given_grid(child_results):
    d = child_results["heat-steps-out"]
    assert d["passed"], d


def test_launcher_without_a_device_is_unavailable_in_one_line(child_results):
    d = child_results.get("refuses")
    if d is None:
        pytest.skip("a GPU is present: the launcher runs")
    assert d["passed"], d["summary"]


def test_examples_import_without_triton_or_numba():
    code = ("import sys\nimport gpuspeed.examples.heat_stencil, gpuspeed.examples.histogram, gpuspeed.examples.mandelbrot, "
            "gpuspeed.examples.pairwise_distance, gpuspeed.examples.row_stats, gpuspeed.examples.row_normalize_loop\n"
            "bad = [m for m in ('triton', 'numba') if m in sys.modules]\n"
            "assert not bad, bad\n"
            "v = gpuspeed.examples.heat_stencil.variants\n"
            "assert set(v) == {'triton', 'numba_cuda', 'triton_fp32'}, v\n"
            "assert v['triton'].gpuspeed_inputs == 'torch', v\n"
            "assert v['triton_fp32'].precision == 'float32' and not hasattr(v['triton'], 'precision')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_every_autotuned_kernel_times_its_configs_through_bench():
    # one timing path: the autotuner's pick must come from the same timer as the kernel's reported time
    code = ("import importlib, pkgutil, triton\n"
            "from triton.runtime.autotuner import Autotuner\n"
            "import gpuspeed.examples.hand_kernels as K\n"
            "found = []\n"
            "for m in pkgutil.iter_modules(K.__path__):\n"
            "    mod = importlib.import_module('gpuspeed.examples.hand_kernels.' + m.name)\n"
            "    for name, obj in vars(mod).items():\n"
            "        if isinstance(obj, Autotuner):\n"
            "            assert obj._do_bench is K.autotune_bench, (m.name, name)\n"
            "            found.append(name)\n"
            "assert len(found) >= 8, found\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("entry", ["gpuspeed.optimize.worker", "gpuspeed.examples.hand_kernels.heat_stencil",
                                   "gpuspeed.examples.heat_stencil", "gpuspeed.cli", "benchmarks/kernels.py"])
def test_every_path_to_a_numba_kernel_applies_the_numpy_shim_first(entry):
    # numba-cuda 0.68 on NumPy 2.5 (the H200 machine) needs np.row_stack, restored by `import gpuspeed` (compat.py):
    # the optimize worker, the kernel modules, the examples' lazy variants, `gpuspeed kernel` and the benchmark each
    # import gpuspeed before a kernel can compile. Here NumPy loses the alias and numba-cuda is made to look present.
    load = (f"import runpy; m = runpy.run_path({str(ROOT / entry)!r}, run_name='bench'); "
            "import importlib; importlib.import_module('gpuspeed.examples.hand_kernels.histogram')"
            if entry.endswith(".py") else f"import {entry}")
    code = ("import importlib.util, numpy as np\n"
            "real = importlib.util.find_spec\n"
            # (a real numba-cuda keeps its own spec: its import hook reads it)
            "importlib.util.find_spec = lambda name, *a: (real(name, *a) or object()) if name == 'numba_cuda' "
            "else real(name, *a)\n"
            "if hasattr(np, 'row_stack'):\n    del np.row_stack\n"
            "assert not hasattr(np, 'row_stack')\n"
            f"{load}\n"
            "assert np.row_stack is np.vstack, 'not restored'\n")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT / "src"), TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_every_kernel_docstring_holds_a_tuning_note():
    for path in (ROOT / "src/gpuspeed/examples/hand_kernels").glob("*.py"):
        if path.name == "__init__.py":
            continue
        text = path.read_text()
        # the launched kernels (not helpers: plain @triton.jit, @cuda.jit(device=True))
        kernels = text.count("@triton.autotune") + text.count("@cuda.jit\n")
        assert text.count("Tuning note (gpuspeed kernel, H200, commit ") >= kernels, path.name


def _run_kernels_benchmark(tmp_path, *argv, **env):
    """benchmarks/kernels.py in a fresh process without a GPU, run in tmp_path (env: extra variables)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", **env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT / "src"), env.get("PYTHONPATH")] if p)
    return subprocess.run([sys.executable, str(ROOT / "benchmarks/kernels.py"), *argv], capture_output=True, text=True,
                          env=env, timeout=300, cwd=tmp_path)


def _kernels_benchmark_module():
    """benchmarks/kernels.py imported as a module (its helpers, without running it)."""
    spec = importlib.util.spec_from_file_location("bench_kernels", ROOT / "benchmarks/kernels.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_kernels_benchmark_runs_on_the_cpu_with_a_note(tmp_path):
    pytest.importorskip("triton")
    # mandelbrot: its simulated Numba kernel takes under a second at the interpreted scale, histogram's ~15 s here
    proc = _run_kernels_benchmark(tmp_path, "--examples", "mandelbrot", "--quick", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "kernels.json").read_text())
    assert doc["study"] == "kernels"
    assert {"kernels", "kernels_at_70pct_roof", "kernels_faster_than_auto"} <= set(doc["summary"])
    rows = {r["variant"]: r for r in doc["rows"]}
    assert set(rows) == {"triton", "numba_cuda"} and {r["example"] for r in doc["rows"]} == {"mandelbrot"}
    row, numba = rows["triton"], rows["numba_cuda"]
    assert row["correct"] is True
    assert row["time_s"] is None and any("no GPU" in n for n in doc["notes"])
    assert row["rule"] == "no_gpu" and "scaled_up" not in row and doc["params"]["scale_up"] == 64.0
    # the Numba kernel runs under the simulator where numba-cuda is installed, and is a skipped row elsewhere
    ran = "skipped" not in numba
    assert numba["correct"] is True if ran else "numba-cuda is not installed" in numba["skipped"]
    assert doc["summary"]["kernels"] == doc["summary"]["kernels_correct"] == 1 + ran


@pytest.mark.parametrize("earlier_device", [None, "this one", "NVIDIA H200"])
def test_kernels_benchmark_keeps_other_examples_rows_with_their_own_commit(tmp_path, numba_hidden_path,
                                                                           earlier_device):
    # several calls make one kernels.json: a kept row says which commit measured it, the new rows theirs; rows that
    # another device measured are not merged into this one's file
    pytest.importorskip("triton")
    earlier = {"study": "kernels", "git": "a" * 40, "rows": [{"example": "histogram", "variant": "triton"}]}
    if earlier_device:
        earlier["device"] = {"name": _kernels_benchmark_module_device() if earlier_device == "this one"
                             else earlier_device}
    (tmp_path / "kernels.json").write_text(json.dumps(earlier))
    # numba hidden: row_stats' simulated kernel (~40 s here) is not what is checked here (the test above runs one)
    proc = _run_kernels_benchmark(tmp_path, "--examples", "row_stats", "--quick", "--out", str(tmp_path),
                                  GPUSPEED_GIT="b" * 40, PYTHONPATH=numba_hidden_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "kernels.json").read_text())
    rows = {(r["example"], r["variant"]): r for r in doc["rows"]}
    assert doc["git"] == "b" * 40 and rows["row_stats", "triton"]["git"] == "b" * 40
    if earlier_device != "this one":  # another device's rows, or rows of no device recorded
        assert ("histogram", "triton") not in rows
        assert any(f"measured on {earlier_device or 'an unrecorded device'}, this run on" in n and "not kept" in n
                   for n in doc["notes"])
        return
    assert rows["histogram", "triton"]["git"] == "a" * 40
    assert any("rows kept from an earlier call: histogram (at aaaaaaa" in n for n in doc["notes"])


def _kernels_benchmark_module_device() -> str:
    """The device name benchmarks/kernels.py records here without a GPU (the CPU's)."""
    from gpuspeed.device import get_device

    return get_device("cpu").name


def test_kernels_benchmark_reports_the_float32_variant_in_the_same_columns(tmp_path):
    pytest.importorskip("triton")
    proc = _run_kernels_benchmark(tmp_path, "--examples", "row_normalize_loop", "--quick", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["variant"]: r for r in json.loads((tmp_path / "kernels.json").read_text())["rows"]}
    f64, f32 = rows["triton"], rows["triton_fp32"]
    assert set(f64) == set(f32)  # the same columns
    assert (f64["precision"], f32["precision"]) == ("as-written", "float32")
    assert f32["correct"] is True and "PASS" in f32["check"] and "max abs 0," not in f32["check"]  # float32 rounding
    assert f32["bytes"] * 2 == f64["bytes"]  # 4 bytes an element


def test_kernels_benchmark_refuses_an_unknown_example_in_one_line(tmp_path):
    proc = _run_kernels_benchmark(tmp_path, "--examples", "softmax", "--out", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.startswith("gpuspeed: error: no hand kernels for softmax")
    assert "Traceback" not in proc.stderr


def test_kernels_benchmark_refuses_a_negative_scale_up_in_one_line(tmp_path):
    proc = _run_kernels_benchmark(tmp_path, "--examples", "row_stats", "--scale-up", "-2", "--out", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.startswith("gpuspeed: error: --scale-up must be 0 (off) or positive")
    assert "Traceback" not in proc.stderr and not (tmp_path / "kernels.json").exists()


def test_kernels_benchmark_scales_up_only_kernels_their_launch_size_holds_back():
    # launch-bound, or as fast as copies of the same bytes per launch: timed again on larger inputs (on a GPU)
    bench = _kernels_benchmark_module()
    assert bench.limited_by_launch_size({"rule": "launch_bound", "time_s": 6.7e-6})
    assert bench.limited_by_launch_size({"rule": "at_copy", "time_s": 1.1e-5})
    assert not bench.limited_by_launch_size({"rule": "own_work", "time_s": 2e-4})
    assert not bench.limited_by_launch_size({"rule": "tune", "time_s": 8e-4})
    assert not bench.limited_by_launch_size({"rule": "no_gpu", "time_s": None})  # interpreted: nothing to scale


def test_kernels_benchmark_picks_the_best_automatic_candidate():
    # an optimize document: the hand variants and the original are not "automatic"; failed candidates do not count
    bench = _kernels_benchmark_module()
    doc = {"rows": [{"name": "original", "backend": "original", "status": "ok", "device_s": 2.0},
                    {"name": "cupy", "backend": "cupy", "status": "ok", "device_s": 8e-3},
                    {"name": "torch-compile-fp32", "backend": "torch_compile", "status": "ok", "device_s": 9e-4},
                    {"name": "jax", "backend": "jax", "status": "incorrect", "device_s": 1e-5},
                    {"name": "variant:triton", "backend": "variant", "status": "ok", "device_s": 3e-4},
                    {"name": "variant:numba_cuda", "backend": "variant", "status": "error", "device_s": None}]}
    variants, best, same = bench.candidates(doc)
    assert variants == {"triton": 3e-4} and best == ("torch-compile-fp32", 9e-4) and same == ("cupy", 8e-3)
    # a float32 variant's like for like: the float32-demoted candidates
    assert bench.candidates(doc, fp32=True)[2] == ("torch-compile-fp32", 9e-4)
    rows = [{"example": "e", "time_s": 1e-4, "at_70pct_roof": True, "correct": True, "speedup_vs_auto": 3.0},
            {"example": "e", "time_s": 2e-4, "at_70pct_roof": False, "correct": True, "speedup_vs_auto": 0.5},
            {"example": "f", "time_s": 1e-3, "at_70pct_roof": False, "correct": True, "speedup_vs_auto": 0.9}]
    s = bench.summarize(rows)
    assert (s["kernels"], s["kernels_at_70pct_roof"], s["kernels_faster_than_auto"]) == (3, 1, 1)
    assert s["examples_faster_than_auto"] == 1 and s["examples"] == 2
    # nothing compared (no optimize run, or another GPU's): how many are faster is unknown, not 0
    s = bench.summarize([dict(r, speedup_vs_auto=None) for r in rows])
    assert s["kernels_faster_than_auto"] is None and s["examples_faster_than_auto"] is None
    assert s["kernels_faster_than_auto_same_precision"] is None and s["geomean_speedup_vs_auto"] is None


def test_kernels_benchmark_compares_only_with_an_optimize_run_on_the_same_gpu(tmp_path):
    # an H100 kernel time over an H200 optimize run's time is no speedup: the document is not used, and says why
    bench = _kernels_benchmark_module()
    doc = {"params": {"workload": "src/gpuspeed/examples/histogram.py"}, "device": {"name": "NVIDIA H200"},
           "rows": [{"name": "cupy", "backend": "cupy", "status": "ok", "device_s": 5e-4}]}
    (tmp_path / "histogram").mkdir()
    (tmp_path / "histogram" / "optimize_histogram.json").write_text(json.dumps(doc))
    a = argparse.Namespace(optimize_json=str(tmp_path))
    h100, h200 = (argparse.Namespace(kind="cuda", name=n) for n in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"))
    got, source = bench.optimize_doc("histogram", a, tmp_path, h100)
    assert got is None
    assert "measured on NVIDIA H200, this run on NVIDIA H100 80GB HBM3: no speedup" in source
    got, source = bench.optimize_doc("histogram", a, tmp_path, h200)
    assert got == doc and source.startswith("read from")
    del doc["device"]  # a document that records no device is not taken to be this one's
    (tmp_path / "histogram" / "optimize_histogram.json").write_text(json.dumps(doc))
    got, source = bench.optimize_doc("histogram", a, tmp_path, h200)
    assert got is None and "an unrecorded device" in source
    (tmp_path / "histogram" / "optimize_histogram.json").write_text(json.dumps(doc)[:40])  # cut short
    got, source = bench.optimize_doc("histogram", a, tmp_path, h200)
    assert got is None and "is not a readable results file (JSONDecodeError)" in source


if __name__ == "__main__":
    sys.exit(child_main())


@pytest.mark.parametrize("variant,fp32,passes", [("triton", False, 40), ("triton_fp32", True, 40), ("numba_cuda", False, 40)])
def test_kernels_benchmark_counts_the_stencils_bytes_per_pass(variant, fp32, passes):
    # every stencil kernel reads and writes the grid once per step (a launch a step), 4 bytes a point in float32
    bench = _kernels_benchmark_module()
    grid = np.random.default_rng(0).random((64, 32))  # only its shape counts
    _, nbytes = bench.work("heat_stencil", variant, (grid, 0.2, 40), fp32=fp32)
    assert nbytes == 2 * (4 if fp32 else 8) * 64 * 32 * passes


def test_kernel_notes_refuses_a_missing_or_foreign_file_in_one_line(tmp_path):
    # nothing is pasted into the kernels' docstrings from a file that is not a kernels.json
    foreign = tmp_path / "other.json"
    foreign.write_text(json.dumps({"study": "decode"}))
    for argv in ([str(tmp_path / "missing.json")], [str(foreign)], []):
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/kernel_notes.py"), *argv], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
        assert not proc.stdout  # no kernel was touched
