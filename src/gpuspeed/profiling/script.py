"""A user's script as a callable that profile() can run again and again, as `python script.py args` would.

Each run executes one compiled code object as `__main__` with the script's folder first on sys.path and
its own argv; a module of its folder named like one gpuspeed or torch loaded (profile.py) is the one it imports.
Compiling once keeps the code objects the same from run to run, so the line timer of a later pass finds the
functions (and the module-level code) that cProfile saw in an earlier one.
A script's `sys.exit(0)` (or `os._exit(0)`) is a normal end; any other exit is recorded and stops that run there.
A script reading its standard input (a pipe or a file, not a terminal) reads in every run what the first run read,
through sys.stdin or file descriptor 0 itself (os.read(0, n), open(0), a child process it starts).
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import io
import os
import select
import sys
import tempfile
import threading
import types
from pathlib import Path

from gpuspeed.errors import UserError


class ScriptRunner:
    """Call it to run the script once. `runs` counts the runs; `exits` holds each nonzero exit status."""

    def __init__(self, script: str | os.PathLike, argv=()):
        p = Path(script)
        if p.is_dir():
            raise UserError(f"{p} is a folder, not a script: name the .py file to run")
        if not p.is_file():
            file, colon, name = str(script).rpartition(":")
            if colon and name.isidentifier() and Path(file).is_file():  # FILE.py:NAME given where a script goes
                raise UserError(f"no such file: {p}: to profile the function {name} of {file}, use --function {p}")
            raise UserError(f"no such file: {p}")
        if p.name.lower().endswith((".json", ".json.gz", ".gz")):  # it would be run as Python: `false` a NameError
            raise UserError(f"{p} is a trace or data file, not a Python script: gpuspeed profile runs a script (open "
                            "a Chrome trace in https://ui.perfetto.dev)")
        self.path = p.resolve()
        self.argv = [str(p)] + [str(a) for a in argv]
        try:
            source = self.path.read_bytes()
            self.code_root = compile(source, str(self.path), "exec", dont_inherit=True)
        except SyntaxError as exc:
            at = f"{p}:{exc.lineno}" if exc.lineno else str(p)  # null bytes: a SyntaxError with no line
            raise UserError(f"{at}: syntax error: {exc.msg}") from exc
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot read {p}: {exc}") from exc
        self.__name__ = p.stem
        self.runs = 0
        self.exits: list = []
        self._stdin: _Recorder | bytes | None = None  # what the first run read of a piped stdin, given to later runs
        self._fd0: _Fd0 | None = None  # the same for fd 0 itself, where sys.stdin reads it
        self._mine = _module_names(self.path.parent)  # the modules a script there imports from its own folder
        self._neighbours: dict = {}  # those modules as the script imported them, kept from run to run

    def _stdin_for_run(self):
        """The sys.stdin of this run, or None to leave it be: the first run reads the real one through a recorder
        (nothing is read ahead of the script: a script that never reads a pipe left open does not wait on it),
        each later run reads what the first one read. Where sys.stdin is the process's fd 0 (`python script.py`),
        fd 0 itself is replayed (_Fd0) and sys.stdin reads it."""
        if self.runs == 0 and _Fd0.applies():
            self._fd0 = _Fd0()
        if self._fd0 is not None:
            self._fd0.enter()
            real = sys.stdin
            return io.TextIOWrapper(io.FileIO(0, "rb", closefd=False),
                                    encoding=getattr(real, "encoding", None) or "utf-8",
                                    errors=getattr(real, "errors", None) or "strict")
        if isinstance(self._stdin, _Recorder):
            self._stdin = bytes(self._stdin.data)
        real = sys.stdin
        if isinstance(self._stdin, bytes):
            raw = io.BytesIO(self._stdin)
        else:
            try:
                if real is None or real.isatty() or not hasattr(real, "buffer"):
                    return None
            except (ValueError, OSError):  # closed
                return None
            raw = self._stdin = _Recorder(real.buffer)
        return io.TextIOWrapper(io.BufferedReader(raw) if isinstance(raw, _Recorder) else raw,
                                encoding=getattr(real, "encoding", None) or "utf-8",
                                errors=getattr(real, "errors", None) or "strict")

    def __call__(self) -> None:
        module = types.ModuleType("__main__")
        module.__dict__.update({"__file__": str(self.path), "__builtins__": builtins, "__spec__": None,
                                "__loader__": None, "__package__": None, "__cached__": None})
        saved_main, saved_argv, saved_path = sys.modules.get("__main__"), sys.argv, sys.path[:]
        saved_cwd = os.getcwd()  # each run starts where `python script.py` would, even after a script's os.chdir
        saved_env = dict(os.environ)  # and from the caller's environment, not the one the last run left
        saved_stdin, stdin = sys.stdin, self._stdin_for_run()
        if stdin is not None:
            sys.stdin = stdin
        sys.modules["__main__"] = module  # pickling and `if __name__ == "__main__"` see the script
        sys.argv = list(self.argv)
        sys.path.insert(0, str(self.path.parent))  # neighbour modules import as under `python script.py`
        theirs = self._swap_in_neighbours()
        self.runs += 1
        real_exit, me = os._exit, os.getpid()

        def script_exit(code):  # the script's os._exit would end gpuspeed itself: it ends the run, as sys.exit does
            if os.getpid() != me:  # a process the script forked (multiprocessing) exits for real
                real_exit(code)
            raise SystemExit(code)

        os._exit = script_exit
        try:
            exec(self.code_root, module.__dict__)
        except SystemExit as exc:
            if exc.code not in (0, None):
                self.exits.append(exc.code)
        finally:
            with contextlib.suppress(OSError):  # the script removed the folder it started in: nothing to go back to
                os.chdir(saved_cwd)
            if dict(os.environ) != saved_env:
                os.environ.clear()
                os.environ.update(saved_env)
            os._exit = real_exit
            sys.stdin = saved_stdin
            if self._fd0 is not None:
                self._fd0.leave()
            sys.argv = saved_argv
            sys.path[:] = saved_path
            self._swap_out_neighbours(theirs)
            if saved_main is not None:
                sys.modules["__main__"] = saved_main

    def _swap_in_neighbours(self) -> dict:
        """Make the script's own profile.py (or inspect.py, ...) what it imports, as under `python script.py`: a
        module of that name gpuspeed or torch loaded from elsewhere is set aside for the run, and the script's own
        modules from its earlier runs come back. Returns what was set aside."""
        theirs = {}
        for name in _shadowed(self._mine, self.path.parent):
            for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
                theirs[key] = sys.modules.pop(key)
        sys.modules.update(self._neighbours)
        return theirs

    def _swap_out_neighbours(self, theirs: dict) -> None:
        """Between runs the script's own modules are kept aside (gpuspeed's `import cProfile` then finds the
        standard library's profile, not the script's), and what was set aside comes back."""
        for key in [k for k in sys.modules if k.partition(".")[0] in self._mine]:
            if _in_folder(sys.modules[key], self.path.parent):
                self._neighbours[key] = sys.modules.pop(key)  # the script's: its code objects stay the same
        sys.modules.update(theirs)

    def failed_run_note(self, total: int) -> str:
        """Where a run after the first raised: which one, of the `total` runs planned; '' when the first did. A script
        that runs once under `python script.py` may fail on what its earlier run left (os.mkdir's folder)."""
        if self.runs <= 1:
            return ""
        before = "run 1" if self.runs == 2 else f"runs 1 to {self.runs - 1}"
        ended = "ended" if self.exits else "ended normally"
        return (f" in run {self.runs} of {total}: {before} {ended} (gpuspeed profile runs the script {total} times; "
                "a run can fail on what an earlier one left behind, such as a folder made with os.mkdir)")

    def exit_note(self) -> str | None:
        """One line on nonzero exits, or None when every run ended normally."""
        if not self.exits:
            return None
        codes = sorted({repr(c) if not isinstance(c, int) else str(c) for c in self.exits})
        return (f"the script called sys.exit({', '.join(codes)}) in {len(self.exits)} of {self.runs} runs: the "
                "profile covers the code up to that exit")


def _module_names(folder: Path) -> frozenset:
    """The top-level modules of `folder`: name.py and name/__init__.py."""
    try:
        return frozenset(p.stem if p.suffix == ".py" else p.name for p in folder.iterdir()
                         if ((p.suffix == ".py" and p.is_file()) or (p.is_dir() and (p / "__init__.py").is_file()))
                         and (p.stem if p.suffix == ".py" else p.name).isidentifier())
    except OSError:
        return frozenset()


def _in_folder(module, folder: Path) -> bool:
    file = getattr(module, "__file__", None)
    try:
        return bool(file) and folder in Path(file).resolve().parents
    except (OSError, TypeError, ValueError):
        return False


def _shadowed(mine: frozenset, folder: Path) -> list[str]:
    """Of the script's own modules, those this process has loaded from elsewhere (profile, inspect, ... by gpuspeed
    or torch): under `python script.py` the script's would be imported. Those a bare interpreter loads at startup
    (os, io, ...) stay: they win over the script's under python too."""
    clash = [n for n in mine if n in sys.modules and n not in sys.builtin_module_names
             and not _in_folder(sys.modules[n], folder)]
    return [n for n in clash if n not in _startup_modules()] if clash else []


@functools.lru_cache(maxsize=1)
def _startup_modules() -> frozenset:
    """The modules a bare `python script.py` has loaded before the script's first line."""
    import subprocess

    try:
        out = subprocess.run([sys.executable, "-c", "import sys; print(' '.join(sys.modules))"], capture_output=True,
                             text=True, timeout=60, cwd=tempfile.gettempdir(), check=True).stdout
    except (OSError, subprocess.SubprocessError):  # unknown: none is set aside (the behaviour before)
        return frozenset(sys.modules)
    return frozenset(out.split())


def raised_at(exc: BaseException) -> str | None:
    """'file.py:line in function' of the innermost frame of the user's own code in exc's traceback (not
    gpuspeed's, nor the standard library's or an installed package's), or None."""
    import sysconfig

    own = str(Path(__file__).resolve().parents[1])
    installed = {str(Path(p).resolve()) for p in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                                                  sysconfig.get_paths()["platlib"])}

    def users(file: str) -> bool:
        return not file.startswith("<") and not file.startswith(own) and not any(file.startswith(p) for p in installed)

    found = None
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if users(code.co_filename):
            found = f"{Path(code.co_filename).name}:{tb.tb_lineno} in {code.co_name}"
        tb = tb.tb_next
    # an error torch.compile met while tracing is raised from dynamo's frames: the user's are in its real_stack
    for frame in getattr(exc, "real_stack", None) or ():
        if users(getattr(frame, "filename", "<")):
            found = f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
    return found


