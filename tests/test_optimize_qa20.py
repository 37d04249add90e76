"""QA round 20, optimize: section D on a CPU-only run, and the emitted script as users run and import it."""
from __future__ import annotations

import numpy as np
import pytest

from gpuspeed.optimize import workload as W


def _timed(median_s):
    return {"median": median_s, "iqr": 0.0, "n": 9}


def _original(device_time=None, **fields):
    """The original's row of an optimize run, timed at 100 us a call."""
    timed = _timed(1e-4)
    return {"status": "ok", "recipe": {"backend": "original"}, "label": "the original",
            "device_time": device_time or timed, "e2e_time": timed, **fields}


def _report(tmp_path, where, results, primary="original"):
    """Sections A-E of a run of a small workload on `where`, with `results` and `primary` (the original: kept)."""
    from gpuspeed.optimize.pipeline import OptimizeRun
    from gpuspeed.optimize.report import markdown

    path = tmp_path / "scale.py"
    path.write_text("import numpy as np\n\ndef original(x):\n    return x * 2.0\n\n"
                    "def inputs(rng):\n    return (rng.standard_normal((64, 8)),)\n")
    run = OptimizeRun(wl=W.load(path, gpu=False), where=where, out_dir=tmp_path, results=results,
                      params={"target_gpu": "RTX 4070 Laptop", "budget": "8GiB", "seeds": [1, 2, 3]},
                      choice={"primary": primary, "kept_original": primary == "original"})
    return markdown(run)


def test_a_cpu_only_runs_section_d_names_no_gpu_bandwidth_roof(tmp_path):
    # a CPU-only run said "% of bw roof ... against this GPU's datasheet bandwidth" above a column of dashes
    section_d = _report(tmp_path, "cpu", {"original": _original()}).split("## D")[1].split("### Plan")[0]
    assert "GPU's datasheet" not in section_d and "bw roof" not in section_d, section_d
    header = next(ln for ln in section_d.splitlines() if ln.startswith("| candidate"))
    row = next(ln for ln in section_d.splitlines() if ln.startswith("| original"))
    assert header.count("|") == row.count("|"), (header, row)
    assert "No GPU here, so no bandwidth roof" in section_d, section_d


@pytest.mark.gpu
def test_a_gpu_runs_section_d_keeps_its_bandwidth_roof_column(tmp_path):
    section_d = _report(tmp_path, "cuda", {"original": _original(pct_of_bw_roof=41.5)}).split("## D")[1].split("### Plan")[0]
    assert "% of bw roof" in section_d and "| 42 % |" in section_d, section_d


# --- the emitted script on argument dtypes its optimized code cannot take ---

SMOOTH = '''
import numpy as np


def original(x, alpha):
    out = np.empty_like(x)
    out[0] = x[0]
    for i in range(1, x.shape[0]):
        out[i] = alpha * x[i] + (1 - alpha) * out[i - 1]
    return out


def inputs(rng):
    return rng.standard_normal((40, 3)), 0.3
'''


