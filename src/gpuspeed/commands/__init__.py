"""CLI commands, one module each; every module defines `register(app)` and holds no logic."""

import os

LOG_WIDTH = 160  # columns of a table written to a log or a pipe, which has no width of its own


def make_console(stderr: bool = False):
    """The commands' rich console. On a terminal it takes the terminal's width; in a log or a pipe (`| tee log`)
    rich would assume 80 columns and cut a wide table's cells to "1.…", so it takes LOG_WIDTH unless COLUMNS is set."""
    from rich.console import Console

    c = Console(stderr=stderr)
    if not c.is_terminal and not os.environ.get("COLUMNS"):
        c = Console(stderr=stderr, width=LOG_WIDTH)
    return c


def esc(text) -> str:
    """Dynamic text (a path, a name, a note, an error message) for a rich markup string or a table cell: its brackets
    print as they are. Unescaped, "[enforce fail at alloc_cpu.cpp:…]" (torch's CPU out-of-memory error) or "f[x]"
    vanished without a word and a "[/x]" stopped the command with a MarkupError after its run; the commands' own tags
    around it ([red], [dim]) stay markup."""
    from rich.markup import escape

    return escape(str(text))


def progress_bar(width: int = 0, *, console=None, transient: bool = True):
    """The commands' progress bar, on stderr unless `console` is given. A transient bar shows only on a terminal:
    in a log or a pipe rich leaves a blank line where it stood, before a one-line error too. A step's description is
    plain text, not markup: it names the user's candidates and files."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or make_console(stderr=True)
    return Progress(TextColumn(f"{{task.description:<{width}}}" if width else "{task.description}", markup=False),
                    BarColumn(),
                    TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=console,
                    transient=transient, disable=transient and not console.is_terminal)
