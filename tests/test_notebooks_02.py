"""Execute notebooks/02_decode_optimization.ipynb at small sizes (its asserts are the self-checks)."""

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NB = Path(__file__).resolve().parents[1] / "notebooks" / "02_decode_optimization.ipynb"


@pytest.mark.slow
def test_notebook_02_runs(tmp_path, monkeypatch):
    src = str(Path(__file__).resolve().parents[1] / "src")
    monkeypatch.setenv("GPUSPEED_NB_SMALL", "1")
    monkeypatch.setenv("GPUSPEED_NB_OUT", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    nb = nbformat.read(NB, as_version=4)
    nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert (tmp_path / "decode_ladder.png").is_file()
