"""The flags upstream's `run_tests()` takes, which CI scripts pass to every test file.

`run_tests()` accepts all of them, so that a moved-over file keeps its command line: those that
mean something here act (`--accept`, `--showlocals`, `--discover-tests`, `--log-suffix`,
`--pytest-single-test`; `--save-xml`, `--repeat` and `--seed` are the harness's own flags),
the others are ignored with a one-line note saying why.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import List, Sequence, Tuple

# flag -> why it means nothing here (the note printed when it is given)
IGNORED = {
    "subprocess": "every multi-rank test already starts fresh rank processes",
    "use_pytest": "the file runs under unittest; run `python -m pytest FILE` for pytest",
    "import_slow_tests": "PyTorch CI's slow-test list does not apply here",
    "import_disabled_tests": "PyTorch CI's disabled-test list does not apply here",
    "rerun_disabled_tests": "PyTorch CI's disabled-test list does not apply here",
    "jit_executor": "TorchScript's graph executor is not chosen by the harness",
    "test_bailouts": "TorchScript's bailouts are not tested by the harness",
    "run_parallel": "use `python -m harness FILE -j N` to run tests side by side",
}


@dataclass
class UpstreamFlags:
    """What the upstream flags given ask of this run."""

    accept: bool = False  # record expected output (expecttest, assertExpected)
    show_locals: bool = False  # tracebacks with local variables (unittest's --locals)
    discover: bool = False  # print the test ids and exit (as --list)
    log_suffix: str = ""  # appended to the XML folder's name, as upstream
    tests: List[str] = field(default_factory=list)  # from --pytest-single-test
    notes: List[str] = field(default_factory=list)  # one line per ignored flag


def parser() -> argparse.ArgumentParser:
    """Upstream's flags, with upstream's spellings and arities."""
    flags = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    flags.add_argument("--subprocess", action="store_true")
    flags.add_argument("--accept", action="store_true")
    flags.add_argument("--jit-executor", "--jit_executor", type=str)
    flags.add_argument("--test-bailouts", "--test_bailouts", action="store_true")
    flags.add_argument("--use-pytest", action="store_true")
    flags.add_argument("--discover-tests", action="store_true")
    flags.add_argument("--log-suffix", type=str)
    flags.add_argument("--run-parallel", type=int)
    flags.add_argument("--import-slow-tests", type=str, nargs="?", const="")
    flags.add_argument("--import-disabled-tests", type=str, nargs="?", const="")
    flags.add_argument("--rerun-disabled-tests", action="store_true")
    flags.add_argument("--pytest-single-test", type=str, nargs=1)
    flags.add_argument("--showlocals", action=argparse.BooleanOptionalAction, default=False)
    return flags


def _unittest_name(node_id: str) -> str:
    """A pytest node id (`file.py::Class::test`) as unittest names the test (`Class.test`)."""
    parts = node_id.split("::")
    return ".".join(parts[1:]) if len(parts) > 1 else node_id


def take(argv: Sequence[str]) -> Tuple[UpstreamFlags, List[str]]:
    """Upstream's flags out of `argv`: (what they ask, the arguments left for unittest)."""
    given, rest = parser().parse_known_args(list(argv))
    flags = UpstreamFlags(
        accept=given.accept, show_locals=given.showlocals, discover=given.discover_tests,
        log_suffix=given.log_suffix or "",
        tests=[_unittest_name(node) for node in given.pytest_single_test or []],
    )
    for name, why in IGNORED.items():
        value = getattr(given, name)
        if value not in (None, False):
            flags.notes.append(f"--{name.replace('_', '-')} ignored: {why}")
    return flags, rest
