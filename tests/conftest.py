"""Shared test setup: the `gpu` marker skips without CUDA; the gpubench plugin loads from source; an `alone` test
runs with no other pytest-xdist worker's test beside it; a held optimize lock for the tests of runs that share one."""

import contextlib
import importlib.metadata
import os
import sys
import tempfile

import pytest

try:  # installed (make test): the pytest11 entry point already loads the plugin
    importlib.metadata.distribution("gpuspeed")
    pytest_plugins: list[str] = []
except importlib.metadata.PackageNotFoundError:  # PYTHONPATH=src (make gpu-test on the device)
    pytest_plugins = ["gpuspeed.pytest_plugin"]


@pytest.fixture
def plugin_args() -> list[str]:
    """What loads the gpubench plugin in a pytester run: nothing where installed (its entry point), from source
    `-p gpuspeed.pytest_plugin` (as pytest_plugins above)."""
    return [arg for plugin in pytest_plugins for arg in ("-p", plugin)]


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    if _cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run `make gpu-test` on a GPU machine)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # not `in item.keywords`: a parameter id "gpu" is one too
            item.add_marker(skip)


@contextlib.contextmanager
def _machine_slot(alone: bool):
    """Under pytest-xdist: an `alone` test holds the machine to itself, every other test shares it -- the optimize
    lock's two sides (worker._slot: "measure" exclusive, "compile" shared, a turnstile so a waiting alone test goes
    next)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:  # one process: nothing runs beside a test
        yield
        return
    from gpuspeed.optimize.worker import _slot

    lock = os.path.join(tempfile.gettempdir(), f"gpuspeed-tests-{run}.lock")
    with _slot({"lock": lock}, "measure" if alone else "compile", stage=lambda name: None):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # the whole protocol: a module fixture set up or torn down beside an alone test would load the machine too
    # a GPU test skipped here (no CUDA) holds nothing: an alone one would only wait for the other workers' tests
    alone = item.get_closest_marker("alone") is not None and (item.get_closest_marker("gpu") is None or _cuda())
    with _machine_slot(alone):
        yield


LOCK_WORKLOAD = ("import numpy as np\nTOLERANCE = dict(rtol=1e-5, atol=1e-6)\ndef original(x):\n"
                 "    return np.sin(x) * 2.0\ndef inputs(rng):\n    return (rng.standard_normal(101),)\n")


@pytest.fixture
def held_lock_run(tmp_path):
    """Another run's measurement holding the shared optimize lock (benchmarks/optimize.py runs examples side by side
    under one), and start(budget) to launch `gpuspeed optimize` on a small NumPy workload (w.py) beside it:
    -> (Popen, out folder). release() frees the lock (teardown does, if the test did not)."""
    import fcntl
    import subprocess

    from gpuspeed.optimize.runner import LOCK_ENV

    wl = tmp_path / "w.py"
    wl.write_text(LOCK_WORKLOAD)
    lock = tmp_path / "shared.lock"
    out = tmp_path / "o"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in ["src", os.environ.get("PYTHONPATH")] if p))
    env[LOCK_ENV] = str(lock)
    turn, held = open(str(lock) + ".turnstile", "a+"), open(lock, "a+")
    fcntl.flock(turn, fcntl.LOCK_EX)  # what worker._slot(..., "measure") holds
    fcntl.flock(held, fcntl.LOCK_EX)

    class Held:
        def start(self, budget):
            proc = subprocess.Popen([sys.executable, "-m", "gpuspeed", "optimize", str(wl), "--device", "cpu",
                                     "--out", str(out), "--time-budget", str(budget), "--backends", "numpy"],
                                    env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            return proc, out

        def release(self):
            for f in (held, turn):
                if not f.closed:
                    fcntl.flock(f, fcntl.LOCK_UN)
                    f.close()

    h = Held()
    yield h
    h.release()


@pytest.fixture
def numba_hidden_path(tmp_path):
    """A PYTHONPATH for a subprocess that must see numba as not installed, whether or not it is here: a
    sitecustomize puts None in sys.modules, so both `import numba` and importlib.util.find_spec("numba") say so."""
    hide = tmp_path / "hide_numba"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules.update(numba=None, numba_cuda=None)\n")
    return os.pathsep.join(p for p in (str(hide), os.environ.get("PYTHONPATH")) if p)


@pytest.fixture(scope="module")
def interpreter_child():
    """run(path, timeout) -> {case id: result}: runs a test file as a child under TRITON_INTERPRET=1 and
    NUMBA_ENABLE_CUDASIM=1 (with no GPU visible), reading the JSON line it prints per case (its child_main)."""
    import json
    import subprocess
    from pathlib import Path

    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[1]

    def run(path: str, timeout: float) -> dict:
        env = dict(os.environ, TRITON_INTERPRET="1", NUMBA_ENABLE_CUDASIM="1", CUDA_VISIBLE_DEVICES="")
        env["PYTHONPATH"] = os.pathsep.join(p for p in [str(root / "src"), env.get("PYTHONPATH")] if p)
        proc = subprocess.run([sys.executable, path], capture_output=True, text=True, env=env, timeout=timeout,
                              cwd=root)
        lines = {}
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                d = json.loads(line)
                lines[d["id"]] = d
        assert lines, f"the child printed nothing (rc {proc.returncode}): {proc.stderr[-2000:]}"
        return lines

    return run


@pytest.fixture
def quick_cpu_roofline(monkeypatch):
    """An in-process CPU roofline that takes seconds, for tests of what it writes or says (tests/quick_roofline.py)."""
    from quick_roofline import patch

    patch(monkeypatch.setattr)
