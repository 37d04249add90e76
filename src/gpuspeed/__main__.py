"""`python -m gpuspeed`: the same command line as `gpuspeed`."""

import sys

from gpuspeed.cli import main

sys.exit(main())
