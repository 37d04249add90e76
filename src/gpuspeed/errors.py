"""The one exception type for user mistakes.

Anything raised as `UserError` is the user's to fix (a bad spec, a missing file, a budget that cannot
be parsed). The CLI turns it into `gpuspeed: error: <one line>` and exit code 2; everything else is a
bug and keeps its traceback under `--debug`.
"""


class UserError(ValueError):
    """A mistake in what the user asked for, reported in one line."""
