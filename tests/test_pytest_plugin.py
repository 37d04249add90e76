"""The gpubench fixture: times through bench(), prints a table, writes JSON."""

import json

pytest_plugins = ["pytester"]


def test_gpubench_fixture_table_and_json(plugin_args, pytester, tmp_path):
    pytester.makepyfile(
        """
        import time

        def test_sleep(gpubench):
            m = gpubench(time.sleep, 0.002, device="cpu", max_samples=15, min_samples=5)
            assert m.mode == "cpu" and abs(m.median - 0.002) < 0.001
        """
    )
    out = tmp_path / "gb.json"
    result = pytester.runpytest_subprocess(*plugin_args, f"--gpubench-json={out}")  # the pytest11 entry point loads it
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*gpubench*", "*test_sleep:sleep*ms*cpu*"])
    doc = json.loads(out.read_text())
    assert doc["study"] == "gpubench" and doc["rows"][0]["n"] >= 5


def test_gpubench_under_xdist_reports_the_workers_measurements_and_warns(plugin_args, pytester, tmp_path):
    """Under pytest-xdist each measurement is made in a worker: the controller's table and file must still hold
    all of them, and say that parallel workers shared the machine while they were timed."""
    import pytest

    pytest.importorskip("xdist")
    pytester.makepyfile(
        test_a="""
        import time

        def test_one(gpubench):
            gpubench(time.sleep, 0.001, device="cpu", max_samples=6, min_samples=5)
        """,
        test_b="""
        import time

        def test_two(gpubench):
            gpubench(time.sleep, 0.001, device="cpu", max_samples=6, min_samples=5)
        """,
    )
    out = tmp_path / "gb.json"
    result = pytester.runpytest_subprocess(*plugin_args, "-n", "2", f"--gpubench-json={out}")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_one:sleep*", "*WARNING: 2 pytest-xdist workers*"])
    doc = json.loads(out.read_text())
    assert sorted(r["test"].split("::")[-1] for r in doc["rows"]) == ["test_one", "test_two"]
    assert doc["summary"]["parallel_workers"] == 2
