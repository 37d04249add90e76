"""pytest plugin: the `gpubench` fixture, the GPU-correct counterpart of pytest-benchmark.

pytest-benchmark times with the wall clock and never synchronizes the GPU, so it measures launch, not
work. `gpubench(fn, *args, **bench_options)` times through gpuspeed.bench() (CUDA events, L2 flush,
adaptive stopping), returns the Measurement, and the session ends with a table of every measurement;
`--gpubench-json PATH` also writes them as a gpuspeed results file (study "gpubench").

Under pytest-xdist each measurement travels in its test's report (`user_properties`), so the controller
gets the workers' measurements for its table and file; the table then warns that parallel workers shared
the device while they were timed.
"""

from __future__ import annotations

import pytest

_KEY = pytest.StashKey["_Recorder"]() if hasattr(pytest, "StashKey") else None
_PROPERTY = "gpubench"


def pytest_addoption(parser):
    group = parser.getgroup("gpubench", "GPU-correct benchmarks (gpuspeed)")
    group.addoption("--gpubench-json", action="store", default=None, metavar="PATH",
                    help="write the gpubench measurements to PATH as a gpuspeed results file")


class _Recorder:
    """The session's measurements: this process's, and those an xdist worker's test reports bring here."""

    def __init__(self):
        self.rows: list = []

    def pytest_runtest_logreport(self, report):
        if report.when != "teardown":  # the teardown report carries every property the test recorded
            return
        from gpuspeed.stats import Measurement

        for name, value in report.user_properties:
            if name == _PROPERTY:
                self.rows.append((report.nodeid, Measurement.from_dict(value)))


def pytest_configure(config):
    config.stash[_KEY] = recorder = _Recorder()
    config.pluginmanager.register(recorder, "gpubench-recorder")


@pytest.fixture
def gpubench(request):
    """Time a callable with gpuspeed.bench(); returns the Measurement and records it for the summary."""
    from gpuspeed.timing import bench

    def run(fn, *args, **options):
        options.setdefault("name", f"{request.node.name}:{getattr(fn, '__name__', 'fn')}")
        m = bench(fn, *args, **options)
        if hasattr(request.config, "workerinput"):  # an xdist worker: the report carries it to the controller
            request.node.user_properties.append((_PROPERTY, m.to_dict()))
        else:  # kept out of user_properties here, which --junitxml would write out, samples and all
            request.config.stash[_KEY].rows.append((request.node.nodeid, m))
        return m

    return run


def _parallel_workers(config) -> int:
    """How many pytest-xdist workers ran the session (1 without xdist or with -n 0)."""
    if config.getoption("dist", "no") == "no":
        return 1
    return int(config.getoption("numprocesses", None) or 1)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput"):  # an xdist worker: its reports went to the controller, which writes
        return
    rows = config.stash[_KEY].rows
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
    workers = _parallel_workers(config)
    if workers > 1:
        tr.write_line(f"gpubench: WARNING: {workers} pytest-xdist workers ran tests while these were timed, on the "
                      "same device and host: each time may include the others' work. Time them with -n 0.",
                      yellow=True)
    path = config.getoption("--gpubench-json")
    if path:
        from gpuspeed.results import make_results, write_results

        doc = make_results("gpubench", rows=[{"test": nodeid, **m.to_dict()} for nodeid, m in rows],
                           summary={"measurements": len(rows), "parallel_workers": workers})
        tr.write_line(f"gpubench: wrote {write_results(doc, path)}")
