import sys

from gpuspeed.cli import main

sys.exit(main())
