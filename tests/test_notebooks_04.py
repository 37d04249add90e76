"""Execute notebooks/04_optimize_your_code.ipynb at the small size (GPUSPEED_NB_SMALL=1); its asserts are the test."""

import os
from pathlib import Path

import pytest

NB = Path(__file__).resolve().parents[1] / "notebooks" / "04_optimize_your_code.ipynb"


@pytest.mark.slow
def test_notebook_04_runs_small(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    src = Path(__file__).resolve().parents[1] / "src"
    monkeypatch.setenv("GPUSPEED_NB_SMALL", "1")
    monkeypatch.setenv("GPUSPEED_NB_OUT", str(tmp_path / "out"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(NB, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert (tmp_path / "out" / "report.md").is_file()
    assert (tmp_path / "out" / "optimized_black_scholes.py").is_file()
