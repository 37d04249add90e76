"""The `gpuspeed` command line: parse, call the library, print. No logic lives here.

Each study adds its command from `gpuspeed/commands/<name>.py`, which defines `register(app)`.
User mistakes print `gpuspeed: error: <one line>` and exit 2; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import pkgutil
import sys
from pathlib import Path


def _stop_early_if_entry() -> None:
    """The `gpuspeed` console script imports this module first: SIGTERM or Ctrl-C from here on is one line and 143 /
    130 (a notebook importing it keeps its own handlers)."""
    entry = sys.modules.get("__main__")
    if Path(getattr(entry, "__file__", None) or "").name in ("gpuspeed", "gpuspeed.exe", "gpuspeed-script.py"):
        from gpuspeed.results import stop_early

        stop_early()


_stop_early_if_entry()

import typer  # noqa: E402
from rich.table import Table  # noqa: E402

from gpuspeed.commands import make_console  # noqa: E402
from gpuspeed.errors import UserError  # noqa: E402

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Measure, analyze and speed up Python code on NVIDIA GPUs.")
console = make_console()


def _flags_show_no_value() -> None:
    """Help lists a flag (--json, --debug, --help) without a type, since it takes no value.

    Typer's rich help prints `<bool>` beside every flag, as if `--json true` were the way to use it; its
    plain help already leaves the type out for flags, and this makes the rich one do the same.
    """
    option = getattr(getattr(typer, "core", None), "TyperOption", None)
    shown = getattr(option, "display_type_rich", None)
    if shown is None or getattr(shown, "_gpuspeed_flags", False):
        return

    def display_type_rich(self, ctx):
        return None if getattr(self, "is_flag", False) and not getattr(self, "count", False) else shown(self, ctx)

    display_type_rich._gpuspeed_flags = True
    option.display_type_rich = display_type_rich


_flags_show_no_value()


def _print_version(value: bool) -> None:
    if value:
        from gpuspeed import __version__

        print(f"gpuspeed {__version__}")
        raise typer.Exit()


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks instead of one-line errors."),
          version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print gpuspeed's version and exit.")):
    pass


def _fmt_bytes(n) -> str:
    if not n:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """The device, its limits and clocks, library versions, usable backends and datasheet peaks."""
    from gpuspeed.doctor import report

    rep = report()
    if as_json:
        from gpuspeed.results import strict_json  # as every other --json: a NaN clock reading prints as null

        print(strict_json(rep))
        return
    from rich.markup import escape  # reasons quote library errors, whose brackets are not markup

    d = rep["device"]
    console.print(f"[yellow]{escape(rep['headline'])}[/]" if not rep["gpu"] else escape(rep["headline"]))
    if rep["gpu"]:
        t = Table(title="Device", show_header=False)
        clocks = d.get("clocks") or {}
        for key, value in [
            ("name", d["name"]), ("compute capability", d["cc"]), ("SMs", d["sms"]),
            ("memory", _fmt_bytes(d["mem_bytes"])), ("L2", _fmt_bytes(d["l2_bytes"])),
            ("SM clock now / max", f"{clocks.get('sm_mhz', '?')} / {clocks.get('sm_max_mhz', '?')} MHz"
             if clocks else "not read (no NVML)"),
            ("memory clock now / max", f"{clocks.get('mem_mhz', '?')} / {clocks.get('mem_max_mhz', '?')} MHz"
             if clocks else "not read (no NVML)"),
            ("driver", d.get("driver") or "?"), ("CUDA (torch)", d.get("cuda") or "?"),
        ]:
            t.add_row(key, escape(str(value)))
        console.print(t)
    v = Table(title="Versions", show_header=False)
    for k, val in rep["versions"].items():
        v.add_row(k, escape(val) if val else "[dim]not installed[/]")
    console.print(v)
    b = Table(title="Backends")
    b.add_column("backend")
    b.add_column("usable")
    b.add_column("why")
    for row in rep["backends"]:
        b.add_row(escape(row["name"]), "[green]yes[/]" if row["usable"] else "[red]no[/]", escape(row["why"]))
    console.print(b)
    s = Table(title="Datasheet peaks (dense)")
    for col in ("device", "mem GB/s", "FP32", "TF32", "FP16", "BF16", "FP64", "FP8"):
        s.add_column(col, justify="right" if col != "device" else "left")
    mine = (rep["datasheet"] or {}).get("name")
    for sheet in rep["datasheets"]:
        cells = [sheet["name"]] + [("-" if sheet[k] is None else f"{sheet[k]:g}") for k in
                                   ("mem_GBps", "fp32_TFLOPs", "tf32_TFLOPs", "fp16_TFLOPs", "bf16_TFLOPs",
                                    "fp64_TFLOPs", "fp8_TFLOPs")]
        s.add_row(*cells, style="bold green" if sheet["name"] == mine else None)
    console.print(s)
    if rep["datasheet_note"]:
        console.print(f"[yellow]{escape(rep['datasheet_note'])}[/]: '% of datasheet' figures are left out.")
    console.print("TFLOP/s; tensor rates with FP32 accumulate.")


def _register_commands() -> None:
    import gpuspeed.commands as pkg

    for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        try:
            module = importlib.import_module(f"gpuspeed.commands.{mod.name}")
        except Exception as exc:  # one broken command must not take the others down
            print(f"gpuspeed: warning: command {mod.name!r} unavailable: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            continue
        if hasattr(module, "register"):
            module.register(app)
    _summaries_unbroken()


def _summaries_unbroken() -> None:
    """`gpuspeed --help` lists each command with its docstring's first paragraph, where typer's rich mode keeps the
    docstring's own line breaks: a summary broke off mid-line ("checked and timed in" / "its own process")."""
    import inspect

    for info in app.registered_commands:
        text = info.help or inspect.getdoc(info.callback) or ""
        if info.short_help is None and text:
            info.short_help = " ".join(text.split("\n\n")[0].split())


