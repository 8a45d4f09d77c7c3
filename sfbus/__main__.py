"""``python -m sfbus``: the command line."""

import sys

from sfbus.cli import main

sys.exit(main())
