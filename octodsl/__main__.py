"""`python -m octodsl ...`: the `octodsl` command itself (same parser, messages and exit codes)."""

import sys

from .cli import main

sys.exit(main())
