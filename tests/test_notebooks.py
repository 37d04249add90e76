"""Execute every notebook at small sizes on the CPU (GPUSPEED_NB_SMALL=1); each notebook's asserts are its
self-checks, and each must leave the artifact it promises."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# notebook, what it must leave behind (a file under GPUSPEED_NB_OUT, or text in its outputs)
NOTEBOOKS = [
    ("01_roofline.ipynb", "file:roofline_nb.png"),
    ("02_decode_optimization.ipynb", "file:decode_ladder.png"),
    ("03_compile_cuda_graphs.ipynb", "text:eager_us_per_launch"),
    ("03_compile_cuda_graphs.ipynb", "file:launch_nb.png"),
    ("04_optimize_your_code.ipynb", "file:report.md"),
    ("04_optimize_your_code.ipynb", "file:optimized_black_scholes.py"),
]


# the roofline notebook checks its live placements against ceilings it measured a minute before: on a CPU shared
# with another worker's test both read whatever share of the cores they got (a 256 matmul read 340 % of its roof)
ALONE = {"01_roofline.ipynb"}
# its self-checks are of the placements' bounds and flags, not of the CPU's speed: 3 samples a timing, 16 MiB buffers
QUICK_ROOFLINE = {"01_roofline.ipynb"}


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.alone) if n in ALONE else n
                                  for n in sorted({n for n, _ in NOTEBOOKS})])
def test_notebook_runs_small(name, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("GPUSPEED_NB_SMALL", "1")
    monkeypatch.setenv("GPUSPEED_NB_OUT", str(out))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    if name in QUICK_ROOFLINE:  # an IPython startup file of the kernel's own profile applies it before the first cell
        startup = tmp_path / "ipython" / "profile_default" / "startup"
        startup.mkdir(parents=True)
        (startup / "00-quick-roofline.py").write_text(
            f"import sys\nsys.path.insert(0, {str(ROOT / 'tests')!r})\nimport quick_roofline\nquick_roofline.patch()\n"
            "del sys.path[0]\n")
        monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    for expected in [e for n, e in NOTEBOOKS if n == name]:
        kind, what = expected.split(":", 1)
        if kind == "file":
            assert (out / what).is_file(), f"{name} left no {what}"
        else:
            assert what in outputs, f"{name} printed no {what}"
