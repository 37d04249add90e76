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


def _prose() -> str:
    return " ".join(README.split())


def test_the_readme_says_an_installed_gpubench_plugin_must_not_be_loaded_again(tmp_path):
    """Installed, the plugin loads through its pytest11 entry point; the README then offered `-p
    gpuspeed.pytest_plugin` or `pytest_plugins = [...]` for PYTHONPATH=src, warning only against using both. A user
    with the package installed who added either one (a conftest.py line, as the README shows) got pytest's 'Plugin
    already registered under a different name' and a page of its plugin table instead of a test run."""
    import importlib.metadata
    import subprocess
    import sys

    import pytest

    try:
        importlib.metadata.distribution("gpuspeed")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("gpuspeed is not installed here (PYTHONPATH=src): its entry point does not load the plugin")
    (tmp_path / "test_one.py").write_text("def test_one(gpubench):\n    assert gpubench(len, 'ab', budget_s=0.05)\n")
    loaded_twice = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                                   "gpuspeed.pytest_plugin", "test_one.py"], cwd=tmp_path, capture_output=True, text=True,
                                  timeout=300)
    assert loaded_twice.returncode != 0 and "already registered" in loaded_twice.stdout + loaded_twice.stderr
    prose = _prose()
    assert "Installed, it loads itself (a `pytest11` entry point) and must not be loaded again" in prose, \
        "the README does not warn that an installed plugin loaded again with -p or pytest_plugins stops pytest"


def test_the_decode_notebook_names_the_model_of_each_ladder_it_reads_from_a_saved_file(tmp_path, monkeypatch):
    """Notebook 02 with GPUSPEED_DECODE_RESULTS set to the committed decode.json (five runs: three bf16 models, tiny
    fp32, the int8 8B) printed one header and 43 rows beneath it, 'V5 | 1 | 32 | 0.7688 ...' then 'V5 | 1 | 32 |
    0.3852 ...', with no model or dtype anywhere: which ladder a row belonged to could not be told."""
    import json
    import os

    import pytest

    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    saved = ROOT / "results" / "nvidia-h200" / "decode.json"
    rows = json.loads(saved.read_text(encoding="utf-8"))["rows"]
    runs = {f"{r['model']} {r.get('quant') or r['dtype']}" for r in rows}
    assert len(runs) > 1  # the case this checks: a file of several runs
    monkeypatch.setenv("GPUSPEED_NB_SMALL", "1")
    monkeypatch.setenv("GPUSPEED_NB_OUT", str(tmp_path))
    monkeypatch.setenv("GPUSPEED_DECODE_RESULTS", str(saved))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(ROOT / "notebooks" / "02_decode_optimization.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    lines = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])).splitlines()
    unnamed = sorted(run for run in runs if run not in lines)
    assert not unnamed, f"the ladder table names no heading line for {unnamed}"


def _numbers(doc) -> list[float]:
    if isinstance(doc, dict):
        return [x for v in doc.values() for x in _numbers(v)]
    if isinstance(doc, list):
        return [x for v in doc for x in _numbers(v)]
    return [float(doc)] if isinstance(doc, (int, float)) and not isinstance(doc, bool) else []


def _unfound_ms_per_token(text: str) -> list[str]:
    """Each section's bold ms/token figures that none of the decode results files it cites holds, as rounded there:
    `results/nvidia-h200/decode.json` as committed in <sha> (read from git), else the decode_*.json files or folders
    it names, else the current decode.json. A sentence saying its figures are in no results file is left out."""
    import json
    import subprocess

    h200 = ROOT / "results" / "nvidia-h200"
    unfound = []
    for section in re.split(r"\n(?=#{2,3} )", text):
        flat = " ".join(section.split())
        commits = re.findall(r"`results/nvidia-h200/decode\.json` as committed in ([0-9a-f]{7})", flat)
        docs = [json.loads(subprocess.run(["git", "show", f"{sha}:results/nvidia-h200/decode.json"], cwd=ROOT,
                                          capture_output=True, text=True, check=True).stdout) for sha in commits]
        for name in set(re.findall(r"`(?:results/nvidia-h200/)?(decode[a-z0-9_]*(?:\.json|/(?:decode\.json)?))`", flat)):
            if name == "decode.json" and commits:
                continue
            paths = h200.glob(f"{name}*.json") if name.endswith("/") else [h200 / name]
            docs += [json.loads(p.read_text(encoding="utf-8")) for p in paths]
        values = [v for d in docs for v in _numbers(d)]
        for sentence in re.split(r"(?<=\.) ", flat):
            if "in no results file" in sentence:
                continue
            for quoted in re.findall(r"\*\*(\d+\.\d+)\*\* ms/token", sentence):
                digits = len(quoted.split(".")[1])
                if not any(f"{v:.{digits}f}" == quoted for v in values):
                    unfound.append(f"{section.splitlines()[0][:60]}: {quoted} ms/token")
    return unfound


def test_each_decode_outcome_is_in_the_results_file_its_section_cites():
    """docs/decode-notes.md quoted round 4's outcomes (tiny V5 0.196, the 1B 0.888, ...), round 6's, round 7's and the
    int8 runs' 'from results/nvidia-h200/decode.json', which has since been replaced by later merged runs (tiny 0.145,
    the 1B 0.769): a reader opening it found none of them. Each section now names the file as committed then (or the
    copy kept under its commit), as rounds 1 and 2 did."""
    import subprocess

    import pytest

    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], capture_output=True, text=True, cwd=ROOT)
    if shallow.returncode != 0 or shallow.stdout.strip() == "true":
        pytest.skip("no git history here to read a results file as committed then")
    assert not _unfound_ms_per_token((ROOT / "docs" / "decode-notes.md").read_text(encoding="utf-8"))


def test_the_readme_names_which_measurement_compare_takes_as_the_baseline():
    """The README said '`gpuspeed.timing.compare(a, b)` gives a speedup', not whose over whose: compare(cumsum's
    Measurement, sum's) printed '11.230x ... (faster)', the second argument's speedup over the first, which a reader of
    compare(a, b) takes for a's over b's. The README now writes the call with its parameters' own names."""
    import inspect

    from gpuspeed.timing import compare

    params = [p.name for p in inspect.signature(compare).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    written = re.findall(r"`gpuspeed\.timing\.compare\(([^)]*)\)`", README)
    assert written and all([a.strip() for a in w.split(",")] == params for w in written), (written, params)
    assert f"the {params[1]}'s speedup over the {params[0]}" in _prose()


def test_every_make_target_is_named_in_the_readme():
    """The Makefile has `make notebooks` (the four notebooks executed at small sizes, as CI runs them), `make lint` and
    `make clean`, and the README named none of them: a reader of its Layout section learnt the notebooks' names but
    not how to run them on a machine without a GPU."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = re.search(r"^\.PHONY:(.*)$", makefile, re.M).group(1).split()
    unnamed = [t for t in targets if f"make {t}" not in README]
    assert not unnamed, f"make targets the README does not name: {unnamed}"
