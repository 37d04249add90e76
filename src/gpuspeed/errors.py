"""The one exception type for user mistakes.

Anything raised as `UserError` is the user's to fix (a bad spec, a missing file, a budget that cannot
be parsed). The CLI turns it into `gpuspeed: error: <one line>` and exit code 2; everything else is a
bug and keeps its traceback under `--debug`.
"""


class UserError(ValueError):
    """A mistake in what the user asked for, reported in one line."""


def one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception as one line for a note or a row: its type and the first `limit` characters of its first line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:limit]}" if text else type(exc).__name__  # no 'MemoryError:'
