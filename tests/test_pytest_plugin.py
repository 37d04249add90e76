"""The gpubench fixture: times through bench(), prints a table, writes JSON."""

import json

pytest_plugins = ["pytester"]


def test_gpubench_fixture_table_and_json(pytester, tmp_path):
    pytester.makepyfile(
        """
        import time

        def test_sleep(gpubench):
            m = gpubench(time.sleep, 0.002, device="cpu", max_samples=15, min_samples=5)
            assert m.mode == "cpu" and abs(m.median - 0.002) < 0.001
        """
    )
    out = tmp_path / "gb.json"
    result = pytester.runpytest_subprocess(f"--gpubench-json={out}")  # the pytest11 entry point loads it
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*gpubench*", "*test_sleep:sleep*ms*cpu*"])
    doc = json.loads(out.read_text())
    assert doc["study"] == "gpubench" and doc["rows"][0]["n"] >= 5
