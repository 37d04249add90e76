"""Round 17 docs QA: what a new user copying the README and the docs would still hit."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _dependencies() -> list[str]:
    """The distribution names of pyproject's [project] dependencies (no tomllib on Python 3.10)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    return [re.match(r"[A-Za-z0-9_.-]+", spec).group(0) for spec in re.findall(r'"([^"]+)"', block)]


def test_the_without_pip_sentence_names_every_dependency_gpuspeed_imports():
    """The README said 'Without pip, where numpy, torch, rich and typer are already there: PYTHONPATH=src python3 -m
    gpuspeed ...', leaving out matplotlib: on such a machine `gpuspeed decode --out DIR` wrote decode.json, then
    ended 'gpuspeed: error: cannot import a module gpuspeed needs: No module named matplotlib' with exit 2."""
    (sentence,) = [s for s in re.split(r"(?<=\.)\s", README) if s.startswith("Without pip")]
    missing = [name for name in _dependencies() if name not in sentence]
    assert not missing, f"the README's run-without-pip sentence leaves out {missing}: {sentence}"
