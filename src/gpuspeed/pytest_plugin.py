"""pytest plugin: the `gpubench` fixture, the GPU-correct counterpart of pytest-benchmark.

pytest-benchmark times with the wall clock and never synchronizes the GPU, so it measures launch, not
work. `gpubench(fn, *args, **bench_options)` times through gpuspeed.bench() (CUDA events, L2 flush,
adaptive stopping), returns the Measurement, and the session ends with a table of every measurement;
`--gpubench-json PATH` also writes them as a gpuspeed results file (study "gpubench").

Under pytest-xdist each measurement travels in its test's report (`user_properties`), so the controller
gets the workers' measurements for its table and file; the table then warns that parallel workers shared
the device while they were timed.

`--gpubench-json PATH` names the file itself (any name; a folder, or a PATH ending in /, gets PATH/gpubench.json);
a path that cannot be written stops the session before any test runs, as a gpuspeed `--out` does.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

_KEY = pytest.StashKey["_Recorder"]() if hasattr(pytest, "StashKey") else None
_PROPERTY = "gpubench"


def pytest_addoption(parser):
    group = parser.getgroup("gpubench", "GPU-correct benchmarks (gpuspeed)")
    group.addoption("--gpubench-json", action="store", default=None, metavar="PATH",
                    help="write the gpubench measurements to PATH as a gpuspeed results file")


class _Recorder:
    """The session's measurements: this process's, and those an xdist worker's test reports bring here."""

    def __init__(self, worker: bool = False):
        self.worker = worker  # an xdist worker: its reports still have to carry the measurements to the controller
        self.rows: list = []
        self.json_path: Path | None = None  # where --gpubench-json writes, made absolute before any test runs
        self.json_error: str | None = None
        self._alive: set = set()
        self.peak_workers = 0  # the most xdist workers up at once (not -n: --maxprocesses caps it, --tx sets it)

    @pytest.hookimpl(optionalhook=True)  # xdist's hooks: unknown (and never called) without pytest-xdist
    def pytest_testnodeready(self, node):
        self._alive.add(_node_id(node))
        self.peak_workers = max(self.peak_workers, len(self._alive))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        self._alive.discard(_node_id(node))

    @pytest.hookimpl(tryfirst=True)  # before --junitxml reads the properties: it would write each Measurement there
    def pytest_runtest_logreport(self, report):
        if report.when != "teardown":  # the teardown report carries every property the test recorded
            return
        from gpuspeed.stats import Measurement

        for name, value in report.user_properties:
            if name == _PROPERTY:
                self.rows.append((report.nodeid, Measurement.from_dict(value)))
        if not self.worker:  # the controller: taken out, as the fixture keeps them out without xdist
            report.user_properties[:] = [p for p in report.user_properties if p[0] != _PROPERTY]


def _node_id(node) -> str:
    gateway = getattr(node, "gateway", None)
    return str(getattr(gateway, "id", None) or id(node))


def _json_target(raw: str) -> Path:
    """The file --gpubench-json writes, checked now: a UsageError (pytest prints it in one line and runs no test)
    when it cannot be written, rather than a traceback after the whole session's timing."""
    if not str(raw).strip():
        raise pytest.UsageError("--gpubench-json: an empty path (give the JSON file to write)")
    path = Path(os.path.abspath(raw))  # a test that changes the working directory does not move it
    names_folder = str(raw).endswith(("/", os.sep))  # `runs/`, not made yet: abspath drops the slash that says so
    if path.is_dir() or names_folder:
        path = path / "gpubench.json"
    if path.is_dir():
        raise pytest.UsageError(f"--gpubench-json {raw}: {path} is a folder")
    folder = path.parent
    while not folder.exists() and not folder.is_symlink() and folder != folder.parent:
        folder = folder.parent  # the nearest folder that exists: the missing ones are made at the end
    if not folder.is_dir():
        raise pytest.UsageError(f"--gpubench-json {raw}: cannot write there ({folder} is not a folder)")
    try:  # a file made there, not os.access(), which says yes to root for any folder (/proc too)
        tempfile.NamedTemporaryFile(dir=folder, prefix=".gpubench-write-probe.", delete=True).close()
    except OSError as exc:
        raise pytest.UsageError(f"--gpubench-json {raw}: cannot write there ({folder}: "
                                f"{exc.strerror or exc})") from None
    return path


