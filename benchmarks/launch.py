"""Regenerate results/<gpu>/launch.{json,md,png}: `python benchmarks/launch.py [--out DIR]` (runs `gpuspeed launch`)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gpuspeed.cli import main  # noqa: E402
from gpuspeed.results import default_dir  # noqa: E402

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--out" not in args:
        args += ["--out", str(default_dir())]
    sys.exit(main(["launch", *args]))
