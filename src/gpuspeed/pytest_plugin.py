"""pytest plugin: the `gpubench` fixture, the GPU-correct counterpart of pytest-benchmark.

pytest-benchmark times with the wall clock and never synchronizes the GPU, so it measures launch, not
work. `gpubench(fn, *args, **bench_options)` times through gpuspeed.bench() (CUDA events, L2 flush,
adaptive stopping), returns the Measurement, and the session ends with a table of every measurement;
`--gpubench-json PATH` also writes them as a gpuspeed results file (study "gpubench").
"""

from __future__ import annotations

import pytest

_KEY = pytest.StashKey[list]() if hasattr(pytest, "StashKey") else None


def pytest_addoption(parser):
    group = parser.getgroup("gpubench", "GPU-correct benchmarks (gpuspeed)")
    group.addoption("--gpubench-json", action="store", default=None, metavar="PATH",
                    help="write the gpubench measurements to PATH as a gpuspeed results file")


def pytest_configure(config):
    config.stash[_KEY] = []


@pytest.fixture
def gpubench(request):
    """Time a callable with gpuspeed.bench(); returns the Measurement and records it for the summary."""
    from gpuspeed.timing import bench

    def run(fn, *args, **options):
        options.setdefault("name", f"{request.node.name}:{getattr(fn, '__name__', 'fn')}")
        m = bench(fn, *args, **options)
        request.config.stash[_KEY].append((request.node.nodeid, m))
        return m

    return run


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    rows = config.stash.get(_KEY, [])
    if not rows:
        return
    from gpuspeed.timing import format_time

    tr = terminalreporter
    tr.section("gpubench")
    tr.write_line(f"{'name':48} {'median':>12} {'noise':>7} {'IQR':>6} {'n':>5} {'mode':>7}")
    for _, m in rows:
        flag = " THROTTLED" if m.throttled else ""
        tr.write_line(f"{m.name[:48]:48} {format_time(m.median):>12} {100 * m.rel_noise:6.2f}% "
                      f"{100 * m.rel_iqr:5.1f}% {m.n:5d} {m.mode:>7}{flag}")
    path = config.getoption("--gpubench-json")
    if path:
        from gpuspeed.results import make_results, write_results

        doc = make_results("gpubench", rows=[{"test": nodeid, **m.to_dict()} for nodeid, m in rows],
                           summary={"measurements": len(rows)})
        tr.write_line(f"gpubench: wrote {write_results(doc, path)}")
