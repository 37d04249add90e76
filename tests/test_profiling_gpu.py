"""Profiler on a GPU: every planted finding is reported with the right count and source line."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from planted import expect  # noqa: E402

pytestmark = pytest.mark.gpu


def _assert_found(rows):
    assert rows and all(r["found"] for r in rows), rows


def test_item_syncs_gpu():
    _assert_found(expect.check_item("cuda"))


def test_scalar_syncs_gpu():
    """if (x > 100).any(), int(t), float(t), bool(t), while t.sum() > 0: each a sync at its own line."""
    rows = expect.check_scalar_syncs("cuda")
    assert len(rows) == 5
    _assert_found(rows)


def test_tiny_kernel_run_gpu():
    _assert_found(expect.check_tiny())


def test_transfers_gpu():
    _assert_found(expect.check_transfers(mib=16))


def test_dominant_kernel_gpu():
    _assert_found(expect.check_big_kernel(n=2048))


def test_python_hotspot_gpu_machine():
    _assert_found(expect.check_hotspot("cuda", n=60, line_backend="settrace"))


def test_busy_idle_and_gaps_gpu():
    import torch

    from planted import workloads as w

    from gpuspeed.profiling import profile

    res = profile(w.tiny_kernels, torch.randn(256, device="cuda"), steps=3, hotspots=False)
    bi, gaps = res.findings["busy_idle"], res.findings["launch_gaps"]
    assert 0 < bi["busy_share"] < 1 and abs(bi["busy_s"] + bi["idle_s"] - bi["window_s"]) < 1e-9
    assert bi["idle_host_s"] > 0.5 * bi["idle_s"]  # a Python loop of tiny launches starves the GPU
    assert gaps["count"] >= 3 * (w.TINY_KERNELS - 1) and gaps["largest"]
    assert any(r["finding"] == "launch_bound" for r in res.recommendations)


def test_function_inputs_follow_its_array_library_gpu(tmp_path, capsys):
    """A CuPy function gets CuPy arrays on the GPU, a NumPy one NumPy arrays (and no false host sync)."""
    import json

    from gpuspeed.cli import main

    pytest.importorskip("cupy")
    for lib, check in (("cupy", "import cupy as xp"), ("numpy", "import numpy as xp")):
        src = tmp_path / f"{lib}_user_code_gpu.py"
        src.write_text(f"{check}\n\ndef f(x):\n    assert isinstance(x, xp.ndarray), type(x)\n"
                       "    return xp.sqrt(xp.asarray(x) * x)\n")
        rc = main(["profile", "--function", f"{src}:f", "--input", "x=float32[4096]", "--no-hotspots", "--json"])
        captured = capsys.readouterr()
        assert rc == 0, captured.err
        doc = json.loads(captured.out)
        assert doc["params"]["backend"] == lib
        if lib == "numpy":
            assert doc["findings"]["host_syncs"]["total"] == 0
