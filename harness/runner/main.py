"""`run_tests()`: the entry point of one test file (`if __name__ == "__main__": run_tests()`).

unittest's own command line, plus the harness's flags (--save-xml, --seed, --repeat, --list,
--allow-cpu, --order, -j).
The pieces it shares with run_all.py live in their own modules: results.py (unittest results
reading one TestReport per test), junit.py (XML), progress.py, loader.py (choosing tests),
engine.py (running a plan under torchrun, where rank 0 alone reports) and cli.py (run_all.py's
command line).
"""

from __future__ import annotations

import argparse
import os
import sys
import unittest
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import expecttest

from harness import settings
from harness.compat import cpu_defaults as compat_cpu_defaults
from harness.process import forkserver
from harness.runner import lifecycle, upstream_flags
from harness.runner.cli import print_list, run_tests_parser
from harness.runner.engine import Engine, Options, closing_line
from harness.runner.junit import junit_result_class, xml_runner
from harness.runner.loader import UsageError, flatten, repeat
from harness.runner.order import OrderError, chosen_order, reorder
from harness.runner.order import describe as describe_order
from harness.runner.results import Tally
from harness.single_process.pytest_marks import honour_pytest_marks
from harness.single_process.testcase import SEED_ENV, current_seed

HARNESS_FLAGS_HELP = """
Harness options (besides unittest's):
  --save-xml [DIR]  write JUnit XML reports into DIR (default: test-reports)
  --seed N          seed torch, random and numpy with N before every test
  --repeat N        run every selected test N times
  --list            print the selected test ids and exit
  --allow-cpu       run tests written for accelerators on CPU where none exists
                    (sets HARNESS_ALLOW_CPU=1)
  --order ORDER     forward, reverse or shuffle (seeded by --seed): each class's tests and
                    the classes of the file in that order (HARNESS_ORDER)
  -j N|auto         run tests side by side within N cores (auto: the machine's), with
                    run_all.py's summary
  --debug-rank N    give rank N the terminal, for breakpoint()/pdb; the other ranks and
                    the timeout wait for it (sets HARNESS_DEBUG_RANK)
Upstream's run_tests flags are accepted: --accept, --showlocals, --discover-tests and
--log-suffix act, --pytest-single-test selects the test, the others are ignored with a note.
"""


class _UntilInterrupted:
    """The selected tests, run so that an interruption (Ctrl-C, SIGTERM, SIGHUP) ends the run
    instead of unwinding through unittest's runner: the runner then still prints the failures
    and the summary of what ran, and writes the XML of the tests that finished."""

    def __init__(self, test: Any) -> None:
        self.test = test
        self.signum: Optional[int] = None

    def __call__(self, result: unittest.TestResult) -> unittest.TestResult:
        try:
            self.test(result)
        except KeyboardInterrupt as stop:
            self.signum = lifecycle.signal_of(stop)
            if getattr(result, "showAll", False):  # close the test's "... " line
                result.stream.writeln("interrupted")  # type: ignore[attr-defined]
        return result


class _Program(unittest.TestProgram):
    """unittest.main plus the harness's flags, which `run_tests` has already taken out."""

    def __init__(self, harness_args: argparse.Namespace, **kwargs: Any) -> None:
        self.harness_args = harness_args
        self.code = 0  # the exit code, set once the tests ran
        super().__init__(exit=False, **kwargs)

    def _print_help(self, *args: Any, **kwargs: Any) -> None:
        super()._print_help(*args, **kwargs)
        print(HARNESS_FLAGS_HELP)

    def runTests(self) -> None:  # noqa: N802 - unittest's naming
        opts = self.harness_args
        seed = current_seed()
        tests = reorder(honour_pytest_marks(flatten(self.test)), opts.order, seed)
        self.test = unittest.TestSuite(tests)
        if opts.list:
            print_list([("", tests)], sys.stdout)
            sys.exit(0)
        if opts.repeat > 1:
            self.test = unittest.TestSuite(repeat([("", tests)], opts.repeat)[0][1])
        if settings.torchrun_env() is not None or opts.jobs > 1:
            # torchrun: the ranks run the plan in step; -j: side by side (with run_all.py's
            # summary); both through the engine
            options = Options(xml_dir=opts.save_xml, failfast=bool(self.failfast),
                              verbosity=self.verbosity,
                              order_note=describe_order(opts.order, seed), jobs=opts.jobs)
            modules: Dict[str, List[unittest.TestCase]] = {}
            for test in flatten(self.test):
                modules.setdefault(type(test).__module__, []).append(test)
            self.code = Engine(list(modules.items()), options).run()
            return
        runner_args = dict(verbosity=self.verbosity, failfast=self.failfast, buffer=self.buffer,
                           warnings=self.warnings, tb_locals=self.tb_locals)
        if opts.save_xml is not None:
            self.testRunner = xml_runner(
                opts.save_xml, resultclass=_tallied(junit_result_class()), **runner_args
            )
        else:
            self.testRunner = unittest.TextTestRunner(
                resultclass=_tallied(unittest.TextTestResult), **runner_args  # type: ignore[arg-type]
            )
        forkserver.start_as_fork({type(test).__module__ for test in tests})
        tests = _UntilInterrupted(self.test)
        self.test = tests
        super().runTests()
        for note in (compat_cpu_defaults.summary_line(), describe_order(opts.order, seed)):
            if note is not None:
                self.testRunner.stream.writeln(note)
        self.code = int(not self.result.wasSuccessful())
        if tests.signum is not None:
            self.code = lifecycle.exit_code(tests.signum)
            result, stream = self.result, self.testRunner.stream
            stream.writeln(f"run stopped: interrupted by {lifecycle.describe(tests.signum)}")
            stream.writeln(closing_line(**result.tally, interrupted=True))
            stream.flush()