_register_commands()


def _is(exc: BaseException, name: str) -> bool:
    """Match click's exception classes by name: typer vendors click in some versions, not in others."""
    return any(c.__name__ == name for c in type(exc).__mro__)


def main(argv: list[str] | str | None = None) -> int:
    """Entry point: run the app, turning user mistakes into one line and exit code 2; a command that fails leaves
    no empty --out folder behind. From Python, argv is a list (paths and numbers as well as strings) or one string
    split as the shell would: main("doctor --json")."""
    import shlex

    from gpuspeed.results import CREATED, command_line, remove_created, stop_early

    if isinstance(argv, str):  # taken letter by letter it read "No such command 'd'"
        argv = shlex.split(argv)
    CREATED.clear()  # this command's folders only
    rv = None
    try:
        if argv is None:  # the process's command line: SIGTERM before a command's own handler is one line too
            stop_early()
            rv = _main(argv)
        else:  # called from Python: its results files record these arguments, not the host process's argv
            argv = [str(a) for a in argv]
            with command_line(["gpuspeed", *argv]):
                rv = _main(argv)
        return rv
    finally:
        if rv != 0:
            remove_created()


def _exit_status(code) -> int:
    """SystemExit's code as the process would exit with it: None is 0, a message is printed and 1."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


# a write that fails for want of room: stdout into a file on a full disk (`> /dev/full`), a file in --out
_DISK_FULL = tuple(getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EFBIG") if hasattr(errno, name))  # Windows: no EDQUOT


def _flush_stdout() -> None:
    """Write out what stdout still buffers while the command's errors are still said in one line: left to the
    interpreter's exit, a closed pipe or a full disk gave "Exception ignored ... BrokenPipeError" and exit 120."""
    if sys.stdout is not None:
        sys.stdout.flush()


def _drop_stdout_if_it_fails() -> None:
    """Where stdout cannot take what it still buffers (its reader gone, its disk full), point it at /dev/null: the
    interpreter would try it again as it exits ("Exception ignored ..."). A stdout that flushes is left as it is."""
    try:
        _flush_stdout()
        return
    except (OSError, ValueError):  # ValueError: a stdout already closed
        pass
    with contextlib.suppress(OSError, ValueError, AttributeError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)


def _interrupted(args: list[str]) -> None:
    hint = ": the candidates that finished are kept; rerun with --resume to go on" if "optimize" in args else ""
    print(f"gpuspeed: interrupted{hint}", file=sys.stderr, flush=True)


def _stopped(args: list[str]) -> int:
    """The one line and the exit code of a run stopped before a command's own stop_signals(): 143 for a SIGTERM that
    stop_early() turned into an exception (typer took it for Ctrl-C), else 130."""
    import signal

    from gpuspeed.results import EARLY_SIGNALS

    if signal.SIGTERM in EARLY_SIGNALS:
        print("gpuspeed: stopped by SIGTERM", file=sys.stderr, flush=True)
        return 143
    _interrupted(args)
    return 130


def _debug_first(args: list[str]) -> list[str]:
    """`--debug` is gpuspeed's own option: written after the command (`gpuspeed bench ... --debug`) it moves in front
    of it, except where it belongs to the script `gpuspeed profile` runs (after the script's path or `--`)."""
    names = {c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands}
    at = next((i for i, a in enumerate(args) if a in names), None)
    if at is None:
        return args
    tail = args[at + 1:]
    if args[at] == "profile":
        stop = next((i for i, a in enumerate(tail) if a == "--" or a.endswith(".py") and not a.startswith("-")),
                    len(tail))
        own, theirs = tail[:stop], tail[stop:]
    else:
        own, theirs = tail, []
    if "--debug" not in own:
        return args
    return ["--debug"] + args[:at + 1] + [a for a in own if a != "--debug"] + theirs