class _Recorder(io.RawIOBase):
    """A raw reader over a binary stream that keeps every byte read from it."""

    def __init__(self, source):
        super().__init__()
        self.source, self.data = source, bytearray()

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        read1 = getattr(self.source, "read1", None)
        chunk = read1(len(b)) if read1 is not None else self.source.read(len(b))
        chunk = chunk or b""
        b[:len(chunk)] = chunk
        self.data += chunk
        return len(chunk)


class _Fd0:
    """File descriptor 0 of a script's runs. In the first, a pipe fed by a thread that reads the real input and
    keeps every byte it passes on (the script waits on nothing it does not read); in each later run, a file of
    those bytes. The real fd 0 comes back after each run."""

    CHUNK = 1 << 16

    @staticmethod
    def applies() -> bool:
        """sys.stdin is the process's fd 0, and that is a pipe or a file, not a terminal."""
        try:
            return sys.stdin is not None and sys.stdin.fileno() == 0 and not os.isatty(0)
        except (AttributeError, OSError, ValueError):  # no fileno (a notebook, pytest's capture), or closed
            return False

    def __init__(self):
        self.data = bytearray()
        self.file: int | None = None  # the later runs' input: a file descriptor (an unlinked temporary file)
        self.saved: int | None = None
        self.stop = threading.Event()
        self.pump: threading.Thread | None = None

    def enter(self) -> None:
        self.saved = os.dup(0)
        if self.file is not None:  # a later run: what the first one was given
            os.lseek(self.file, 0, os.SEEK_SET)
            os.dup2(self.file, 0)
            return
        read_end, write_end = os.pipe()
        os.dup2(read_end, 0)
        os.close(read_end)
        source = os.dup(self.saved)
        self.pump = threading.Thread(target=self._pump, args=(source, write_end), name="gpuspeed-stdin", daemon=True)
        self.pump.start()

    def _pump(self, source: int, sink: int) -> None:
        try:
            while not self.stop.is_set():
                if not select.select([source], [], [], 0.05)[0]:
                    continue
                chunk = os.read(source, self.CHUNK)
                if not chunk:
                    break
                self.data += chunk
                view = memoryview(chunk)
                while view:
                    view = view[os.write(sink, view):]
        except OSError:  # the run ended and its end of the pipe closed (BrokenPipeError), or the input failed
            pass
        finally:
            os.close(source)
            os.close(sink)

    def leave(self) -> None:
        if self.saved is None:
            return
        os.dup2(self.saved, 0)  # the real input back; the pipe's last reader closes with it
        os.close(self.saved)
        self.saved = None
        if self.pump is not None:
            self.stop.set()
            self.pump.join(timeout=2)
            self.pump = None
            fd, name = tempfile.mkstemp(prefix="gpuspeed-stdin-")
            os.unlink(name)
            view = memoryview(bytes(self.data))
            while view:
                view = view[os.write(fd, view):]
            self.file = fd

    def __del__(self):
        if self.file is not None:
            with contextlib.suppress(OSError):
                os.close(self.file)


