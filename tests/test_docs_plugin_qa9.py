"""QA round 9: the README's snippets and commands as a user runs them on the CPU, and the gpubench pytest plugin
used from a fresh test file."""

import json
import re

pytest_plugins = ["pytester"]


def test_plugin_table_keeps_long_parametrized_names_apart(plugin_args, pytester):
    """Two parametrized measurements whose names share their first 48 characters read as two different rows (the
    table cut every name at 48 characters: both rows said 'test_a_rather_long_..._matrix_siz')."""
    pytester.makepyfile(test_user="""
        import pytest

        @pytest.mark.parametrize("n", [1000, 2000])
        def test_a_rather_long_benchmark_name_for_matrix_sizes(gpubench, n):
            gpubench(sum, range(n), device="cpu", max_samples=5, min_samples=5)
        """)
    result = pytester.runpytest(*plugin_args, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    for n in (1000, 2000):
        result.stdout.fnmatch_lines([f"test_a_rather_long_benchmark_name_for_matrix_sizes[[]{n}[]]:sum *cpu*"])
    header = next(line for line in result.stdout.lines if line.startswith("name "))
    row = next(line for line in result.stdout.lines if line.startswith("test_a_rather"))
    unit = re.search(r"\d (ns|us|ms|s) ", row)
    assert unit and header.index("median") + len("median") == unit.end(1)  # the columns still line up


def test_plugin_under_xdist_keeps_measurements_out_of_junitxml(plugin_args, pytester):
    """Under pytest-xdist the measurements still reach the table and --gpubench-json, but --junitxml holds no
    `gpubench` property (each test's whole Measurement, samples and all, as a Python repr, was written there
    under -n 2 and not without xdist)."""
    import pytest

    pytest.importorskip("xdist")
    pytester.makepyfile(test_user="""
        def test_x(gpubench):
            gpubench(sum, [1, 2, 3], device="cpu", max_samples=5, min_samples=5)

        def test_y(gpubench):
            gpubench(sorted, [3, 1, 2], device="cpu", max_samples=5, min_samples=5)
        """)
    out, xml = pytester.path / "r.json", pytester.path / "j.xml"
    result = pytester.runpytest_subprocess(*plugin_args, "-p", "no:cacheprovider", "-n", "2",
                                           f"--gpubench-json={out}", f"--junitxml={xml}")
    result.assert_outcomes(passed=2)
    names = sorted(r["name"] for r in json.loads(out.read_text())["rows"])
    assert names == ["test_x:sum", "test_y:sorted"]
    result.stdout.fnmatch_lines(["test_x:sum *cpu*"])
    text = xml.read_text()
    assert 'name="test_x"' in text and "gpubench" not in text and "samples" not in text


def test_plugin_default_names_keep_same_named_tests_of_two_classes_apart(plugin_args, pytester):
    """The same test name in two classes (one per dtype, say) gives two names in the table and the file (both
    were 'test_mm:sum', told apart only by the file's `test` field)."""
    pytester.makepyfile(test_user="""
        class TestFloat32:
            def test_mm(self, gpubench):
                gpubench(sum, [1.0, 2.0], device="cpu", max_samples=5, min_samples=5)

        class TestBfloat16:
            def test_mm(self, gpubench):
                gpubench(sum, [1.0, 2.0, 3.0], device="cpu", max_samples=5, min_samples=5)

        def test_plain(gpubench):
            gpubench(sum, [1], device="cpu", max_samples=5, min_samples=5)
        """)
    out = pytester.path / "r.json"
    result = pytester.runpytest(*plugin_args, "-p", "no:cacheprovider", f"--gpubench-json={out}")
    result.assert_outcomes(passed=3)
    names = [r["name"] for r in json.loads(out.read_text())["rows"]]
    assert names == ["TestFloat32::test_mm:sum", "TestBfloat16::test_mm:sum", "test_plain:sum"]
    result.stdout.fnmatch_lines(["TestFloat32::test_mm:sum *cpu*", "TestBfloat16::test_mm:sum *cpu*"])
