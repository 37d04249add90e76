"""The results schema: every study writes one JSON file through here, with its environment stamp.

{"study", "schema": 1, "created", "command", "git", "device", "versions", "params", "summary", "rows",
 "notes"} -- see shared/design.md. Files live at <out>/<study>.json, normally results/<gpu-slug>/.
Writes are atomic (temp file + rename), so a crash never leaves a half-written results file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from gpuspeed import device as _device
from gpuspeed.errors import UserError

SCHEMA = 1
REQUIRED = ("study", "schema", "created", "command", "git", "device", "versions", "params", "summary", "rows",
            "notes")


def git_commit(cwd: str | os.PathLike | None = None) -> str | None:
    """The commit of the checkout gpuspeed runs from ("<sha>-dirty" with local changes), or None."""
    if os.environ.get("GPUSPEED_GIT"):  # set where the checkout travels without .git (the device)
        return os.environ["GPUSPEED_GIT"]
    here = Path(cwd) if cwd else Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        if not sha:
            return None
        if not cwd and not _tracked(Path(__file__).resolve()):  # installed in a project's .venv: its commit, not ours
            return None
        # the results folder left out: a study rewriting its committed results file is no change to the code
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ":(top)",
                                ":(top,exclude)results"], cwd=here, capture_output=True, text=True,
                               timeout=5).stdout.strip()
        return f"{sha}-dirty" if dirty else sha
    except (OSError, subprocess.SubprocessError):
        return None


def _tracked(path: Path) -> bool:
    """Whether the git checkout around `path` tracks that file (gpuspeed's own checkout, not a project whose
    ignored .venv gpuspeed was installed into)."""
    return subprocess.run(["git", "ls-files", "--error-unmatch", "--", path.name], cwd=path.parent,
                          capture_output=True, timeout=5).returncode == 0


# the command line of a `gpuspeed.cli.main([...])` call in progress (a notebook or script calling the CLI): the
# process's own sys.argv is then its host's (a notebook kernel's launcher), not the command
_COMMAND: list[str] | None = None


@contextlib.contextmanager
def command_line(argv: list[str]):
    """Inside the block, results files record `argv` as their command."""
    global _COMMAND
    saved, _COMMAND = _COMMAND, list(argv)
    try:
        yield
    finally:
        _COMMAND = saved


def _run_as_module(argv0: str) -> str | None:
    """The module `python -m MODULE` ran, where sys.argv[0] is that module's file; None for a script run by path."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    file = getattr(main, "__file__", None)
    if not name or not file or os.path.abspath(file) != os.path.abspath(argv0):
        return None
    return name.removesuffix(".__main__")


def environment(device: str = "auto") -> dict:
    """The stamp every results file carries: device, library versions, git commit, command line."""
    info = _device.get_device(device)
    argv = list(_COMMAND) if _COMMAND is not None else list(sys.argv)
    module = _run_as_module(argv[0]) if argv and _COMMAND is None else None
    if module:  # `python -m pytest ...`: sys.argv[0] is the path of pytest/__main__.py
        argv[0] = f"python -m {module}"
    elif argv and argv[0].replace("\\", "/").endswith("gpuspeed/__main__.py"):  # `python -m gpuspeed ...`
        argv[0] = "python -m gpuspeed"
    return {
        "command": argv,
        "git": git_commit(),
        "device": info.to_dict() | {"slug": info.slug},
        "versions": _device.versions(),
    }