def pytest_configure(config):
    config.stash[_KEY] = recorder = _Recorder(worker=hasattr(config, "workerinput"))
    config.pluginmanager.register(recorder, "gpubench-recorder")
    raw = config.getoption("--gpubench-json", None)
    if raw is not None and not hasattr(config, "workerinput"):  # the controller writes the file, not the workers
        recorder.json_path = _json_target(raw)


@pytest.fixture
def gpubench(request):
    """Time a callable with gpuspeed.bench(); returns the Measurement and records it for the summary."""
    from gpuspeed.timing import bench

    used: dict = {}  # default names given in this test: a second bench of the same function gets "#2"

    def run(fn, *args, **options):
        if "name" not in options:
            test = request.node.nodeid.split("::", 1)[-1]  # the test with its class: TestBf16::test_mm[4096]
            name = f"{test}:{_callable_name(fn)}"
            used[name] = used.get(name, 0) + 1
            options["name"] = name if used[name] == 1 else f"{name}#{used[name]}"
        m = bench(fn, *args, **options)
        if hasattr(request.config, "workerinput"):  # an xdist worker: the report carries it to the controller
            request.node.user_properties.append((_PROPERTY, m.to_dict()))
        else:  # kept out of user_properties here, which --junitxml would write out, samples and all
            request.config.stash[_KEY].rows.append((request.node.nodeid, m))
        return m

    return run


def _callable_name(fn) -> str:
    """fn's name for the table: a functools.partial by its function's, a callable object by its class's."""
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", None)
    return name or type(fn).__name__


def _parallel_workers(config) -> int:
    """How many pytest-xdist workers ran at once in the session (1 without xdist or with -n 0)."""
    return max(1, config.stash[_KEY].peak_workers)


def pytest_sessionfinish(session, exitstatus):
    """Write --gpubench-json (the controller; every worker's measurements are in by now). A write that fails
    here (a full disk) is one line in the summary and a failing exit status, not a traceback."""
    config = session.config
    recorder = config.stash[_KEY]
    if hasattr(config, "workerinput") or recorder.json_path is None:
        return
    from gpuspeed.results import make_results, strict_json, write_text_atomic

    rows = recorder.rows
    doc = make_results("gpubench", rows=[{"test": nodeid, **m.to_dict()} for nodeid, m in rows],
                       summary={"measurements": len(rows), "parallel_workers": _parallel_workers(config)})
    try:
        write_text_atomic(recorder.json_path, strict_json(doc) + "\n")
    except OSError as exc:
        recorder.json_error = f"cannot write {recorder.json_path}: {exc.strerror or exc}"
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput"):  # an xdist worker: its reports went to the controller, which writes
        return
    recorder = config.stash[_KEY]
    rows = recorder.rows
    if not rows and recorder.json_path is None:
        return
    from gpuspeed.stats import flags
    from gpuspeed.timing import format_time

    tr = terminalreporter
    tr.section("gpubench")
    if not rows:
        tr.write_line("gpubench: no measurements (no test called the gpubench fixture)")
    width = max([48] + [len(m.name) for _, m in rows])  # whole names: parametrized ones differ at their end
    if rows:
        tr.write_line(f"{'name':{width}} {'median':>12} {'noise':>7} {'IQR':>6} {'n':>5} {'mode':>7}")
    for _, m in rows:
        flag = flags(m)
        tr.write_line(f"{m.name:{width}} {format_time(m.median):>12} {100 * m.rel_noise:6.2f}% "
                      f"{100 * m.rel_iqr:5.1f}% {m.n:5d} {m.mode:>7}{flag}")
    workers = _parallel_workers(config)
    if workers > 1 and rows:
        tr.write_line(f"gpubench: WARNING: {workers} pytest-xdist workers ran tests while these were timed, on the "
                      "same device and host: each time may include the others' work. Time them with -n 0.",
                      yellow=True)
    if recorder.json_error:
        tr.write_line(f"gpubench: ERROR: {recorder.json_error}", red=True)
    elif recorder.json_path is not None:
        tr.write_line(f"gpubench: wrote {recorder.json_path}")
