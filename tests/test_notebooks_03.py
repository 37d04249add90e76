"""Execute notebooks/03_compile_cuda_graphs.ipynb at small sizes (GPUSPEED_NB_SMALL=1); its asserts are the test."""

import os
from pathlib import Path

import pytest

NB = Path(__file__).resolve().parents[1] / "notebooks" / "03_compile_cuda_graphs.ipynb"


@pytest.mark.slow
def test_notebook_03_runs_small(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    src = Path(__file__).resolve().parents[1] / "src"
    monkeypatch.setenv("GPUSPEED_NB_SMALL", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(NB, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on any failed self-check
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "eager_us_per_launch" in outputs
