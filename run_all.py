"""Run every suite in test_cases/ (or the modules named) with progress, a summary and JUnit XML.

    python run_all.py [MODULES] [-k PATTERN] [--list] [--save-xml DIR] [--shard I N]
                      [--world-size N] [--device cpu|cuda] [--timeout S] [--repeat N] [-x] [-v|-q]

Exit code: 0 when nothing failed, 1 when a test failed, 2 on bad input. Under
`torchrun --nproc-per-node N run_all.py ...` each process is one rank and rank 0 reports.
It is `python -m harness` (the installed `torch-dist-harness`) over test_cases/; the command
line lives in harness/runner/cli.py, the engine in harness/runner/engine.py.
"""

import sys

from harness.runner.cli import run_all_main

if __name__ == "__main__":
    sys.exit(run_all_main())