def _tallied(result_class: type) -> type:
    """`result_class` counting one verdict per finished test (results.Tally)."""
    return type(result_class.__name__, (Tally, result_class), {})


def _restart_with_switch() -> None:
    """Run this command again with HARNESS_ALLOW_CPU=1 set: the test file was imported before
    run_tests saw --allow-cpu, and device-type classes are made at import."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def _apply_upstream_flags(
    flags: upstream_flags.UpstreamFlags, harness_args: argparse.Namespace, rest: List[str]
) -> List[str]:
    """Act on upstream's flags (harness/runner/upstream_flags.py); the unittest arguments."""
    for note in flags.notes:
        print(f"run_tests: {note}", file=sys.stderr)
    if flags.accept:
        expecttest.ACCEPT = True
        os.environ["EXPECTTEST_ACCEPT"] = "1"  # rank processes record too
    harness_args.list = harness_args.list or flags.discover
    if harness_args.save_xml is not None:
        harness_args.save_xml += flags.log_suffix
    return [*(["--locals"] if flags.show_locals else []), *rest, *flags.tests]


def run_tests(argv: Optional[Sequence[str]] = None) -> None:
    """`if __name__ == "__main__": run_tests()`: unittest's command line (-v, -k, test names,
    -f, ...) plus --save-xml [DIR], --seed N, --repeat N, --list and --allow-cpu (sets
    HARNESS_ALLOW_CPU=1; from the command line the file is run again with it, so that its
    device-type classes are made with it), and upstream's flags (upstream_flags.py). Exits
    with unittest's code, or 130/143/129 when stopped by Ctrl-C/SIGTERM/SIGHUP (after
    reporting what finished).
    Nothing it started outlives it; the signal handlers it replaced are restored."""
    forkserver.check_not_bootstrapping()  # called by a script that lacks its main guard
    argv_given, argv = argv, list(sys.argv if argv is None else argv)
    try:
        harness_args, rest = run_tests_parser().parse_known_args(argv[1:])
        upstream, rest = upstream_flags.take(rest)
    except UsageError as error:
        print(f"{Path(argv[0]).name}: error: {error}", file=sys.stderr)
        sys.exit(2)
    rest = _apply_upstream_flags(upstream, harness_args, rest)
    if harness_args.seed is not None:
        os.environ[SEED_ENV] = str(harness_args.seed)
    try:
        harness_args.order = chosen_order(harness_args.order)
    except OrderError as error:
        print(f"{Path(argv[0]).name}: error: {error}", file=sys.stderr)
        sys.exit(2)
    if harness_args.debug_rank is not None:
        os.environ[settings.DEBUG_RANK_ENV] = str(harness_args.debug_rank)
    if harness_args.allow_cpu and settings.env_text(settings.ALLOW_CPU_ENV) != "1":
        os.environ[settings.ALLOW_CPU_ENV] = "1"
        if argv_given is None:
            _restart_with_switch()
    with lifecycle.run_scope(), compat_cpu_defaults.adaptation_log():
        try:
            code = _Program(harness_args, module="__main__", argv=[argv[0], *rest]).code
        except KeyboardInterrupt as stop:  # before the first test started
            signum = lifecycle.signal_of(stop)
            print(f"run stopped: interrupted by {lifecycle.describe(signum)}", file=sys.stderr)
            print(closing_line(0, 0, 0, interrupted=True), file=sys.stderr, flush=True)
            code = lifecycle.exit_code(signum)
    sys.exit(code)
