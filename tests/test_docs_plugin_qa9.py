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