def _script_module(tmp_path, text, recipe):
    """The optimized script `optimize` writes for the workload `text` with a primary of `recipe`, imported as a
    user's module beside it imports it (`import optimized_smooth`)."""
    import importlib.util

    from gpuspeed.optimize import emit
    from gpuspeed.optimize.pipeline import OptimizeRun

    path = tmp_path / "smooth.py"
    path.write_text(text)
    timed = _timed(1e-4)
    results = {name: {"status": "ok", "recipe": rec, "label": name, "device_time": timed, "e2e_time": timed}
               for name, rec in (("original", {"name": "original", "backend": "original"}), (recipe["name"], recipe))}
    run = OptimizeRun(wl=W.load(path, gpu=False), where="cpu", out_dir=tmp_path, results=results,
                      params={"target_gpu": "RTX 4070 Laptop", "budget": "8GiB", "seeds": [1, 2, 3],
                              "cwd": str(tmp_path)},
                      choice={"primary": recipe["name"]})
    script = emit.write(run)
    spec = importlib.util.spec_from_file_location(script.stem, script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_numba_primary_on_float16_or_object_arrays_gives_the_originals_answer(tmp_path, capsys):
    # Numba has no float16 and no object arrays: after a float64 call, the second call on float16 arrays (the first
    # is the original's, to learn its output) raised a bare `NotImplementedError: float16` (TypingError for object
    # arrays) where the original answers
    pytest.importorskip("numba")
    opt = _script_module(tmp_path, SMOOTH, {"name": "numba-serial", "backend": "numba", "precision": "as-written",
                                            "parallel": False})
    fn, _ = opt.build_optimized()
    rng = np.random.default_rng(20)
    x = rng.standard_normal((12, 3))
    assert np.array_equal(fn(x, 0.3), opt.pristine_original()(x, 0.3))
    for dtype in (np.float16, object):
        xs = x.astype(dtype)
        want = opt.pristine_original()(xs, 0.3)
        for _ in range(3):
            got = fn(xs, 0.3)
            assert got.dtype == want.dtype and np.array_equal(got, want), dtype
    err = capsys.readouterr().err
    assert err.count("the original answers these calls") == 2, err
    # a caller's own mistake is the original's error, as before
    with pytest.raises(TypeError):
        fn(x.astype(np.float32), None)


def test_a_cpu_only_runs_hotspots_say_nothing_of_transfers(tmp_path):
    # a CPU-only run's "Hotspots of the original" said "transfers: ... keep data on the GPU between calls when the
    # transfer dominates": nothing moves there, its two times are one call's
    from optimize_script_helpers import optimize_text

    run = optimize_text(tmp_path, "double", "import numpy as np\n\ndef original(x):\n    return np.sin(x) * 2.0\n\n"
                        "def inputs(rng):\n    return (rng.standard_normal((16, 4)),)\n", ["numpy"])
    hotspots = (run.out_dir / "report.md").read_text().split("### Hotspots of the original")[1].split("###")[0]
    assert "op-bound" in hotspots and "transfer" not in hotspots, hotspots


def test_section_e_of_a_cpu_only_run_names_no_gpu_tools_for_a_script_that_runs_on_the_cpu(tmp_path):
    # a CPU-only run's section E told the user to time the script with torch.cuda.Event and CuPy events and to run
    # nsys and ncu on it: its primary runs on the CPU, where they find no kernels
    section_e = _report(tmp_path, "cpu", {"original": _original()}).split("## E")[1]
    for gpu_tool in ("torch.cuda.Event", "cupy.cuda.Event", "nsys profile", "ncu --set"):
        assert gpu_tool not in section_e, (gpu_tool, section_e)
    assert "python -m cProfile" in section_e and "--bench" in section_e and "runs on the CPU" in section_e, section_e


@pytest.mark.gpu
def test_section_e_of_a_gpu_run_keeps_its_gpu_tools_for_a_primary_on_the_gpu(tmp_path):
    timed = _timed(1e-4)
    results = {"original": _original(device_time=timed | {"mode": "cpu"}),
               "cupy": {"status": "ok", "recipe": {"name": "cupy", "backend": "cupy"}, "label": "CuPy drop-in",
                        "device_time": timed | {"mode": "events"}, "e2e_time": timed,
                        "max_abs_err": 1e-9, "rel_l2_err": 1e-12}}  # a checked candidate, as every primary is
    section_e = _report(tmp_path, "cuda", results, primary="cupy").split("## E")[1]
    assert "nsys profile" in section_e and "ncu --set" in section_e and "runs on the CPU" not in section_e, section_e


DISTANCE = '''
import numpy as np

TOLERANCE = dict(rtol=1e-4, atol=1e-6)


def original(x, y):
    return np.sqrt(((x[:, None, :] - y[None, :, :]) ** 2).sum(-1))


def inputs(rng):
    return rng.standard_normal((20, 3)), rng.standard_normal((10, 3))
'''


def test_a_float32_primary_on_values_float32_cannot_hold_gives_the_originals_answer(tmp_path, capsys):
    # the float32 primary squared 1e30-sized distances into inf: it returned inf where the original returns ~2e30
    opt = _script_module(tmp_path, DISTANCE, {"name": "numpy-fp32", "backend": "numpy", "precision": "float32"})
    fn, _ = opt.build_optimized()
    rng = np.random.default_rng(20)
    x, y = rng.standard_normal((5, 3)), rng.standard_normal((4, 3))
    assert np.allclose(fn(x, y), opt.pristine_original()(x, y), rtol=1e-4)
    for _ in range(2):
        big = fn(x * 1e30, y * 1e30)
        want = opt.pristine_original()(x * 1e30, y * 1e30)
        assert np.isfinite(big).all() and np.array_equal(big, want), big
    assert capsys.readouterr().err.count("the original answers such calls") == 1
