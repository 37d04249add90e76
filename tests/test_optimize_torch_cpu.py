"""optimize on PyTorch code without a GPU: torch.compile on the CPU (Inductor's C++/OpenMP code) is planned,
checked and timed like any candidate, and an emitted script whose primary it is runs it on the CPU."""

import subprocess
import sys
import textwrap
import types

import pytest

from gpuspeed.optimize import candidates as C, workload
from gpuspeed.optimize.pipeline import optimize

pytest.importorskip("torch")

GELU_LN = '''
import torch

TOLERANCE = dict(rtol=1e-4, atol=1e-5)  # float32 allowed


def original(x, w):
    h = torch.nn.functional.gelu(x * w) + torch.tanh(x) * 0.5
    return torch.nn.functional.layer_norm(h, (x.shape[-1],))


def inputs(rng):
    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
    return torch.randn(64, 96, generator=gen, dtype=torch.float64), torch.randn(96, generator=gen, dtype=torch.float64)
'''


def _file(tmp_path):
    p = tmp_path / "gelu_ln.py"
    p.write_text(textwrap.dedent(GELU_LN))
    return p


def test_plan_without_a_gpu_compiles_pytorch_code_on_the_cpu(tmp_path):
    wl = workload.load(_file(tmp_path), gpu=False)
    rows, recs = C.plan(wl, "cpu", {"float64": True})
    rows = {r["key"]: r for r in rows}
    assert rows["torch"]["decision"] == "tried" and "on the CPU" in rows["torch"]["why"]
    by_name = {r["name"]: r for r in recs}
    assert by_name["torch-compile-cpu"] == {"name": "torch-compile-cpu", "backend": "torch", "precision": "as-written",
                                            "mode": "default", "device": "cpu"}
    assert by_name["torch-compile-cpu-fp32"]["precision"] == "float32"
    _, gpu_recs = C.plan(wl, "cuda", {"float64": True})  # a GPU run keeps its own torch recipes
    assert not any(r.get("device") == "cpu" for r in gpu_recs) and any(r["name"] == "torch-cuda" for r in gpu_recs)


@pytest.mark.slow
def test_torch_compile_on_the_cpu_is_checked_and_timed(tmp_path):
    # float32 inputs: one compile (the float64 -> float32 demotion is the GPU torch candidates' own path)
    p = tmp_path / "gelu_ln32.py"
    p.write_text(textwrap.dedent(GELU_LN).replace("torch.float64", "torch.float32"))
    run = optimize(p, device="cpu", out=tmp_path / "out", backends=["torch"], time_budget=240, bench_budget_s=0.1)
    assert set(run.results) == {"original", "torch-compile-cpu"}
    for name, r in run.results.items():
        assert r["status"] == "ok" and r["device_time"]["median"] > 0, (name, r.get("status"), r.get("reason"))
    assert "PyTorch on cpu" in run.results["torch-compile-cpu"]["label"]


@pytest.mark.slow
def test_emitted_script_runs_a_cpu_compiled_primary_on_the_cpu(tmp_path):
    from gpuspeed.optimize import emit

    wl = workload.load(_file(tmp_path), gpu=False)
    rec = {"name": "c", "backend": "torch", "precision": "as-written", "mode": "default", "device": "cpu"}
    row = {"name": "c", "recipe": rec, "status": "ok", "label": "x", "device_time": {"median": 1e-3}}
    run = types.SimpleNamespace(wl=wl, where="cpu", out_dir=tmp_path, params={"seeds": [1, 2, 3]},
                                choice={"primary": "c"}, results={"c": row, "original": row})
    text = emit.script_text(run)
    assert "Without torch it falls back to the original." in text and "compiled by torch.compile on the CPU" in \
        emit.implementation_source(run, "c")
    script = tmp_path / "optimized_gelu_ln.py"
    script.write_text(text)
    r = subprocess.run([sys.executable, str(script), "--cpu"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "correctness: PASS" in r.stdout, r.stdout + r.stderr
    assert r.stdout.splitlines()[0] == "optimized original: PyTorch on cpu (default, as-written)"


MIXED = '''
import torch


def original(x, w):
    bias = torch.ones(x.shape[-1], dtype=x.dtype)  # made by the original itself
    return torch.tanh(x) * w + bias


def inputs(rng):
    return torch.from_numpy(rng.standard_normal((8, 5))), torch.full((5,), 0.5, dtype=torch.float64)
'''


def test_emitted_script_keeps_the_originals_tensors_on_the_cpu_under_another_default_device(tmp_path):
    """A torch backend sets the default device to the GPU (the H200 run of an emitted script then made the
    inputs' torch.full on the GPU beside from_numpy's CPU tensors, and the reference call failed): inputs() and
    the original run on the CPU whatever the default device. "meta" stands in for the GPU here."""
    import importlib.util

    import torch

    from gpuspeed.optimize import emit

    p = tmp_path / "mixed.py"
    p.write_text(textwrap.dedent(MIXED))
    wl = workload.load(p, gpu=False)
    row = {"name": "c", "recipe": {"name": "c", "backend": "original", "precision": "as-written"}, "status": "ok",
           "label": "x", "device_time": {"median": 1e-3}}
    run = types.SimpleNamespace(wl=wl, where="cpu", out_dir=tmp_path, params={"seeds": [1, 2, 3]},
                                choice={"primary": "c"}, results={"c": row, "original": row})
    script = tmp_path / "optimized_mixed.py"
    script.write_text(emit.script_text(run))
    spec = importlib.util.spec_from_file_location("optimized_mixed_t", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    module = mod.load_workload("_t")

    def on_cpu(*args):  # the "optimized" function: the original, kept on the CPU itself
        with torch.device("cpu"):
            return module.original(*args)

    torch.set_default_device("meta")
    try:
        args = mod.make_args(module, 3)
        assert all(a.device.type == "cpu" for a in args)
        assert mod.check_against_original(on_cpu)
    finally:
        torch.set_default_device(None)
