"""QA round 24, core: a broken install said in one line by every command, and doctor's backend reasons.

- a torch whose import raises OSError (a CUDA library it cannot open) or ValueError (a pip CUDA library missing) ended
  every command but doctor in a 40-line traceback: the CLI took only ImportError as a broken install;
- the backends table said "no CUDA device visible" of a CUDA build under CUDA_VISIBLE_DEVICES="", which hides every
  GPU (doctor's headline names it);
- on a machine without a GPU a numba that fails to import was shown as "NUMBA_ENABLE_CUDASIM=1 simulates kernels".
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def _gpuspeed(tmp_path, fake: dict, *args):
    """`python -m gpuspeed ARGS` with the modules in `fake` (name -> source) ahead of the installed ones."""
    folder = tmp_path / "fake"
    folder.mkdir(exist_ok=True)
    for name, text in fake.items():
        (folder / f"{name}.py").write_text(text)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), str(SRC)]))
    return subprocess.run([sys.executable, "-m", "gpuspeed", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=180)


@pytest.mark.parametrize("error", ["OSError('libcudart.so.12: cannot open shared object file')",
                                   "ValueError('libcudnn.so.*[0-9] not found in the system path')"])
@pytest.mark.parametrize("command", [["roofline", "--quick"], ["bench"], ["launch"]])
def test_a_torch_whose_import_raises_is_one_line_and_exit_2_in_every_command(tmp_path, error, command):
    (tmp_path / "x.py").write_text("def f():\n    return 1\n")
    r = _gpuspeed(tmp_path, {"torch": f"raise {error}\n"}, *command)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    library = error.split("'")[1].split(":")[0]
    assert lines[-1].startswith("gpuspeed: error: cannot import torch: ") and library in lines[-1], lines


def test_an_error_in_the_users_own_module_code_is_not_taken_for_a_broken_install(tmp_path):
    # the user's module raising ValueError at import is the user's error, not "cannot import torch"
    (tmp_path / "x.py").write_text("raise ValueError('bad config')\ndef f():\n    return 1\n")
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "kernel", "x.py:f"], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(SRC)), cwd=tmp_path, timeout=180)
    assert "cannot import torch" not in r.stderr and "bad config" in r.stderr, r.stderr[-3000:]


def test_the_backends_table_names_a_cuda_visible_devices_that_hides_every_gpu(monkeypatch):
    import torch

    from gpuspeed import device

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here: the reason is for a CUDA build that sees none")
    monkeypatch.setattr(torch.version, "cuda", "12.8")  # a CUDA build that sees no GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    row = next(b for b in device.backends() if b.name == "torch (CUDA)")
    assert not row.usable and "CUDA_VISIBLE_DEVICES=''" in row.why and "hides every GPU" in row.why, row


def test_a_numba_that_fails_to_import_is_not_offered_as_a_simulator(tmp_path):
    r = _gpuspeed(tmp_path, {"numba": "raise ImportError('numba needs NumPy < 2.9')\n"}, "doctor", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    rows = {b["name"]: b for b in json.loads(r.stdout)["backends"]}
    why = rows["numba.cuda"]["why"]
    assert not rows["numba.cuda"]["usable"] and "NumPy < 2.9" in why and "CUDASIM" not in why, why


@pytest.mark.gpu
@pytest.mark.parametrize("command", [["launch", "--ks", "1,2", "--ns", "1000", "--variants", "eager,captured"],
                                     ["roofline", "--quick", "--no-sweep", "--no-place"]])
def test_a_device_cpu_run_on_a_gpu_machine_does_not_say_there_is_no_cuda_device(tmp_path, command):
    # `--device cpu` where a GPU is: "no CUDA device: ..." in the notes and on the screen read as if CUDA were broken
    r = subprocess.run([sys.executable, "-m", "gpuspeed", *command, "--device", "cpu", "--json"], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=str(SRC)), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "no cuda device" not in (r.stdout + r.stderr).lower(), (r.stdout + r.stderr)[-3000:]
    assert "--device cpu" in r.stdout, r.stdout[-3000:]
