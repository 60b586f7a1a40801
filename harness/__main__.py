"""`python -m harness [PATHS] [run_all.py's flags]`: run the test files under PATHS (the current
folder by default) with progress, a summary and JUnit XML; see harness/runner/cli.py."""

import sys

from harness.runner.cli import main

if __name__ == "__main__":
    sys.exit(main())
