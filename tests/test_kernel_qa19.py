"""QA round 19, kernel: refusals made on the GPU path (real Numba dispatcher, not the simulator), checked on the CPU
where they come before anything needs a driver."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

STATIC = """
    import numpy as np
    from numba import cuda, float32
    from gpuspeed.kernel.capture import Capture, EmptyLaunch

    TILE = 16384  # 64 KiB of float32: over the 48 KiB a block may hold

    @cuda.jit(device=True)
    def helper(x, i):
        t = cuda.shared.array(8192, float32)  # 32 KiB, beside the kernel's 32 KiB below
        t[i] = x[i]
        cuda.syncthreads()
        return t[(i + 1) % 32]

    @cuda.jit
    def big(x):
        tile = cuda.shared.array(TILE, float32)
        i = cuda.threadIdx.x
        tile[i] = x[i]
        cuda.syncthreads()
        x[i] = tile[(i + 1) % 32]

    @cuda.jit
    def through_device(x):
        t = cuda.shared.array(8192, float32)
        i = cuda.threadIdx.x
        t[i] = helper(x, i)
        cuda.syncthreads()
        x[i] = t[(i + 3) % 32]

    @cuda.jit
    def fits(x):
        tile = cuda.shared.array(1024, float32)
        i = cuda.threadIdx.x
        tile[i] = x[i]
        cuda.syncthreads()
        x[i] = tile[(i + 1) % 32]

    x = np.random.default_rng().standard_normal(32).astype(np.float32)
    for k in (big, through_device, fits):
        try:
            with Capture():
                k[1, 32](x)
            print(k.py_func.__name__, "ran")
        except EmptyLaunch as e:
            print(k.py_func.__name__, "refused:", e)
        except Exception as e:  # no driver here: the compile went on past the check
            print(k.py_func.__name__, "compiled on:", type(e).__name__)
"""


def test_on_the_gpu_path_static_shared_arrays_over_48_kib_are_refused_before_ptxas(tmp_path):
    # on a GPU the kernel command passed ptxas's own failure through (many lines) where the simulator said one line
    pytest.importorskip("numba.cuda")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    (tmp_path / "static.py").write_text(textwrap.dedent(STATIC))
    done = subprocess.run([sys.executable, "-W", "ignore", str(tmp_path / "static.py")], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    said = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert said["big"].startswith("refused: big: its static shared arrays take 65536 B a block (tile: float32[16384]"), said
    assert "ptxas refuses to compile it" in said["big"] and "simulator" not in said["big"], said
    assert said["through_device"].startswith("refused: through_device: its static shared arrays take 65536 B"), said
    assert said["fits"] in ("ran", "compiled on: CudaSupportError"), said
