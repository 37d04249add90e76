"""gpuspeed optimize on a GPU (`make gpu-test`): drop-ins measured and checked, the budget enforced with
chunking over two streams, the red-team variants that need a device, and the emitted script on the GPU."""

import importlib
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuspeed.optimize.pipeline import optimize

pytestmark = pytest.mark.gpu
HAS_CUPY = importlib.util.find_spec("cupy") is not None


def test_black_scholes_on_the_gpu(tmp_path):
    run = optimize("black_scholes", device="cuda", scale=0.1, out=tmp_path / "bs", time_budget=300,
                   bench_budget_s=0.3, backends=["cupy", "torch_compile", "numpy"])
    res = run.results
    assert res["original"]["status"] == "ok"
    assert res["torch-compile"]["status"] == "ok", res["torch-compile"].get("reason")
    if HAS_CUPY:
        assert res["cupy"]["status"] == "ok", res["cupy"].get("reason")
        assert res["cupy-fp32"]["status"] == "ok", res["cupy-fp32"].get("reason")  # TOLERANCE allows float32
    prim = res[run.choice["primary"]]
    assert run.choice["primary"] != "original" and prim["speedup"]["speedup"] > 1
    assert prim["peak_bytes"] > 0 and prim.get("fits_budget") is not False  # a CPU primary has no VRAM verdict
    assert run.choice["over_best_dropin"] >= 1.0  # the primary is at least as fast as the best plain drop-in
    assert run.projection.get("memory_bound_s")  # projected onto the RTX 4070 Laptop
    script = Path(run.paths["script"])
    r = subprocess.run([sys.executable, str(script), "--bench"], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0 and "correctness: PASS" in r.stdout, r.stdout + r.stderr
    assert "original on the CPU" not in r.stdout.splitlines()[0]  # it ran the GPU path


@pytest.mark.skipif(not HAS_CUPY, reason="needs CuPy")
def test_pairwise_over_budget_is_chunked(tmp_path):
    # the naive CuPy drop-in materializes the (n, m, 32) difference: over a 256 MiB budget it fails or does not
    # fit, and its chunked re-run (planner's chunk, two streams) passes within the budget
    run = optimize("pairwise_distance", device="cuda", scale=0.1, budget="256MiB", out=tmp_path / "pw",
                   backends=["cupy"], time_budget=400, bench_budget_s=0.5)
    assert run.results["cupy"]["status"] in ("oom", "over_budget"), run.results["cupy"].get("reason")
    good = run.results.get("cupy+chunked", {})
    assert good.get("status") == "ok", (good.get("status"), good.get("reason"), run.chunking)
    assert good.get("fits_budget") is True and good["chunk_size"] >= 1
    assert run.chunking["axes"] == {0: 0}
    # the plan was checked on the two-stream pipeline itself (and re-planned from its peak if over)
    assert any("the pipeline itself" in n for n in good.get("notes", [])), good.get("notes")
    assert good["peak_bytes"] <= 256 * 2**20 * 0.85


@pytest.mark.skipif(not HAS_CUPY, reason="needs CuPy")
def test_cupy_fuse_trace_failure_is_unavailable_with_its_reason():
    import types

    import numpy as np

    from gpuspeed.optimize import worker
    from gpuspeed.optimize.backends import cupy_dropin

    mod = types.ModuleType("fuse_slices")
    exec("import numpy as np\ndef original(u, alpha):\n    u = np.array(u, dtype=np.float64)\n"
         "    u[1:-1] = u[1:-1] + alpha * (u[:-2] + u[2:] - 2.0 * u[1:-1])\n    return u\n", mod.__dict__)
    impl = cupy_dropin.build(mod, fuse=True)
    with pytest.raises(ImportError) as info:
        impl(np.random.default_rng(0).random(101), 0.2)
    assert worker.classify(info.value) == "unavailable" and "cupy.fuse cannot trace original" in str(info.value)
    ok = types.ModuleType("fuse_ok")
    exec("import numpy as np\ndef original(x, y):\n    return np.exp(-x * x) * y + 1.0\n", ok.__dict__)
    x, y = np.random.default_rng(1).standard_normal((2, 1001))
    got = cupy_dropin.build(ok, fuse=True)(x, y)
    np.testing.assert_allclose(got, np.exp(-x * x) * y + 1.0, rtol=1e-12, atol=0)


PAIRWISE = """
import numpy as np

def original(a, b):
    d = a[:, None, :] - b[None, :, :]
    return np.sqrt((d * d).sum(-1)), a.sum(axis=1)
"""


@pytest.mark.parametrize("backend", ["cupy", "torch_compile"])
def test_chunk_pipelines_match_the_whole(backend):
    import types

    import numpy as np

    from gpuspeed.optimize.backends import chunking
    from gpuspeed.optimize.worker import BACKEND_MODULES

    if backend == "cupy" and not HAS_CUPY:
        pytest.skip("needs CuPy")
    mod = types.ModuleType("pw_" + backend)
    exec(PAIRWISE, mod.__dict__)
    build = importlib.import_module(f"gpuspeed.optimize.backends.{BACKEND_MODULES[backend]}").build
    impl = build(mod, device="cuda")
    rng = np.random.default_rng(0)
    args = (rng.standard_normal((1000, 8)), rng.standard_normal((300, 8)))
    whole = impl(*args)
    library = {"cupy": "cupy", "torch_compile": "torch"}[backend]
    pipe = chunking.chunked(impl, {0: 0}, [0, 0], 128, library)
    for _ in range(2):  # the second call reuses the pipeline's two streams and their cached blocks
        parts = pipe(*args)  # 8 chunks, the last one short
        for w, c in zip(whole, parts, strict=True):
            assert c.shape == w.shape and c.dtype == w.dtype
            np.testing.assert_allclose(c, w, rtol=1e-12, atol=1e-12)


REDTEAM_GPU = '''
import numpy as np
import torch

TOLERANCE = dict(rtol=1e-5, atol=1e-6)
_cache = {}


def original(x, w):
    return np.sin(x) * w


def inputs(rng):
    return rng.standard_normal(1 << 20), 1.5


def honest(x, w):
    return torch.sin(x) * w


def other_stream_no_sync(x, w):
    side = torch.cuda.Stream()
    out = torch.empty_like(x)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of spinning before the write
        out.copy_(torch.sin(x) * w)
    return out


def half_unwritten(x, w):
    out = torch.empty_like(x)
    half = x.shape[0] // 2
    out[:half] = torch.sin(x[:half]) * w
    return out


def cached(x, w):
    if "r" not in _cache:
        _cache["r"] = torch.sin(x) * w
    return _cache["r"]


def out_of_memory(x, w):
    big = torch.empty(200 * 2**30, dtype=torch.uint8, device=x.device)
    return torch.sin(x) * w + big[0]


def gpu_hang(x, w):
    torch.cuda._sleep(1 << 62)
    return torch.sin(x) * w


def illegal_address(x, w):
    import cupy as cp

    k = cp.RawKernel(r'extern "C" __global__ void bad(float* p) { p[1ll << 40] = 1.0f; }', "bad")
    k((1,), (1,), (cp.zeros(1, dtype=cp.float32),))
    cp.cuda.Device().synchronize()
    return torch.sin(x) * w


variants = {}
for _name, _fn in list(globals().items()):
    if callable(_fn) and _name not in ("original", "inputs") and not _name.startswith("_") and \\
            getattr(_fn, "__module__", None) == __name__:
        _fn.gpuspeed_inputs = "torch"
        variants[_name] = _fn
'''


def test_redteam_on_the_gpu(tmp_path):
    p = tmp_path / "redteam_gpu.py"
    p.write_text(textwrap.dedent(REDTEAM_GPU))
    run = optimize(p, device="cuda", out=tmp_path / "out", backends=["variant"], time_budget=400,
                   candidate_limit_s=45, bench_budget_s=0.3)
    got = {n.split(":", 1)[1]: r for n, r in run.results.items() if n.startswith("variant:") and "+" not in n}
    expected = {"honest": "ok", "other_stream_no_sync": "incorrect", "half_unwritten": "incorrect",
                "cached": "incorrect", "out_of_memory": "oom", "gpu_hang": "timeout"}
    if HAS_CUPY:
        expected["illegal_address"] = "crashed"
    for name, status in expected.items():
        assert got[name]["status"] == status, (name, got[name]["status"], got[name].get("reason"))
    assert "another stream" in got["other_stream_no_sync"]["reason"]
    assert run.choice["primary"] in ("variant:honest", "original")
    assert all(r["status"] != "ok" for n, r in run.results.items() if n.startswith("variant:") and "honest" not in n)


HEAT_STEP = '''
import numpy as np

TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def original(u, out, alpha):
    """One explicit heat step of u, written into the caller's `out` (returns None)."""
    out[:] = u
    out[1:-1, 1:-1] = u[1:-1, 1:-1] + alpha * (u[2:, 1:-1] + u[:-2, 1:-1] + u[1:-1, 2:] + u[1:-1, :-2]
                                                 - 4 * u[1:-1, 1:-1])


def inputs(rng):
    return rng.standard_normal((2001, 1003)), np.full((2001, 1003), 7.0), 0.1
'''

TORCH_OUT = '''
import torch

TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def original(x, w, out):
    """tanh(x) @ w written into the caller's `out` (returns None)."""
    torch.matmul(torch.tanh(x), w, out=out)


def inputs(rng):
    return (torch.from_numpy(rng.standard_normal((512, 256))), torch.from_numpy(rng.standard_normal((256, 128))),
            torch.full((512, 128), 7.0, dtype=torch.float64))
'''


@pytest.mark.parametrize("source, name, backends, must_pass", [
    (HEAT_STEP, "heat_step", ["cupy", "torch_compile"], ["torch-compile", "torch-compile-fp32"]
     + (["cupy", "cupy-fp32"] if HAS_CUPY else [])),
    (TORCH_OUT, "torch_out", ["torch"], ["torch-cuda", "torch-compile", "torch-cuda-fp32", "torch-compile-fp32"])])
def test_in_place_code_on_the_gpu(tmp_path, source, name, backends, must_pass):
    """Code that writes into its arguments: the device candidates write their device copies, which are
    checked; the emitted script's GPU path writes the result back into the caller's arrays and passes."""
    p = tmp_path / f"{name}.py"
    p.write_text(textwrap.dedent(source))
    run = optimize(p, device="cuda", out=tmp_path / "out", backends=backends, time_budget=400, bench_budget_s=0.3)
    statuses = {n: (r["status"], r.get("reason")) for n, r in run.results.items()}
    assert run.params["in_place"] and run.results["original"]["status"] == "ok", statuses
    for n in must_pass:
        assert run.results[n]["status"] == "ok", (n, statuses)
    assert not any(r.get("recipe", {}).get("graph") or r.get("recipe", {}).get("fuse") for r in run.results.values())
    r = subprocess.run([sys.executable, str(run.paths["script"]), "--bench"], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0 and "correctness: PASS" in r.stdout, r.stdout + r.stderr
    if run.choice["primary"] != "original":
        assert "original on the CPU" not in r.stdout.splitlines()[0]  # it ran the GPU path
    print(name, statuses, r.stdout)


SAFE_LOG = '''
import numpy as np

TOLERANCE = dict(rtol=1e-6, atol=1e-9)


def original(x):
    """log|x| with log(0) -> 0, silenced as NumPy users write it."""
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.log(np.abs(x))
    return np.where(np.isfinite(y), y, 0.0)


def inputs(rng):
    x = rng.standard_normal(1 << 20)
    x[::7] = 0.0
    return (x,)
'''


def test_numpy_errstate_runs_on_cupy_and_jax(tmp_path):
    """CuPy and jax.numpy have no errstate: the drop-ins answer it with NumPy's, so such code still runs."""
    p = tmp_path / "safe_log.py"
    p.write_text(textwrap.dedent(SAFE_LOG))
    run = optimize(p, device="cuda", out=tmp_path / "out", backends=["cupy", "jax"], time_budget=300,
                   bench_budget_s=0.3)
    statuses = {n: (r["status"], r.get("reason")) for n, r in run.results.items()}
    want = (["cupy"] if HAS_CUPY else []) + (["jax"] if importlib.util.find_spec("jax") else [])
    assert want, "needs CuPy or JAX"
    for n in want:
        assert run.results[n]["status"] == "ok", (n, statuses)
    print(statuses)


def test_emitted_script_runs_a_gpu_variant_primary_on_the_gpu(tmp_path):
    """histogram's hand Triton kernel takes torch inputs: chosen as the primary, the script must run it on the
    GPU (it cannot run on CPU tensors) and pass its own check there."""
    run = optimize("histogram", device="cuda", scale=0.02, out=tmp_path / "h", backends=["variant"], time_budget=200,
                   bench_budget_s=0.3)
    assert run.choice["primary"].startswith("variant:"), run.choice
    import os

    import gpuspeed

    # the example imports gpuspeed (its kernels live there), installed where a user runs it: here, src on the path
    env = dict(os.environ, PYTHONPATH=str(Path(gpuspeed.__file__).resolve().parents[1]))
    r = subprocess.run([sys.executable, str(run.paths["script"]), "--bench"], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path, env=env)
    assert r.returncode == 0 and "correctness: PASS" in r.stdout, r.stdout + r.stderr
    assert "original on the CPU" not in r.stdout.splitlines()[0], r.stdout