def _jsonable(obj: Any):
    """Plain JSON: NaN/inf become None, numpy and torch scalars become Python numbers, dataclasses dicts, sets
    sorted lists, bytes text (undecodable bytes as \\xNN escapes)."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        items = [_jsonable(v) for v in obj]
        try:
            return sorted(items)
        except TypeError:  # mixed kinds: a stable order all the same
            return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj).decode("utf-8", errors="backslashreplace")
    if hasattr(obj, "to_dict") and callable(obj.to_dict):
        return _jsonable(obj.to_dict())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if hasattr(obj, f.name)})
    if hasattr(obj, "tolist") and callable(obj.tolist) and hasattr(obj, "ndim"):  # numpy/torch arrays, scalars
        return _jsonable(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def make_results(study: str, *, params: dict | None = None, summary: dict | None = None,
                 rows: list | None = None, notes: list | None = None, device: str = "auto") -> dict:
    """A results document with a fresh environment stamp."""
    if not study or not study.replace("_", "").replace("-", "").isalnum():
        raise UserError(f"bad study name {study!r}")
    doc = {"study": study, "schema": SCHEMA,
           "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    doc |= environment(device)
    doc |= {"params": params or {}, "summary": summary or {}, "rows": rows or [], "notes": notes or []}
    return _jsonable(doc)


def default_dir(device: str = "auto") -> Path:
    """results/<gpu-slug> under the current directory."""
    return Path("results") / _device.get_device(device).slug


def check_out_dir(out: str | os.PathLike | None) -> Path | None:
    """Validate a command's `--out DIR` before any work starts: a one-line UserError (exit 2) when it
    names an existing file or a folder that cannot be created or written. Creates the folder; returns its path, with
    a leading ~ expanded (the commands write there)."""
    if out is None:
        return None
    if not str(out).strip():  # Path("") is ".": an unset $VAR in `--out "$VAR"` would write into the cwd
        raise UserError(f"--out {str(out)!r}: an empty path (give a folder, '.' for this one)")
    if "\0" in str(out):
        raise UserError(f"--out {str(out)!r}: a path cannot hold a NUL character")
    path = Path(out).expanduser()  # `--out=~/runs`: the shell expands no ~ after '=', so a folder named '~' was made
    if path.exists() and not path.is_dir():
        raise UserError(f"--out {path}: exists and is not a directory")
    if path.is_symlink() and not path.exists():
        raise UserError(f"--out {path}: a symlink to {os.readlink(path)}, which does not exist")
    try:
        missing = [p for p in (path, *path.parents) if not p.exists()]
        path.mkdir(parents=True, exist_ok=True)
        CREATED.extend(missing)  # deepest first: remove_created() takes back what an error left empty
        probe = tempfile.NamedTemporaryFile(dir=path, prefix=".gpuspeed-write-probe.", delete=True)
        probe.close()
    except OSError as exc:
        raise UserError(f"--out {path}: cannot write there ({exc.strerror or exc})") from exc
    return path


CREATED: list[Path] = []  # folders check_out_dir made in this process


def remove_created() -> None:
    """Remove the folders check_out_dir made that are still empty (a command that ended in an error leaves no
    empty --out behind)."""
    while CREATED:
        path = CREATED.pop(0)
        try:
            path.rmdir()  # only an empty folder goes
        except OSError:
            pass


def _umask() -> int:
    """The process umask: from /proc where Linux shows it, else by setting it and putting it straight back
    (which another thread creating a file in that instant would see)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class Terminated(KeyboardInterrupt):
    """SIGTERM (`timeout`, a job scheduler, a benchmark's limit) inside stop_signals(): it unwinds like Ctrl-C."""


def _terminated(signum, _frame):
    import signal

    if os.getpid() not in _STOPPING_PIDS:  # a process forked from gpuspeed's (a user's Pool worker): SIGTERM ends it
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise Terminated(signum)


_STOPPING_PIDS: set[int] = set()  # the processes stop_signals() installed _terminated in


EARLY_SIGNALS: list[int] = []  # the signals stop_early()'s handler turned into an exception (the CLI says which)


def stop_early() -> None:
    """For the process's entry point (`gpuspeed`, `python -m gpuspeed`): from here until a command's stop_signals(),
    SIGTERM and Ctrl-C end the run with the same one line and 143 / 130. SIGTERM killed it where it stood (exit -15,
    not a word, an empty --out left), Ctrl-C during an import ended in a traceback and -2."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        _EARLY_PID[:] = [os.getpid()]
        # Ctrl-C's first: once SIGTERM shows as caught (/proc/PID/status), both are gpuspeed's (a SIGINT in between
        # met Python's own handler, a traceback inside signal.signal and -2)
        for s in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(s) is not signal.SIG_IGN:  # ignored by the caller (`cmd &` in a script): stays so
                signal.signal(s, _stopped_early)


_EARLY_PID: list[int] = []  # the process stop_early() was called in (a forked child inherits the handler)


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _stopped_early(signum, frame):
    import signal

    term = signum == signal.SIGTERM
    if os.getpid() not in _EARLY_PID:  # a process forked from gpuspeed's: the signal does what it would there
        signal.signal(signum, signal.SIG_DFL if term else signal.default_int_handler)
        if not term:
            raise KeyboardInterrupt
        os.kill(os.getpid(), signum)
        return
    if _importing(frame):
        # raised inside an import, the exception can unwind through an extension's init (torch's pybind11 aborts) or
        # past the CLI's handler (a traceback, -2); nothing is measured yet, so the process ends here, with the line
        remove_created()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.write(2, b"gpuspeed: stopped by SIGTERM\n" if term else b"gpuspeed: interrupted\n")
        os._exit(143 if term else 130)
    EARLY_SIGNALS.append(signum)
    raise Terminated(signum) if term else KeyboardInterrupt


def _signals_as_python_leaves_them() -> None:
    """In a process forked from gpuspeed's (a user's Pool worker): SIGTERM and Ctrl-C do what they would under
    `python script.py`. Left as gpuspeed's Python-level handlers, a SIGTERM landing just before the worker blocked
    in its queue's semaphore was only noted, never run: Pool.terminate() then waited on it forever (one run in ~8
    under load). A handler the user's script set is left alone."""
    import signal

    ours = (_terminated, _stopped_early)
    with contextlib.suppress(ValueError, OSError):  # no handler can be set here (not the main interpreter)
        if signal.getsignal(signal.SIGTERM) in ours:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if signal.getsignal(signal.SIGINT) in ours:
            signal.signal(signal.SIGINT, signal.default_int_handler)


