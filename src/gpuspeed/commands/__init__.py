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


def cpu_line() -> str:
    """Why the command runs on the CPU, as a line opens: "No CUDA device", or "--device cpu" on a machine with one."""
    from gpuspeed.device import why_cpu

    why = why_cpu()
    return why[:1].upper() + why[1:]


def esc(text) -> str:
    """Dynamic text (a path, a name, a note, an error message) for a rich markup string or a table cell: its brackets
    print as they are. Unescaped, "[enforce fail at alloc_cpu.cpp:…]" (torch's CPU out-of-memory error) or "f[x]"
    vanished without a word and a "[/x]" stopped the command with a MarkupError after its run; the commands' own tags
    around it ([red], [dim]) stay markup."""
    from rich.markup import escape

    return escape(str(text))


def progress_bar(width: int = 0, *, console=None, transient: bool = True, name: str = "gpuspeed"):
    """The commands' progress bar, on stderr unless `console` is given. The bar shows only on a terminal: in a log,
    a pipe or CI rich leaves a blank line where it stood (before a one-line error too), so there each step is said in
    a plain line on stderr instead (StepLines, `name` leading: a run of minutes printed nothing until its end). A
    step's description is plain text, not markup: it names the user's candidates and files."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    class StepProgress(Progress):
        """rich's Progress whose description changes also go to `lines` (off a terminal)."""

        def __init__(self, *columns, lines=None, **kw):
            super().__init__(*columns, **kw)
            self.lines = lines

        def add_task(self, description, *args, total=100.0, **kw):
            if self.lines is not None and total is not None:
                self.lines.set_total(int(total))
            return super().add_task(description, *args, total=total, **kw)

        def update(self, task_id, *, total=None, completed=None, advance=None, description=None, **kw):
            if self.lines is not None:
                if total is not None:
                    self.lines.set_total(int(total))
                if description is not None and description != "done":
                    self.lines(description)
            super().update(task_id, total=total, completed=completed, advance=advance, description=description, **kw)

        def __exit__(self, exc_type, exc, tb):
            if self.lines is not None and exc_type is None:  # a step that stops the run: its error is the one line
                self.lines.close()
            return super().__exit__(exc_type, exc, tb)

    console = console or make_console(stderr=True)
    # rich draws no bar on a terminal that is not interactive (TERM=dumb: Emacs' shell, a CI pty; TTY_INTERACTIVE=0)
    off_terminal = not console.is_terminal or not console.is_interactive
    return StepProgress(TextColumn(f"{{task.description:<{width}}}" if width else "{task.description}", markup=False),
                        BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=console,
                        transient=transient, disable=off_terminal, lines=StepLines(name=name) if off_terminal else None)


class StepLines:
    """A command's progress as plain lines, for a log, a pipe or CI, where the bar is hidden. One line on stderr as
    each step ends: the command, the run's time so far, the step's number, name and seconds, and what runs now;
    close() ends the last. A step said again (the same description) is one step."""

    def __init__(self, stream=None, total: int = 0, name: str = "gpuspeed"):
        import time

        self.stream, self.total, self.name = stream, total, name
        self.done = 0
        self.current: str | None = None
        self.t0 = self.t_step = time.perf_counter()

    def set_total(self, n: int) -> None:
        self.total = n

    def __call__(self, what: str) -> None:
        import time

        if what == self.current:
            return
        now = time.perf_counter()
        if self.current is not None:
            self._line(now, what)
        self.current, self.t_step = what, now

    def close(self) -> None:
        import time

        if self.current is not None:
            self._line(time.perf_counter(), None)
            self.current = None

    def _line(self, now: float, next_step: str | None) -> None:
        import sys

        self.done += 1
        text = (f"{self.name} [{now - self.t0:5.0f} s] {self.done}/{max(self.total, self.done)} {self.current}: "
                f"{now - self.t_step:.1f} s" + (f"; now {next_step}" if next_step else ""))
        print(text, file=self.stream or sys.stderr, flush=True)
