"""CLI commands, one module each; every module defines `register(app)` and holds no logic."""


def progress_bar(width: int = 0, *, console=None, transient: bool = True):
    """The commands' progress bar, on stderr unless `console` is given. A transient bar shows only on a terminal:
    in a log or a pipe rich leaves a blank line where it stood, before a one-line error too."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or Console(stderr=True)
    return Progress(TextColumn(f"{{task.description:<{width}}}" if width else "{task.description}"), BarColumn(),
                    TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=console,
                    transient=transient, disable=transient and not console.is_terminal)
