"""`python -m gpuspeed`: the same command line as `gpuspeed`."""

import os
import sys

# `-m` puts the current folder first on sys.path, where a user's profile.py or inspect.py would shadow the
# standard library for gpuspeed itself; the `gpuspeed` entry point has no such entry. Keep the folder, last.
if sys.path and sys.path[0] in ("", os.getcwd()):
    sys.path.append(sys.path.pop(0))

from gpuspeed.results import stop_early  # noqa: E402

stop_early()  # SIGTERM or Ctrl-C while the CLI and torch load: one line and 143 / 130, not a silent -15

from gpuspeed.cli import main  # noqa: E402

sys.exit(main())
