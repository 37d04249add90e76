"""QA round 15, docs: a newcomer on a machine without a GPU reads the README top to bottom and does what it says."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
        for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]}


def _flat(text: str) -> str:
    return " ".join(text.split())


def _readme_copy(tmp_path: Path) -> Path:
    """The script, a README whose results block is stale, and the committed results, laid out as in the repository:
    a run that rewrites the block shows."""
    (tmp_path / "benchmarks").mkdir()
    shutil.copy(ROOT / "benchmarks" / "readme_results.py", tmp_path / "benchmarks")
    stale = re.sub(r"(<!-- results:start -->).*?(<!-- results:end -->)", r"\1\nstale\n\2", README, flags=re.S)
    (tmp_path / "README.md").write_text(stale, encoding="utf-8")
    (tmp_path / "results").mkdir()
    for folder in (ROOT / "results").iterdir():
        if folder.is_dir():
            (tmp_path / "results" / folder.name).symlink_to(folder, target_is_directory=True)
    return tmp_path / "README.md"


@pytest.mark.parametrize("args, rc", [(["--help"], 0), (["-h"], 0), (["--check"], 2), (["results"], 2)])
def test_readme_results_help_or_an_unknown_argument_rewrites_nothing(tmp_path, args, rc):
    """`python benchmarks/readme_results.py --help` rewrote README.md and results/ARCHIVE.md (any argument was
    ignored): a newcomer asking what it does changed two tracked files. --help prints the usage, an argument it does
    not take is one line and exit 2, and neither writes anything."""
    readme = _readme_copy(tmp_path)
    before = readme.read_text(encoding="utf-8")
    run = subprocess.run([sys.executable, str(tmp_path / "benchmarks" / "readme_results.py"), *args],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.returncode == rc, (run.stdout, run.stderr)
    assert readme.read_text(encoding="utf-8") == before
    assert not (tmp_path / "results" / "ARCHIVE.md").exists()
    if rc == 0:
        assert "usage:" in run.stdout and "README" in run.stdout, run.stdout
    else:
        assert len(run.stderr.strip().splitlines()) <= 3 and "Traceback" not in run.stderr, run.stderr


def test_readme_results_without_arguments_still_rewrites_the_block(tmp_path):
    readme = _readme_copy(tmp_path)
    run = subprocess.run([sys.executable, str(tmp_path / "benchmarks" / "readme_results.py")],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "stale" not in readme.read_text(encoding="utf-8")
    assert (tmp_path / "results" / "ARCHIVE.md").is_file()


def test_regenerate_commands_write_the_folder_of_the_gpu_they_run_on():
    """'Regenerate on a GPU: ... --out results/nvidia-h200' wrote whatever card ran it (an H100, the card most often
    lent; a user's RTX 4090) into the H200's folder, where readme_results.py then quotes it as the H200's result
    (beside the H200's other files). The README's regenerate commands name no card's folder: each script's default,
    or results/<gpu>."""
    start = README.index("Regenerate on a GPU")
    regen = README[start:README.index("\n\n", start)]
    commands = re.findall(r"`([^`]+)`", regen)
    assert commands, regen
    for cmd in commands:
        assert "nvidia-h" not in cmd, cmd
        m = re.search(r"--out (\S+)", cmd)
        assert m is None or m.group(1) == "results/<gpu>", cmd


def test_a_results_file_the_docs_name_at_a_commit_is_that_commits_run():
    """docs/notes/timing.md cited '`kernels.json` at 1d9314b' for the float64 row normalization's 82 %: kernels.json is
    bb15aa0's run now (81.4 %), and 1d9314b's is kept as kernels_1d9314b.json. A file named 'at <sha>' is that run:
    its own `git` is that commit, or, where a copy is kept under the commit, the text names the copy."""
    wrong = []
    for page, text in DOCS.items():
        for m in re.finditer(r"`?([a-z_0-9]+)\.json`? at ([0-9a-f]{7})\b", _flat(text)):
            stem, sha = m.groups()
            kept = list(ROOT.glob(f"results/*/{stem}_{sha}*.json"))
            current = [json.loads(p.read_text(encoding="utf-8")).get("git", "")[:7] for p in
                       ROOT.glob(f"results/*/{stem}.json")]
            if kept or (current and sha not in current and not _only_in_history(stem, sha)):
                wrong.append(f"{page}: '{m.group(0)}' (kept: {[p.name for p in kept]}, current at {current})")
    assert not wrong, wrong


def _only_in_history(stem: str, sha: str) -> bool:
    """A run never kept beside the current file (kernels.json at efc5c2d): the text quotes the file as committed
    then, which git still holds."""
    log = subprocess.run(["git", "log", "--format=%h", "--", f"results/*/{stem}.json"], capture_output=True,
                         text=True, cwd=ROOT)
    for commit in log.stdout.split():
        show = subprocess.run(["git", "show", f"{commit}:results/nvidia-h200/{stem}.json"], capture_output=True,
                              text=True, cwd=ROOT)
        if show.returncode == 0 and json.loads(show.stdout).get("git", "").startswith(sha):
            return True
    return False


def _code(nb: dict) -> list[str]:
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def _printed(cells: list[dict]) -> str:
    return "".join("".join(o.get("text", "")) for c in cells for o in c.get("outputs", []))


@pytest.mark.parametrize("name", ["01_roofline.ipynb", "02_decode_optimization.ipynb", "03_compile_cuda_graphs.ipynb",
                                  "04_optimize_your_code.ipynb"])
def test_a_committed_notebooks_outputs_are_a_gpu_run_of_its_code(name):
    """What a reader sees in a committed notebook is a GPU run of the code beside it, on the card it names. Notebook 01
    printed 'read /root/out/r/roofline.json created 2026-11-29...' and ceilings (bf16 786.9 TFLOP/s) from a run never
    committed, under code since changed (it prints 'measured on <device>' now); 03's outputs predated the launch study's
    rewrite (explain's 'call 2 with changed inputs failed'); 04 had no outputs at all. benchmarks/run_notebook.py stamps
    the commit and the device into the notebook's metadata; the code cells must be that commit's."""
    nb = json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))
    stamp = nb["metadata"].get("gpuspeed")
    assert stamp, f"{name}: no metadata.gpuspeed: execute it on a GPU with benchmarks/run_notebook.py"
    assert stamp["complete"] and stamp["device"].startswith("NVIDIA"), stamp
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c.get("execution_count") for c in code), f"{name}: a code cell has not run"
    assert not [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"], name
    # no traceback a library logged either (notebook 02 on the H200 printed 16 of inductor's, one per kernel)
    assert "Traceback (most recent call last)" not in _printed(code), name
    first = _printed(code[:1])
    assert first.startswith(stamp["device"]), (first, stamp)  # the card named is the card that ran it
    sha = stamp["git"]
    assert re.fullmatch(r"[0-9a-f]{40}", sha), f"{name}: run at {sha!r}, not a clean commit"
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], capture_output=True, text=True, cwd=ROOT)
    if shallow.returncode != 0 or shallow.stdout.strip() == "true":
        pytest.skip("no git history here to read the notebook's commit from")
    then = subprocess.run(["git", "show", f"{sha}:notebooks/{name}"], capture_output=True, text=True, cwd=ROOT)
    assert then.returncode == 0, then.stderr
    assert _code(json.loads(then.stdout)) == _code(nb), \
        f"{name}: its code changed since the GPU run at {sha[:7]}: execute it again on a GPU"


def test_the_roofline_notebook_reads_the_committed_roofline_of_its_card():
    """Where notebook 01 read a saved roofline (GPUSPEED_ROOFLINE_RESULTS) rather than measuring, it is the committed
    roofline.json of the card that ran the notebook, the one whose numbers the README quotes."""
    nb = json.loads((ROOT / "notebooks" / "01_roofline.ipynb").read_text(encoding="utf-8"))
    text = _printed([c for c in nb["cells"] if c["cell_type"] == "code"])
    m = re.search(r"^read (\S+) measured on (.+?) created (\S+)$", text, re.M)
    if m is None:
        assert not re.search(r"^read \S+\.json", text, re.M), text[:300]  # a saved roofline, printed as the code prints it
        return
    path, device, created = m.groups()  # gpu_all.sh reads its own fresh run (/root/out/r/...), committed beside it
    committed = [json.loads(f.read_text(encoding="utf-8")) for f in ROOT.glob("results/*/roofline.json")]
    assert (device, created) in [(d["device"]["name"], d["created"]) for d in committed], (path, device, created)
    assert device == nb["metadata"]["gpuspeed"]["device"]


@pytest.mark.parametrize("test, op", [("a[i] > m", "max"), ("m < a[i]", "max"), ("a[i] >= m", "max"),
                                      ("a[i] < m", "min"), ("m > a[i]", "min")])
def test_a_running_max_written_with_if_is_a_reduction_not_a_sequential_loop(test, op):
    """`if a[i] > m: m = a[i]` is the running maximum, written as users write it: a max reduction, as `m = max(m,
    a[i])` already was. It was called a sequential loop ('each iteration needs the previous one's m ... cannot be one
    GPU thread per iteration'), which optimize reads as 'a GPU cannot help' and skips the GPU drop-ins for."""
    from gpuspeed.profiling.loops import loop_nests

    src = f"def f(a, n):\n    m = a[0]\n    for i in range(n):\n        if {test}:\n            m = a[i]\n    return m\n"
    (loop,) = loop_nests(src, 1, {}, 0.0)
    assert loop["kind"] == "reduction", loop["verdict"]
    assert [(r["name"], r["op"]) for r in loop["dependences"]["reductions"]] == [("m", op)], loop["dependences"]
    assert "sequential" not in loop["verdict"], loop["verdict"]


@pytest.mark.parametrize("body", [
    "        if a[i] > m:\n            m = a[i] * 2\n",  # keeps a[i] * 2 when a[i] is larger: not max(m, a[i])
    "        if a[i] > m:\n            m = a[i]\n        else:\n            m = 0\n",
    "        if a[i] > m:\n            m = a[i]\n        b[i] = m\n",  # every step's running max is read: a scan
])
def test_a_conditional_assignment_that_is_not_a_running_max_stays_sequential(body):
    from gpuspeed.profiling.loops import loop_nests

    src = f"def f(a, b, n):\n    m = a[0]\n    for i in range(n):\n{body}    return m\n"
    (loop,) = loop_nests(src, 1, {}, 0.0)
    assert loop["kind"] == "sequential-loop", (body, loop["verdict"])


@pytest.mark.parametrize("header, body", [
    ("for i in range(n - 1):", "a[i] = a[i + 1] * 2"),  # shift left: reads the element a later iteration writes
    ("for i in range(1, n):", "a[i - 1] = a[i] + b[i]"),
    ("for i in range(n - 2, -1, -1):", "a[i + 1] = a[i] * 2"),  # downward, reading below: still ahead of the writes
    ("for j in range(m - 2):", "g[r, j] = g[r, j + 2] - g[r, j + 1]"),
])
def test_reading_an_element_a_later_iteration_overwrites_is_no_recurrence(header, body):
    """`for i in range(n - 1): a[i] = a[i + 1] * 2` reads a[i + 1] before iteration i + 1 overwrites it: every read sees
    the original array, so it is `a[:-1] = a[1:] * 2`, iterations independent once the result goes to a new array. It
    was called 'sequential: each iteration needs the previous one's a[i] from a[i + 1]', which no iteration does, and
    optimize read that as 'a GPU cannot help'. In place, threads would race: the verdict says to write out of place."""
    from gpuspeed.profiling.loops import loop_nests

    src = f"def f(a, b, g, n, m, r):\n    {header}\n        {body}\n"
    (loop,) = loop_nests(src, 1, {}, 0.0)
    assert loop["kind"] == "parallel-map", loop["verdict"]
    assert not loop["dependences"]["recurrences"] and loop["dependences"]["reads_ahead"], loop["dependences"]
    assert "sequential" not in loop["verdict"] and "new array" in loop["verdict"], loop["verdict"]


@pytest.mark.parametrize("header, body", [
    ("for i in range(1, n):", "a[i] = a[i - 1] * 2"),  # reads what the previous iteration wrote
    ("for i in range(n - 2, -1, -1):", "a[i] = a[i + 1] + 1"),  # downward: a[i + 1] is the previous iteration's
    ("for i in range(1, n - 1):", "a[i] = a[i - 1] + a[i + 1]"),  # one read behind is enough
    ("for i in range(0, n - 1, k):", "a[i] = a[i + 1] * 2"),  # a step of unknown sign
    ("for i in range(n - 1):", "a[2 * i] = a[i + 1]"),  # not a shift of the same index
])
def test_a_read_of_an_earlier_iterations_element_stays_a_recurrence(header, body):
    from gpuspeed.profiling.loops import loop_nests

    src = f"def f(a, n, k):\n    {header}\n        {body}\n"
    (loop,) = loop_nests(src, 1, {}, 0.0)
    assert loop["kind"] == "sequential-loop", (header, body, loop["verdict"])


def test_no_prange_candidate_for_a_loop_that_reads_an_element_a_later_iteration_overwrites():
    """Now that `a[i] = a[i + 1] * 2` in place is no sequential loop, optimize plans its Numba candidates: prange would
    let a thread overwrite a[i + 1] before the thread of iteration i reads it (a wrong element at each chunk's edge,
    now and then), so no prange candidate is planned; the serial ones are."""
    import numpy as np

    from gpuspeed.optimize import candidates as C

    def shift(a):
        for i in range(a.shape[0] - 1):
            a[i] = a[i + 1] * 2.0

    def scaled(a, out):
        for i in range(a.shape[0] - 1):
            out[i] = a[i + 1] * 2.0

    class Wl:
        kind, rtol, atol, in_place, variants, module = "numpy", 1e-9, None, None, {}, np

    for fn, prange in ((shift, False), (scaled, True)):
        Wl.original = staticmethod(fn)
        rows, recs = C.plan(Wl, "cpu", {"loop_bound": True, "float64": True}, requested=["numba"])
        names = {r["name"] for r in recs}
        assert ("numba-prange" in names) is prange and "numba" in names, (fn.__name__, names)
        if not prange:
            assert any("a later iteration overwrites" in r.get("why", "") for r in rows), rows


def test_kernel_notes_quote_the_histogram_run_the_readme_quotes():
    """docs/notes/kernel.md said the tl.histogram kernel ran '43 % against 94 %' for its copies, the README '43 %
    against 93 %': kernels_a24f240.json, the run both mean, says 42.6 % and 93.0 %."""
    doc = json.loads((ROOT / "results" / "nvidia-h200" / "kernels_a24f240.json").read_text(encoding="utf-8"))
    (row,) = [r for r in doc["rows"] if (r.get("example"), r.get("variant")) == ("histogram", "triton")]
    phrase = (f"the H200 histogram with tl.histogram, {row['pct_of_roof']:.0f} % against "
              f"{row['copy_same_launches_pct_of_roof']:.0f} % (`kernels_a24f240.json`)")
    assert phrase in _flat(DOCS["docs/notes/kernel.md"]), phrase