# the libraries gpuspeed imports whose own import may fail on a broken install (not the user's modules)
_DEPENDENCIES = ("torch", "numpy", "triton", "cupy", "numba", "jax", "transformers", "matplotlib", "rich", "typer")


def _broken_import(exc: BaseException) -> str | None:
    """The dependency whose import raised exc (its module code is on the traceback), or None: torch's loader raises
    OSError for a CUDA library it cannot open and ValueError for a missing pip CUDA library, not ImportError."""
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        name = str(frame.f_globals.get("__name__", ""))
        if frame.f_code.co_name == "<module>" and name.split(".")[0] in _DEPENDENCIES:
            return name.split(".")[0]
        tb = tb.tb_next
    return None


def _first_line(exc: BaseException) -> str:
    """An error's first line, or its type's name where it has no text."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _cannot_import(name: str, exc: BaseException) -> None:
    """A broken install in one line: ImportError, or the OSError / ValueError torch's loader raises for a CUDA library."""
    print(f"gpuspeed: error: cannot import {name}: {_first_line(exc)} (`gpuspeed doctor` shows what is installed; "
          "--debug for the traceback)", file=sys.stderr)


def _main(argv: list[str] | None) -> int:
    args = _debug_first(sys.argv[1:] if argv is None else list(argv))
    head = args[:next((i for i, a in enumerate(args) if not a.startswith("-")), len(args))]
    debug = "--debug" in head  # gpuspeed's own flag, not one in the arguments of a script it runs
    try:
        rv = app(args=args, prog_name="gpuspeed", standalone_mode=False)
        _flush_stdout()
        if rv == 130:  # typer's answer to Ctrl-C (KeyboardInterrupt -> Exit(130), returned without standalone mode)
            return _stopped(args)
        return rv if isinstance(rv, int) else 0
    except KeyboardInterrupt:  # outside typer's own catch (stop_early's handler, SIGTERM as Ctrl-C)
        return _stopped(args)
    except SystemExit as exc:  # stop_signals' 130 with the results kept, typer's 1 for a closed pipe: returned, as
        if exc.code == 143:  # every other end; a SIGTERM ends a Python caller too (a notebook kernel shut down)
            raise
        return _exit_status(exc.code)
    except BrokenPipeError:  # the reader has gone (`gpuspeed --version | head -0`): nothing more to say, as typer
        _drop_stdout_if_it_fails()
        return 1
    except UserError as exc:
        if debug:
            raise
        print(f"gpuspeed: error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return 2
    except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        if debug:
            raise
        print(f"gpuspeed: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:  # a broken install (torch missing a CUDA library): one line, not 30 of traceback
        if debug:
            raise
        _cannot_import(exc.name or "a module gpuspeed needs", exc)
        return 2
    except Exception as exc:
        if _is(exc, "NoArgsIsHelpError"):  # typer has printed the help already
            return 0
        if _is(exc, "UsageError") or _is(exc, "ClickException"):
            if debug:
                raise
            print(f"gpuspeed: error: {exc.format_message().splitlines()[0]}", file=sys.stderr)
            return 2
        if _is(exc, "Exit"):
            return exc.exit_code
        if _is(exc, "Abort"):  # Ctrl-C at a prompt; typer makes an EOFError (a truncated pickle) an Abort too
            if isinstance(exc.__cause__, EOFError):
                raise exc.__cause__ from None  # an error that is not ours, with its traceback: not "interrupted"
            _interrupted(args)
            return 130
        if isinstance(exc, OSError) and exc.errno in _DISK_FULL and not debug:
            _drop_stdout_if_it_fails()
            where = f" {exc.filename}" if exc.filename else " the output"
            print(f"gpuspeed: error: cannot write{where}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        if (isinstance(exc, MemoryError) or _is(exc, "OutOfMemoryError")) and not debug:  # torch's, CuPy's: GPU
            print(f"gpuspeed: error: out of memory: {_first_line(exc)} (smaller inputs fit; --debug for the traceback)",
                  file=sys.stderr)
            return 2
        broken = _broken_import(exc)
        if broken is not None and not debug:  # torch's loader raises OSError / ValueError for a CUDA library
            _cannot_import(broken, exc)
            return 2
        raise


if __name__ == "__main__":  # `python -m gpuspeed.cli ...` printed nothing and exited 0: the same as `python -m gpuspeed`
    sys.exit(main())
