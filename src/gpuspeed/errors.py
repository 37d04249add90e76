"""The one exception type for user mistakes.

Anything raised as `UserError` is the user's to fix (a bad spec, a missing file, a budget that cannot
be parsed). The CLI turns it into `gpuspeed: error: <one line>` and exit code 2; everything else is a
bug and keeps its traceback under `--debug`.
"""


class UserError(ValueError):
    """A mistake in what the user asked for, reported in one line."""


def require_flag(label: str, value) -> None:
    """A one-line UserError unless value is True or False (a NumPy bool too): an option given "no" or "False" is a
    truthy string, which acted as True."""
    numpy_bool = type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")  # NumPy 2, 1
    if not (isinstance(value, bool) or numpy_bool):
        raise UserError(f"{label} takes True or False, got {value!r}")


def one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception as one line for a note or a row: its type and the first `limit` characters of its first line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:limit]}" if text else type(exc).__name__  # no 'MemoryError:'
