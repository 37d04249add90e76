"""The backend shims: each restores only what is missing."""

import importlib.util

import numpy as np

from gpuspeed import compat


def test_row_stack_alias_restored_only_when_numpy_lacks_it_and_numba_cuda_is_installed(monkeypatch):
    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "numba_cuda" else real_find(name, *a))
    if hasattr(np, "row_stack"):
        assert compat.numpy_aliases_for_numba() is False  # present: left alone
        monkeypatch.delattr(np, "row_stack")
    assert compat.numpy_aliases_for_numba() is True  # NumPy 2.5, as on the H200 machine
    assert np.row_stack is np.vstack
    monkeypatch.delattr(np, "row_stack")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "numba_cuda" else real_find(name, *a))
    assert compat.numpy_aliases_for_numba() is False  # no numba-cuda: NumPy untouched
    assert not hasattr(np, "row_stack")


TRITON_36 = '''
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import numpy as np, torch, triton, triton.language as tl
from triton.runtime import interpreter

real = interpreter._patch_lang_tensor


def _patch_lang_tensor(tensor, scope):  # triton 3.6's, as on the H200 machine: int() of a one-element array
    real(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))


interpreter._patch_lang_tensor = _patch_lang_tensor


@triton.jit
def row_sum(x, o, n, BLOCK: tl.constexpr):
    acc = tl.zeros((BLOCK,), dtype=tl.float64)
    for start in range(0, n, BLOCK):  # a loop over a runtime bound: range() calls __index__
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x + offs, mask=offs < n, other=0.0)
    tl.store(o, tl.sum(acc, axis=0))


x = torch.from_numpy(np.random.default_rng(0).standard_normal(1000))
o = torch.full((1,), float("nan"), dtype=torch.float64)
try:
    row_sum[(1,)](x, o, 1000, BLOCK=64)
    print("unshimmed: ran")
except Exception as exc:
    print("unshimmed:", type(exc).__name__, "0-dimensional" in str(exc))
from gpuspeed.compat import triton_interpreter_index
print("applied:", triton_interpreter_index(), triton_interpreter_index())
row_sum[(1,)](x, o, 1000, BLOCK=64)
print("shimmed:", abs(o.item() - x.sum().item()) < 1e-9)
'''


def test_triton_interpreter_loops_over_a_runtime_bound_with_numpy_2_4(tmp_path):
    # triton 3.6 + NumPy 2.5 (the H200 machine): every interpreted kernel with `range(0, n, BLOCK)` raised
    import os
    import subprocess
    import sys

    import pytest

    pytest.importorskip("triton")
    try:
        int(np.ones(1))
        pytest.skip("this NumPy still converts a one-element array: nothing to mend")
    except TypeError:
        pass
    src = os.path.join(os.path.dirname(__file__), "..", "src")
    script = tmp_path / "triton36.py"  # a file: the shim reads the interpreter function's source
    script.write_text(TRITON_36)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=src, CUDA_VISIBLE_DEVICES=""), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:3] == ["unshimmed: InterpreterError True", "applied: True False", "shimmed: True"], \
        proc.stdout
