"""`run_tests()`: the entry point of one test file (`if __name__ == "__main__": run_tests()`).

unittest's own command line, plus the harness's flags (--save-xml, --seed, --repeat, --list).
The pieces it shares with run_all.py live in their own modules: records.py (one record per
test), junit.py (XML), progress.py, loader.py (choosing tests), engine.py (running a plan
under torchrun) and cli.py (run_all.py's command line).
"""

from __future__ import annotations

import argparse
import os
import sys
import unittest
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from harness import devices
from harness.cli import print_list, run_tests_parser
from harness.engine import Engine, Options
from harness.junit import xml_runner
from harness.loader import UsageError, flatten, repeat

HARNESS_FLAGS_HELP = """
Harness options (besides unittest's):
  --save-xml [DIR]  write JUnit XML reports into DIR (default: test-reports)
  --seed N          seed torch, random and numpy with N before every test
  --repeat N        run every selected test N times
  --list            print the selected test ids and exit
"""


class _Program(unittest.TestProgram):
    """unittest.main plus the harness's flags, which `run_tests` has already taken out."""

    def __init__(self, harness_args: argparse.Namespace, **kwargs: Any) -> None:
        self.harness_args = harness_args
        super().__init__(**kwargs)

    def _print_help(self, *args: Any, **kwargs: Any) -> None:
        super()._print_help(*args, **kwargs)
        print(HARNESS_FLAGS_HELP)

    def runTests(self) -> None:  # noqa: N802 - unittest's naming
        opts = self.harness_args
        tests = flatten(self.test)
        if opts.list:
            print_list([("", tests)], sys.stdout)
            sys.exit(0)
        if opts.repeat > 1:
            self.test = unittest.TestSuite(repeat([("", tests)], opts.repeat)[0][1])
        if devices.torchrun_env() is not None:
            options = Options(xml_dir=opts.save_xml, failfast=bool(self.failfast),
                              verbosity=self.verbosity)
            modules: Dict[str, List[unittest.TestCase]] = {}
            for test in flatten(self.test):
                modules.setdefault(type(test).__module__, []).append(test)
            sys.exit(Engine(list(modules.items()), options).run())
        if opts.save_xml is not None:
            self.testRunner = xml_runner(
                opts.save_xml, verbosity=self.verbosity, failfast=self.failfast,
                buffer=self.buffer, warnings=self.warnings, tb_locals=self.tb_locals,
            )
        super().runTests()


def run_tests(argv: Optional[Sequence[str]] = None) -> None:
    """`if __name__ == "__main__": run_tests()`: unittest's command line (-v, -k, test names,
    -f, ...) plus --save-xml [DIR], --seed N, --repeat N and --list. Exits with unittest's code."""
    argv = list(sys.argv if argv is None else argv)
    try:
        harness_args, rest = run_tests_parser().parse_known_args(argv[1:])
    except UsageError as error:
        print(f"{Path(argv[0]).name}: error: {error}", file=sys.stderr)
        sys.exit(2)
    if harness_args.seed is not None:
        from harness.testcase import SEED_ENV

        os.environ[SEED_ENV] = str(harness_args.seed)
    _Program(harness_args, module="__main__", argv=[argv[0], *rest])