if hasattr(os, "register_at_fork"):  # POSIX; a fork made in C code without Python's hooks meets the handlers' own check
    os.register_at_fork(after_in_child=_signals_as_python_leaves_them)


@contextlib.contextmanager
def stop_signals(keep=None):
    """A command's measuring, stopped from outside. Inside, SIGTERM unwinds like Ctrl-C (it killed the process
    where it stood: no line said why, an empty --out was left and every step measured was lost). On either,
    `keep()` (if given) writes what was measured and returns a few words saying where (or None: nothing kept);
    then one line on stderr says what happened and the process exits 130 (Ctrl-C) or 143 (SIGTERM). A Ctrl-C with
    nothing kept goes on as KeyboardInterrupt (the CLI's own line and 130). A second signal while keep() writes is
    ignored: the files it writes are whole."""
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()  # signal handlers are the main thread's only
    # a SIGTERM the caller ignores (`trap '' TERM`) stays ignored: previous is then SIG_IGN, put back as it was
    previous = signal.getsignal(signal.SIGTERM) if main else None
    if main and previous is not signal.SIG_IGN:
        _STOPPING_PIDS.add(os.getpid())
        signal.signal(signal.SIGTERM, _terminated)
    early_int = main and signal.getsignal(signal.SIGINT) is _stopped_early
    if early_int:  # Ctrl-C is a KeyboardInterrupt here, wherever it lands: keep() writes what was measured
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    except KeyboardInterrupt as exc:
        term = isinstance(exc, Terminated)
        if main:
            signal.signal(signal.SIGTERM, previous)
        kept = None
        if keep is not None:
            held = ({s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)} if main else {})
            try:
                kept = keep()
            except Exception as err:  # the rows could not be written: said, not a traceback over the interrupt
                from gpuspeed.errors import one_line

                kept = f"nothing kept ({one_line(err)})"
            finally:
                for s, h in held.items():
                    signal.signal(s, h)
        if not term and kept is None:
            raise
        print(f"gpuspeed: {'stopped by SIGTERM' if term else 'interrupted'}" + (f": {kept}" if kept else ""),
              file=sys.stderr, flush=True)
        raise SystemExit(143 if term else 130) from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
        if early_int:
            signal.signal(signal.SIGINT, _stopped_early)