@contextlib.contextmanager
def stdout_to_stderr():
    """Send everything written to stdout (Python prints and C-level writes) to stderr for the duration,
    so that `--json` output on stdout stays machine-readable."""
    sys.stdout.flush()
    try:
        out_fd, err_fd = sys.__stdout__.fileno(), sys.__stderr__.fileno()
    except (AttributeError, OSError, ValueError):
        out_fd = err_fd = None
    saved = None
    if out_fd is not None:
        sys.__stdout__.flush()
        saved = os.dup(out_fd)
        os.dup2(err_fd, out_fd)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            sys.__stdout__.flush()
            os.dup2(saved, out_fd)
            os.close(saved)


def print_json_alone(text: str) -> None:
    """Print a command's --json text on stdout as the last thing stdout gets: what the user's code writes later (an
    atexit handler of a profiled script or a kernel file, run when the process ends) goes to stderr. It printed
    after the JSON, so stdout no longer parsed as JSON alone. atexit runs the last handler registered first: this
    one, registered after the user's code ran, moves stdout (sys.stdout and file descriptor 1) to stderr before
    theirs run. Only where stdout is the process's own (a command line), not one captured by a host (pytest, a
    notebook calling gpuspeed.cli.main), which keeps its stdout."""
    import atexit

    print(text, flush=True)
    if sys.stdout is sys.__stdout__:
        atexit.register(_stdout_to_stderr_now)


def _stdout_to_stderr_now() -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with contextlib.suppress(AttributeError, OSError, ValueError):
        sys.__stdout__.flush()
        os.dup2(sys.__stderr__.fileno(), sys.__stdout__.fileno())
    sys.stdout = sys.stderr
