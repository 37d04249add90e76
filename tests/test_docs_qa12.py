"""QA round 12: the first hour as the README tells it. Its Python snippet runs on a CPU-only machine, every option it
gives a command exists on that command, and the numbers its prose quotes from results files are those files'
numbers (the generated block between results:start and results:end is benchmarks/readme_results.py's, checked by
test_readme_results.py; the prose around it is typed, so it is checked here)."""

import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
H200 = ROOT / "results" / "nvidia-h200"


def _flat(text: str) -> str:
    return " ".join(text.split())


PROSE = _flat(re.sub(r"<!-- results:start -->.*?<!-- results:end -->", "", README, flags=re.S))


def test_measurement_core_snippet_runs_on_a_cpu_only_machine(capsys):
    """The README's first Python snippet, copied into a CPU-only machine, runs and prints what its comments say (it
    made its tensor with device="cuda": torch's 'Torch not compiled with CUDA enabled' traceback on the first line,
    where 'every command runs on a machine without a GPU too'). The size is cut from 4096 to 256 for the test's
    time only."""
    pytest.importorskip("torch")
    block = re.search(r"## The measurement core\s*```python\n(.*?)```", README, re.S)
    assert block, "the README's measurement-core snippet is gone"
    code = block.group(1).replace("4096", "256")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cap() without a GPU warns that nothing is enforced: the README says so
        exec(compile(code, "README.md", "exec"), {})  # the snippet is the test
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith("mm: ") and "median" in lines[0] and "n=" in lines[0], lines[0]  # print(m)
    assert lines[1].startswith("PASS"), lines[1]  # r.summary: fp32 mm against its float64 product
    assert "fits in 8.00 GiB with 15% headroom" in lines[2], lines[2]  # mem.fits("8GiB").message


def test_bench_keywords_the_readme_writes_are_options_or_said_to_be_recorded():
    """In the README's bench() section a `name=value` is an option of bench() unless the text says it is what the
    Measurement records ('recorded as `flush="per-replay"`'). It wrote '(`device_sync=True`)' as it writes
    `flush=False` and `rotate=N`: bench(..., device_sync=False) is a TypeError, device_sync being a Measurement
    field."""
    import dataclasses
    import inspect

    import gpuspeed
    from gpuspeed.stats import Measurement

    start = README.index("**`bench(fn, *args, **options)`**")
    section = README[start:README.index("**`check(", start)]
    options = set(inspect.signature(gpuspeed.bench).parameters)
    fields = {f.name for f in dataclasses.fields(Measurement)}
    wrong = []
    for m in re.finditer(r"`([a-z_]+)=[^`]*`", section):
        name, before = m.group(1), _flat(section[max(0, m.start() - 60):m.start()])
        if name not in options and not (name in fields and "recorded as" in before):
            wrong.append(f"{m.group(0)} after '...{before[-40:]}'")
    assert not wrong, wrong


def _command_options() -> tuple[dict[str, set[str]], set[str]]:
    typer = pytest.importorskip("typer")
    from gpuspeed.cli import app

    group = typer.main.get_command(app)
    per = {name: {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} for name, cmd in group.commands.items()}
    return per, {o for p in group.params for o in p.opts}


def test_every_option_the_readme_gives_a_command_is_one_of_its_options():
    """`gpuspeed CMD ... --flag` in the Commands block and in the prose's code spans: CMD exists and takes --flag."""
    per, top = _command_options()
    block = re.search(r"## Commands\s*```\n(.*?)```", README, re.S)
    assert block, "the README's Commands block is gone"
    spans = block.group(1).splitlines()
    spans += re.findall(r"`([^`\n]*gpuspeed [a-z]+[^`]*)`", re.sub(r"```.*?```", "", README, flags=re.S))
    checked, wrong = 0, []
    for span in spans:
        for part in span.split(" | "):  # `gpuspeed launch [...] | gpuspeed launch --explain ...`: two commands
            m = re.search(r"gpuspeed (?:--debug )?([a-z]+)", part)
            if not m:
                continue
            cmd = m.group(1)
            if cmd not in per:
                wrong.append(f"no command {cmd!r}: {part}")
                continue
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", part[m.end():]):
                checked += 1
                if flag not in per[cmd] | top:
                    wrong.append(f"gpuspeed {cmd} has no {flag}: {part}")
    assert checked > 40 and not wrong, wrong
