"""The command line of `python -m harness` (the `torch-dist-harness` script) and run_all.py:
parsing, env knobs, the plan, and the exit code. run_all.py is the same command over the
suites in test_cases/; `python -m harness` runs the test files under the paths given (the
current folder by default).

Also the parser of the harness's own flags that `run_tests()` takes before unittest's.
Bad input is a `UsageError`: one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, Optional, Sequence, TextIO

from harness import settings
from harness.compat import cpu_defaults as compat_cpu_defaults
from harness.process import torchrun
from harness.runner import lifecycle
from harness.runner.engine import Engine, Options, closing_line
from harness.runner.loader import (
    Plan,
    UsageError,
    load_module,
    repeat,
    resolve_modules,
    select,
    shard,
)
from harness.runner.order import ORDERS, OrderError, chosen_order, reorder
from harness.runner.order import describe as describe_order
from harness.runner.parallel import parse_jobs
from harness.runner.progress import progress_interval
from harness.single_process.testcase import SEED_ENV, current_seed

DEFAULT_XML_DIR = "test-reports"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise UsageError(message)


def _positive(kind: type, what: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            noun = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be positive")
        return value

    parse.__name__ = what
    return parse


def _integer(what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None

    parse.__name__ = what
    return parse


def _rank(text: str) -> int:
    """--debug-rank: a rank number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: ranks are numbered from 0")
    return value


