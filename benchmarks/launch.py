"""Regenerate results/<gpu>/launch.{json,md,png}: `python benchmarks/launch.py [--out DIR]` (runs `gpuspeed launch`).

`python benchmarks/launch.py --notebook OUT.ipynb` instead executes notebooks/03_compile_cuda_graphs.ipynb
(nbclient, "python3" kernel) and writes it, with whatever outputs it reached, to OUT.ipynb.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpuspeed.cli import main  # noqa: E402
from gpuspeed.results import default_dir  # noqa: E402


def execute_notebook(target: str) -> int:
    import nbclient
    import nbformat

    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    nb = nbformat.read(ROOT / "notebooks" / "03_compile_cuda_graphs.ipynb", as_version=4)
    try:
        nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": os.environ.get("TMPDIR", "/tmp")}}).execute()
    finally:  # keep the outputs reached even when a self-check fails
        nbformat.write(nb, target)
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--notebook"] and len(args) == 2:
        sys.exit(execute_notebook(args[1]))
    if "--out" not in args:
        args += ["--out", str(default_dir())]
    sys.exit(main(["launch", *args]))
