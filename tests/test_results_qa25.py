"""QA round 25: results files' provenance stamp, the gpubench plugin's --gpubench-json, GPU-sharing records."""

import json
import subprocess
import sys
import types

import pytest

from gpuspeed import results
from gpuspeed.sharing import shared, summarize_sharing

pytest_plugins = ["pytester"]

OWN = 4242


def _git(*args, cwd):
    subprocess.run(["git", "-c", "user.email=qa@example.com", "-c", "user.name=qa", *args], cwd=cwd, check=True,
                   capture_output=True)


def _repo(tmp_path, tracked: str, ignored: str = ""):
    """A git checkout holding `tracked` (committed) and `ignored` (listed in .gitignore, present on disk)."""
    repo = tmp_path / "project"
    for rel in (tracked, ignored):
        if rel:
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            (repo / rel).write_text("x = 1\n")
    (repo / ".gitignore").write_text(".venv/\n")
    _git("init", "-q", cwd=repo)
    _git("add", ".", cwd=repo)
    _git("commit", "-qm", "init", cwd=repo)
    return repo


@pytest.mark.skipif(subprocess.run(["git", "--version"], capture_output=True).returncode != 0, reason="needs git")
def test_git_commit_is_not_the_users_project_where_gpuspeed_is_installed_in_its_venv(tmp_path, monkeypatch):
    """gpuspeed pip-installed into a project's .venv (inside the project's checkout, ignored there) recorded the
    project's commit (and its dirty state) as the commit gpuspeed ran from."""
    monkeypatch.delenv("GPUSPEED_GIT", raising=False)
    installed = ".venv/lib/python3.11/site-packages/gpuspeed/results.py"
    repo = _repo(tmp_path, tracked="app.py", ignored=installed)
    monkeypatch.setattr(results, "__file__", str(repo / installed))
    assert results.git_commit() is None
    # a checkout of gpuspeed itself is still stamped with its commit
    checkout = _repo(tmp_path / "gs", tracked="src/gpuspeed/results.py")
    monkeypatch.setattr(results, "__file__", str(checkout / "src/gpuspeed/results.py"))
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True).stdout.strip()
    assert results.git_commit() == sha


def test_python_dash_m_of_any_package_is_recorded_as_such(monkeypatch):
    """`python -m pytest ...` (a gpubench run) recorded its command as the path of pytest/__main__.py."""
    main_py = "/venv/lib/python3.11/site-packages/pytest/__main__.py"
    main = types.ModuleType("__main__")
    main.__file__ = main_py
    main.__spec__ = types.SimpleNamespace(name="pytest.__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "argv", [main_py, "-q", "--gpubench-json", "out dir/b.json"])
    assert results.environment("cpu")["command"] == ["python -m pytest", "-q", "--gpubench-json", "out dir/b.json"]
    # a script run by its path stays that path
    script = types.ModuleType("__main__")
    script.__file__, script.__spec__ = "/home/u/run.py", None
    monkeypatch.setitem(sys.modules, "__main__", script)
    monkeypatch.setattr(sys, "argv", ["/home/u/run.py", "--n", "3"])
    assert results.environment("cpu")["command"] == ["/home/u/run.py", "--n", "3"]


def test_gpubench_json_naming_a_new_folder_with_a_trailing_slash_writes_into_it(plugin_args, pytester):
    """`--gpubench-json runs/` (a folder not made yet) wrote a file named `runs`."""
    pytester.makepyfile(test_user="def test_x(gpubench):\n    gpubench(sum, [1], device='cpu', max_samples=5, "
                                  "min_samples=5)\n")
    result = pytester.runpytest(*plugin_args, "-p", "no:cacheprovider", "--gpubench-json", "runs/")
    result.assert_outcomes(passed=1)
    written = pytester.path / "runs" / "gpubench.json"
    assert written.is_file(), sorted(p.name for p in pytester.path.iterdir())
    assert json.loads(written.read_text())["summary"]["measurements"] == 1
    result.stdout.fnmatch_lines([f"gpubench: wrote {written}"])


def test_a_busy_other_process_counts_when_nvml_sampled_only_it(monkeypatch):
    """Our own pid is in NVML's process list (no container), but NVML's samples since the start hold only the
    other process (ours were not sampled in a short measurement): that process was taken for ours and dropped, and
    the run said nothing of sharing the GPU."""
    lists = [{"pid": OWN, "used_bytes": 1}, {"pid": 77, "used_bytes": 2}]
    record = summarize_sharing(lists, lists, {77: 60}, OWN)
    assert record["other_busy"] == {"77": 60}
    notes = []
    assert shared(record, notes) is True and "pid 77 at up to 60 % SM" in notes[0]


@pytest.mark.skipif(subprocess.run(["git", "--version"], capture_output=True).returncode != 0, reason="needs git")
def test_a_rewritten_results_file_does_not_mark_the_next_runs_commit_dirty(tmp_path, monkeypatch):
    """Two studies run one after the other from a clean checkout: the first rewrote its committed
    results/cpu/<study>.json, and the second was stamped "<sha>-dirty" though no code had changed."""
    monkeypatch.delenv("GPUSPEED_GIT", raising=False)
    checkout = _repo(tmp_path, tracked="src/gpuspeed/results.py", ignored="")
    (checkout / "results" / "cpu").mkdir(parents=True)
    (checkout / "results" / "cpu" / "bench_demo.json").write_text("{}\n")
    _git("add", ".", cwd=checkout)
    _git("commit", "-qm", "results", cwd=checkout)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True).stdout.strip()
    monkeypatch.setattr(results, "__file__", str(checkout / "src/gpuspeed/results.py"))
    (checkout / "results" / "cpu" / "bench_demo.json").write_text('{"rewritten": true}\n')
    assert results.git_commit() == sha
    (checkout / "src/gpuspeed/results.py").write_text("x = 2\n")  # code changed: that is dirty
    assert results.git_commit() == f"{sha}-dirty"
