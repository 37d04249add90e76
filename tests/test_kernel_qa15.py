"""QA pass 15 on `gpuspeed kernel FILE.py:NAME` without a GPU: a user's own Triton and Numba CUDA launchers, laid out
as in a real project, run under the interpreters (TRITON_INTERPRET=1 / NUMBA_ENABLE_CUDASIM=1)."""

import subprocess
import sys
import textwrap

from kernel_cli_helpers import interpreted_env

KERNELS = """
    import triton
    import triton.language as tl


    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)
    """

LAUNCHER = """
    import torch
    import triton

    from .kernels import add_kernel


    def launch(x, y):
        out = torch.empty_like(x)
        add_kernel[(triton.cdiv(x.numel(), 128),)](x, y, out, x.numel(), BLOCK=128)
        return out
    """


def test_a_launcher_inside_a_package_imports_its_kernels_relatively(tmp_path):
    # ops/launch.py's `from .kernels import add_kernel` (run as `python -m ops.launch`): kernel said "attempted relative
    # import with no known parent package" and stopped
    pkg = tmp_path / "my project" / "ops"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "kernels.py").write_text(textwrap.dedent(KERNELS))
    (pkg / "launch.py").write_text(textwrap.dedent(LAUNCHER))
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "kernel", f"{pkg / 'launch.py'}:launch", "--device", "cpu",
                        "--input", "x=float32[1000]", "--input", "y=float32[1000]"],
                       capture_output=True, text=True, env=interpreted_env(), timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "add_kernel [triton] grid (8, 1, 1)" in r.stdout and "no timing or occupancy here" in r.stdout, r.stdout