_rank.__name__ = "--debug-rank"
DEBUG_RANK_HELP = (
    "give rank N of each multi-rank test the terminal, for breakpoint()/pdb; the other ranks "
    "and the timeout wait for it (sets HARNESS_DEBUG_RANK)"
)
def _jobs(text: str) -> int:
    try:
        return parse_jobs(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


HARNESS_PROG = "python -m harness"
RUN_ALL_PROG = "run_all.py"


def run_all_parser(prog: str = RUN_ALL_PROG) -> argparse.ArgumentParser:
    if prog == RUN_ALL_PROG:
        description = "Run the suites in test_cases/ (or the modules named) and summarise."
    else:
        description = "Run the tests under the paths given (default: this folder) and summarise."
    parser = _Parser(prog=prog, description=description)
    parser.add_argument(
        "modules", nargs="*", metavar="PATH",
        help="a folder (its test_*.py files, recursively), a .py file, a dotted module, or a"
        " suite of test_cases/ by its short name (test_misc)",
    )
    parser.add_argument(
        "-k", dest="patterns", action="append", default=[], metavar="PATTERN",
        help="only tests whose id matches (unittest -k rules); repeatable",
    )
    parser.add_argument("--list", action="store_true", help="print the selected test ids")
    parser.add_argument("--save-xml", metavar="DIR", help="write JUnit XML reports into DIR")
    parser.add_argument(
        "--shard", nargs=2, metavar=("I", "N"), type=_positive(int, "--shard"),
        help="run only shard I of N (1-based)",
    )
    parser.add_argument(
        "--world-size", type=_positive(int, "--world-size"), help="sets HARNESS_WORLD_SIZE"
    )
    parser.add_argument(
        "--device", choices=settings.DEVICE_CHOICES, help="sets HARNESS_DEVICE"
    )
    parser.add_argument(
        "--allow-cpu", action="store_true",
        help="run accelerator-written tests on CPU where none exists; sets HARNESS_ALLOW_CPU=1",
    )
    parser.add_argument(
        "--timeout", type=_positive(float, "--timeout"), metavar="S",
        help="per-test timeout in seconds; sets HARNESS_TIMEOUT",
    )
    parser.add_argument(
        "--repeat", type=_positive(int, "--repeat"), default=1, metavar="N",
        help="run every selected test N times",
    )
    parser.add_argument(
        "--order", choices=ORDERS,
        help="run each class's tests and each file's classes in this order (HARNESS_ORDER)",
    )
    parser.add_argument(
        "--seed", type=_integer("--seed"), metavar="N",
        help="every test starts from seed N (sets HARNESS_SEED); also seeds --order shuffle",
    )
    parser.add_argument(
        "-j", "--jobs", type=_jobs, default=1, metavar="N|auto",
        help="run tests side by side within N cores (auto: the machine's)",
    )
    parser.add_argument("--debug-rank", type=_rank, metavar="N", help=DEBUG_RANK_HELP)
    parser.add_argument("-x", "--failfast", action="store_true", help="stop at the first failure")
    loud = parser.add_mutually_exclusive_group()
    loud.add_argument("-v", "--verbose", action="store_true", help="one line per test")
    loud.add_argument("-q", "--quiet", action="store_true", help="only failures and the last line")
    return parser


def _apply_env(args: argparse.Namespace) -> None:
    """Export --world-size/--device/--timeout/--allow-cpu as env knobs (before any suite is
    imported) and check every knob now, so a bad one is a usage error rather than 40 failing
    tests."""
    if args.world_size is not None:
        os.environ[settings.WORLD_SIZE_ENV] = str(args.world_size)
    if args.device is not None:
        os.environ[settings.DEVICE_ENV] = args.device
    if args.timeout is not None:
        os.environ[settings.TIMEOUT_ENV] = repr(args.timeout)
    if args.allow_cpu:
        os.environ[settings.ALLOW_CPU_ENV] = "1"
    if args.seed is not None:
        os.environ[SEED_ENV] = str(args.seed)
    try:
        args.order = chosen_order(args.order)
    except OrderError as error:
        raise UsageError(str(error)) from None
    if args.debug_rank is not None:
        os.environ[settings.DEBUG_RANK_ENV] = str(args.debug_rank)
    try:
        settings.accelerator_count()
        settings.allow_cpu()
        settings.default_world_size()
        settings.default_timeout()
        settings.debug_rank()
        settings.start_method()
        settings.torchrun_env()
        progress_interval()
        current_seed()
    except (settings.HarnessConfigError, ValueError) as error:
        raise UsageError(str(error)) from None


def plan_from_args(args: argparse.Namespace) -> Plan:
    """The modules named (or all suites), their tests matching -k, then the shard asked for."""
    if args.shard is not None and args.shard[0] > args.shard[1]:
        index, count = args.shard
        raise UsageError(f"--shard {index} {count}: the shard index must be between 1 and {count}")
    modules = resolve_modules(args.modules)
    plan = select([(module, load_module(module)) for module in modules], args.patterns)
    if args.shard is not None:
        plan = shard(plan, *args.shard)
    return plan


def print_list(plan: Plan, out: TextIO) -> None:
    """--list: the plan's test ids, one a line (under torchrun, rank 0 alone prints them), as
    the commands take them back: `-k ID`; for a script, `python test_x.py ID` (so without
    `__main__.`); pytest's `test_x.py::Class::method` is the same id with `::`."""
    run = torchrun.this_run()
    if run is not None and not run.reports_here:
        return
    for _, tests in plan:
        for test in tests:
            test_id = test.id()
            print(test_id[len("__main__."):] if test_id.startswith("__main__.") else test_id,
                  file=out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m harness [PATHS] [flags]`, the `torch-dist-harness` script: run_all.py's
    flags and exit codes, over the test files under PATHS (the current folder by default)."""
    return _main(argv, HARNESS_PROG)


def run_all_main(argv: Optional[Sequence[str]] = None) -> int:
    """run_all.py: exit 0 when nothing failed, 1 when something failed, 2 on bad input,
    130/143/129 when stopped by Ctrl-C/SIGTERM/SIGHUP. Nothing it started outlives it."""
    return _main(argv, RUN_ALL_PROG)


def _main(argv: Optional[Sequence[str]], prog: str) -> int:
    with lifecycle.run_scope():
        try:
            return _run_all(argv, prog)
        except KeyboardInterrupt as stop:  # before any test ran (while importing the suites)
            signum = lifecycle.signal_of(stop)
            print(f"run stopped: interrupted by {lifecycle.describe(signum)}", file=sys.stdout)
            print(closing_line(0, 0, 0, interrupted=True), file=sys.stdout, flush=True)
            return lifecycle.exit_code(signum)


def _run_all(argv: Optional[Sequence[str]], prog: str) -> int:
    try:
        args = run_all_parser(prog).parse_args(argv)
        if not args.modules and prog == HARNESS_PROG:
            args.modules = ["."]
        _apply_env(args)
        plan = plan_from_args(args)
    except UsageError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    if args.list:
        print_list(plan, sys.stdout)
        return 0
    verbosity = 0 if args.quiet else 2 if args.verbose else 1
    seed = current_seed()
    options = Options(xml_dir=args.save_xml, failfast=args.failfast, verbosity=verbosity,
                      order_note=describe_order(args.order, seed), jobs=args.jobs)
    plan = [(module, reorder(tests, args.order, seed)) for module, tests in plan]
    with compat_cpu_defaults.adaptation_log():
        return Engine(repeat(plan, args.repeat), options).run()


def run_tests_parser() -> argparse.ArgumentParser:
    """The harness's flags of `run_tests()`; what it does not know is left to unittest."""
    parser = _Parser(add_help=False)
    parser.add_argument("--save-xml", nargs="?", const=DEFAULT_XML_DIR, metavar="DIR")
    parser.add_argument("--seed", type=_integer("--seed"))
    parser.add_argument("--repeat", type=_positive(int, "--repeat"), default=1)
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--allow-cpu", action="store_true")
    parser.add_argument("--order")  # checked by order.chosen_order, which reads HARNESS_ORDER too
    parser.add_argument("-j", "--jobs", type=_jobs, default=1)
    parser.add_argument("--debug-rank", type=_rank)
    return parser
