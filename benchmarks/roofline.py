"""Regenerate results/<gpu-slug>/roofline.{json,md,png,svg}: `python benchmarks/roofline.py [extra CLI options]`.

On the H200 this writes results/nvidia-h200/roofline.json (full sizes, about two minutes); on a machine
without a GPU it writes results/cpu/ with `--quick` sizes. Extra arguments go to `gpuspeed roofline`.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gpuspeed.cli import main  # noqa: E402
from gpuspeed.device import get_device  # noqa: E402

if __name__ == "__main__":
    info = get_device("auto")
    extra = sys.argv[1:] + (["--quick"] if info.kind == "cpu" and "--quick" not in sys.argv else [])
    sys.exit(main(["roofline", "--out", str(Path("results") / info.slug), *extra]))
