"""benchmarks/readme_results.py: the README quotes each study's current results file, ARCHIVE.md the runs kept
under their commit, and every committed results file lands in exactly one of the two."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("readme_results", ROOT / "benchmarks" / "readme_results.py")
readme_results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_results)


def test_runs_kept_under_a_commit_are_archived_and_current_files_are_not():
    for name in ("kernels_e339aaa.json", "decode_2d128f4_tiny_capped.json", "decode_b651bde_partial.json"):
        assert readme_results.archived(Path(name)), name
    for name in ("kernels.json", "bench_accuracy.json", "profile_planted.json", "matmul_power.json", "decode.json"):
        assert not readme_results.archived(Path(name)), name


def test_every_results_file_is_quoted_once_with_a_link_that_resolves():
    readme = (ROOT / "README.md").read_text()
    archive_path = ROOT / "results" / "ARCHIVE.md"
    archive = archive_path.read_text()
    for path in sorted(ROOT.glob("results/*/*.json")):
        rel = path.relative_to(ROOT).as_posix()
        doc = json.loads(path.read_text())
        if "summary" not in doc or "study" not in doc:  # what block() quotes
            continue
        in_readme, in_archive = f"]({rel})" in readme, f"]({path.relative_to(archive_path.parent).as_posix()})" in archive
        assert in_readme != in_archive, (rel, in_readme, in_archive)
        assert in_archive == readme_results.archived(path), rel


def test_a_partial_run_is_never_quoted_as_the_current_result(tmp_path):
    """A stopped run's file (params.partial: roofline.partial.json beside a complete roofline.json, or a partial
    roofline.json alone) goes to the archive, labelled, never to the README's current block."""
    doc = {"study": "roofline", "params": {"partial": True}, "summary": {"copy_GBps": 1.0}, "device": {"name": "X"}}
    for name in ("roofline.partial.json", "roofline.json"):
        path = tmp_path / name
        path.write_text(json.dumps(doc))
        assert readme_results.archived(path), name
        assert "partial (stopped before its end)" in readme_results.block([path], base=tmp_path)
    complete = tmp_path / "launch.json"
    complete.write_text(json.dumps({**doc, "study": "launch", "params": {"partial": False}}))
    assert not readme_results.archived(complete)
