"""Regenerate results/<gpu>/launch.{json,md,png}: `python benchmarks/launch.py [--out DIR]` (runs `gpuspeed launch`).

Notebook 03 executes with `python benchmarks/run_notebook.py notebooks/03_compile_cuda_graphs.ipynb OUT.ipynb`.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpuspeed.cli import main  # noqa: E402
from gpuspeed.results import default_dir  # noqa: E402

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--out" not in args:
        args += ["--out", str(default_dir())]
    sys.exit(main(["launch", *args]))