@contextlib.contextmanager
def signals_held():
    """Ctrl-C and SIGTERM wait until the block ends (a command writing its files): they never leave one of them
    written and the next not; then they stop the command as stop_signals() says (one line, 130 or 143). Held by
    handlers that note the signal (blocking it in this thread would not hold one that another thread takes). Not
    in the main thread, where no handler can be set, as is."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    with stop_signals():  # a SIGTERM held till the end is said in one line, not a silent kill after the files
        saved = {s: signal.signal(s, lambda signum, _frame: caught.append(signum))
                 for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not signal.SIG_IGN}
        try:
            yield
        finally:
            for s, h in saved.items():
                signal.signal(s, h)
        if caught:
            raise Terminated(caught[0]) if signal.SIGTERM in caught else KeyboardInterrupt


def strict_json(obj: Any, indent: int | None = 1) -> str:
    """JSON text as the results files hold it: NaN and infinities as null, arrays and measurements as lists and
    dicts (a command's --json prints this, so its stdout parses as strict JSON)."""
    return json.dumps(_jsonable(obj), indent=indent, allow_nan=False)


def write_results(doc: dict, out: str | os.PathLike | None = None) -> Path:
    """Write a results document atomically to <out>/<study>.json (out may also name a .json file that is
    not a folder: a command's `--out x.json` was made a folder by check_out_dir, and is written into)."""
    text = strict_json(doc) + "\n"  # all of it before anything is written: a failure leaves no file behind
    validate(json.loads(text))  # what the file holds: numpy scalars in the summary are numbers there
    target = Path(out) if out is not None else default_dir()
    path = target if target.suffix == ".json" and not target.is_dir() else target / f"{doc['study']}.json"
    try:
        written = write_text_atomic(path, text)
    except OSError as exc:  # a full disk, a folder where the file goes, a parent that is a file
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from exc
    params = doc.get("params")
    if path.name == f"{doc['study']}.json" and not (isinstance(params, dict) and params.get("partial")):
        drop_partials(path.parent, doc["study"])
    return written


def drop_partials(folder: Path, study: str) -> None:
    """Remove <study>.partial.* (json, md, plots) from `folder`: a run stopped before a complete <study>.json was
    written there, which a reader would otherwise take beside it. Called once that complete file is in place."""
    prefix = f"{study}.partial."
    try:
        stale = [p for p in folder.iterdir() if p.name.startswith(prefix) and p.is_file()]
        for p in stale:
            p.unlink(missing_ok=True)
    except OSError:  # an unreadable folder, a file another process holds: the complete file is written all the same
        pass


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write text to path through a temporary file beside it: a reader never sees it half-written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:  # not the locale's: "µs" under LC_ALL=C
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a results file reads like any other file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def partial_stem(out: str | os.PathLike, study: str) -> str:
    """The name a run stopped part-way gives its files in `out`: `study` (roofline.json, .md, plots), unless a complete
    <study>.json is there already, which part of another run must not replace (it was lost): then `study`.partial."""
    try:
        doc = read_results(Path(out) / f"{study}.json")
    except UserError:  # none there, or not a results file: nothing of worth is replaced
        return study
    params = doc.get("params")
    return study if isinstance(params, dict) and params.get("partial") else f"{study}.partial"


def partial_kept_words(paths: list, stem: str, study: str, plots: str = "plots") -> str:
    """How the one line of a stopped run says where its partial files went (and that a complete one is kept)."""
    words = f"in {paths[0]} (marked partial), its .md and {plots} beside it"
    if stem != study:
        words += f"; the complete {Path(paths[0]).with_name(study + '.json')} is kept"
    return words


def read_results(path: str | os.PathLike) -> dict:
    """Read and validate a results file."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"no results file at {p}")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{p} is not valid JSON: {exc}") from exc
    except UnicodeDecodeError:  # a binary file (a plot, a pickle) named in its place
        raise UserError(f"{p} is not a results file: not UTF-8 text") from None
    except OSError as exc:  # unreadable: permissions, a dangling mount
        raise UserError(f"cannot read {p}: {exc.strerror or exc}") from exc
    validate(doc)
    return doc


def measured_on(doc) -> str | None:
    """The name of the device a results document was measured on (None where it records none)."""
    device = doc.get("device") if isinstance(doc, dict) else None
    name = device.get("name") if isinstance(device, dict) else None
    return name if isinstance(name, str) and name.strip() else None


def replaces_other_device(out, here, stem: str, what: str) -> str | None:
    """A line where `out` holds a <stem>.json measured on another device than `here` (a DeviceInfo) that this run
    will replace (`--out results/nvidia-h200` on the CPU); None where there is none, or it is this device's. `what`
    names the study in the line: "a roofline", "a launch study"."""
    if out is None:
        return None
    path = Path(out) / f"{stem}.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):  # none there, or not a results file: nothing measured to lose
        return None
    theirs = measured_elsewhere(doc, here) if isinstance(doc, dict) and "device" in doc else None
    if theirs is None:
        return None
    return (f"{path} holds {what} measured on {theirs}: this run on {here.name} replaces it (Ctrl-C now keeps it; "
            "--out another folder keeps both)")


def measured_elsewhere(doc, here) -> str | None:
    """None where a results document (or its "device" stamp, {kind, name}) was measured on `here` (a DeviceInfo, or
    anything with its kind and name); else the device it was measured on, in words, for a refusal or a note:
    'NVIDIA H200', 'x86_64 (a CPU)', 'an unrecorded device'. Numbers of another device are not this one's: a speedup
    or a % of roof across two devices is neither."""
    stamp = doc.get("device") if isinstance(doc, dict) and "device" in doc else doc
    name = measured_on({"device": stamp})
    if name is None:
        return "an unrecorded device"
    kind = stamp.get("kind")
    if name != here.name:
        return name
    if kind in (None, here.kind):
        return None
    return f"{name} ({'a GPU' if kind == 'cuda' else 'a CPU'})"  # a CPU named as the GPU is: not this device


def validate(doc: dict) -> None:
    if not isinstance(doc, dict):  # `42`, `null`, a list: `"study" in 42` was a TypeError, in a string a substring test
        kind = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number",
                type(None): "null"}.get(type(doc), type(doc).__name__)
        raise UserError(f"a results document is a JSON object, got {kind}")
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        raise UserError(f"results document lacks {', '.join(missing)}")
    if doc["schema"] != SCHEMA or isinstance(doc["schema"], bool):  # True == 1
        raise UserError(f"results schema {doc['schema']!r} is not {SCHEMA}")
    if not isinstance(doc["summary"], dict) or not isinstance(doc["rows"], list):
        raise UserError("results summary must be a dict and rows a list")
    for key, value in doc["summary"].items():
        if not (value is None or isinstance(value, (int, float, bool, str))):
            raise UserError(f"summary[{key!r}] must be a number, bool or string")
