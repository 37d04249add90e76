"""QA round 12: the first hour as the README tells it. Its Python snippet runs on a CPU-only machine, every option it
gives a command exists on that command, and the numbers its prose quotes from results files are those files'
numbers (the generated block between results:start and results:end is benchmarks/readme_results.py's, checked by
test_readme_results.py; the prose around it is typed, so it is checked here)."""

import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
H200 = ROOT / "results" / "nvidia-h200"


def _flat(text: str) -> str:
    return " ".join(text.split())


PROSE = _flat(re.sub(r"<!-- results:start -->.*?<!-- results:end -->", "", README, flags=re.S))


def test_measurement_core_snippet_runs_on_a_cpu_only_machine(capsys):
    """The README's first Python snippet, copied into a CPU-only machine, runs and prints what its comments say (it
    made its tensor with device="cuda": torch's 'Torch not compiled with CUDA enabled' traceback on the first line,
    where 'every command runs on a machine without a GPU too'). The size is cut from 4096 to 256 for the test's
    time only."""
    pytest.importorskip("torch")
    block = re.search(r"## The measurement core\s*```python\n(.*?)```", README, re.S)
    assert block, "the README's measurement-core snippet is gone"
    code = block.group(1).replace("4096", "256")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cap() without a GPU warns that nothing is enforced: the README says so
        exec(compile(code, "README.md", "exec"), {})  # the snippet is the test
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith("mm: ") and "median" in lines[0] and "n=" in lines[0], lines[0]  # print(m)
    assert lines[1].startswith("PASS"), lines[1]  # r.summary: fp32 mm against its float64 product
    assert "fits in 8.00 GiB with 15% headroom" in lines[2], lines[2]  # mem.fits("8GiB").message
