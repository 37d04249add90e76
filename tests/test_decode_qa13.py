"""QA round 13: `gpuspeed decode` as a user runs it (in a pipe, with bad input) and the decode study's merging
(benchmarks/decode.py --merge/--keep, the summary keys)."""

from __future__ import annotations

import json

from decode_cli_helpers import TINY, cli


def test_a_run_in_a_pipe_prints_a_line_per_step_on_stderr_and_json_stays_on_stdout(capsys):
    """Off a terminal the rich bar is hidden: a default CPU run (a minute or two) printed nothing until its end."""
    rc, cap = cli(TINY + ["--prompt-len", "3", "--json"], capsys)
    assert rc == 0, cap.err
    doc = json.loads(cap.out)  # stdout is the document alone
    assert doc["study"] == "decode"
    lines = cap.err.strip().splitlines()
    assert all(ln.startswith("gpuspeed decode [") for ln in lines), cap.err
    said = "\n".join(lines)
    for step in ("loading model", "read ceiling", "now tiny_fp32 V2"):
        assert step in said, said
    assert " 3/3 tiny_fp32 V2: " in lines[-1] and "now" not in lines[-1], lines  # the last step's end is said too
