"""Execute a notebook in place of a person: `python benchmarks/run_notebook.py NOTEBOOK OUT.ipynb`.

Runs every cell with nbclient on the "python3" kernel, with src/ on the kernel's path, and writes the
notebook with the outputs it reached to OUT.ipynb, also when a self-check fails (then exits 1). Its metadata
`gpuspeed` says where the outputs come from: the commit (GPUSPEED_GIT where the tree travels without .git), the
device and whether every cell ran; tests/test_docs_qa15.py holds a committed notebook's code to that commit's.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def execute(notebook: str, target: str, timeout: int = 600) -> int:
    import nbclient
    import nbformat

    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT / "src"), os.environ.get("PYTHONPATH")] if p)
    nb = nbformat.read(notebook, as_version=4)
    rc = 1
    try:
        nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(ROOT)}}).execute()
        rc = 0
    except nbclient.exceptions.CellExecutionError as exc:
        print(str(exc).splitlines()[-1] if str(exc) else "cell failed", file=sys.stderr)
    finally:  # keep the outputs reached even when a self-check fails
        nb.metadata["gpuspeed"] = _stamp(complete=rc == 0)
        nbformat.write(nb, target)
    return rc


def _stamp(complete: bool) -> dict:
    sys.path.insert(0, str(ROOT / "src"))
    from gpuspeed.device import get_device
    from gpuspeed.results import git_commit

    return {"git": git_commit(ROOT), "device": get_device("auto").name, "complete": complete}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: run_notebook.py NOTEBOOK OUT.ipynb", file=sys.stderr)
        sys.exit(2)
    sys.exit(execute(sys.argv[1], sys.argv[2]))
