"""`python -m harness.migrate`."""

import sys

from harness.migrate.cli import main

sys.exit(main())
