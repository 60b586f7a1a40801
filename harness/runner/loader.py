"""Choosing the tests: which suite modules, which of their tests (-k), which shard, how often.

The result is a `Plan`: (module, its tests in run order) pairs. A module is loaded by
`SuiteLoader` (a unittest.TestLoader) and never silently dropped: one that skips itself at
import (`raise unittest.SkipTest(...)`, or upstream's `print(reason); sys.exit(0)` when, say,
distributed is not available) becomes one skipped test carrying the reason; one that raises
anything else or exits with another code becomes one test in error.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib
import importlib.util
import io
import sys
import traceback
import unittest
from pathlib import Path
from typing import Any, Callable, Iterator, List, Sequence, TextIO, Tuple

from harness.compat import unittest_internals
from harness.outcome.fold import hand_report, last_line
from harness.outcome.replay import replaying
from harness.outcome.report import ERROR, Outcome, TestReport
from harness.single_process.pytest_marks import honour_pytest_marks

SUITES_PACKAGE = "test_cases"

Plan = List[Tuple[str, List[unittest.TestCase]]]  # (module, its tests in run order)


class UsageError(Exception):
    """Bad command-line input (an unknown module, a bad pattern or shard): reported as one
    line, exit code 2."""


def suite_modules() -> List[str]:
    """Every suite in test_cases/, as dotted module names (only a checkout has them)."""
    if not _module_exists(SUITES_PACKAGE):
        raise UsageError(
            f"no {SUITES_PACKAGE}/ package here to run: name the test files or folders"
            " (python -m harness PATHS)"
        )
    package = importlib.import_module(SUITES_PACKAGE)
    folder = Path(package.__path__[0])
    return [f"{SUITES_PACKAGE}.{path.stem}" for path in sorted(folder.glob("test_*.py"))]


def _module_of_path(path: Path) -> str:
    """Dotted name of a .py file, putting the folder above its package on sys.path."""
    path = path.resolve()
    parts = [path.stem]
    folder = path.parent
    while (folder / "__init__.py").exists():
        parts.insert(0, folder.name)
        folder = folder.parent
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return ".".join(parts)


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _test_files(folder: Path) -> List[Path]:
    """The test_*.py files in `folder` and its subfolders, but not in hidden, build or
    environment folders (pytest's norecursedirs)."""
    skipped = {"__pycache__", "build", "dist", "node_modules", "site-packages", "venv"}
    return [
        path for path in sorted(folder.rglob("test_*.py"))
        if not any(part.startswith(".") or part in skipped or part.endswith(".egg")
                   for part in path.relative_to(folder).parts[:-1])
    ]


def _suites_note() -> str:
    """The suites a short name can mean, for an error message (none outside the checkout)."""
    if not _module_exists(SUITES_PACKAGE):
        return ""
    known = ", ".join(m.rpartition(".")[2] for m in suite_modules())
    return f" (suites in {SUITES_PACKAGE}/: {known})"


def resolve_modules(names: Sequence[str]) -> List[str]:
    """Dotted module names for `names` (`test_misc`, `test_cases.test_misc`, a .py path or a
    folder, searched recursively); all suites in test_cases/ when empty. UsageError for
    anything unknown."""
    if not names:
        return suite_modules()
    resolved: List[str] = []
    for name in names:
        path = Path(name)
        if name.endswith(".py") and path.is_file():
            found = [_module_of_path(path)]
        elif path.is_dir():
            found = [_module_of_path(p) for p in _test_files(path)]
            if not found:
                raise UsageError(f"folder {name!r} has no test_*.py modules")
        elif "." in name and not name.endswith(".py") and _module_exists(name):
            found = [name]
        elif name.isidentifier() and _module_exists(f"{SUITES_PACKAGE}.{name}"):
            found = [f"{SUITES_PACKAGE}.{name}"]
        else:
            raise UsageError(f"unknown test module {name!r}{_suites_note()}")
        resolved += [module for module in found if module not in resolved]
    return resolved


class SuiteImportError(Exception):
    """A suite could not be imported (plain runners' view; the harness's results take the
    report with the import's own exception type)."""


def _import_failure(module: str, text: str, kind: str) -> unittest.TestCase:
    """A test standing for a module that failed to import; running it reports the error
    (as an error of type `kind`, the exception the import raised)."""
    summary = last_line(text)
    message = f"cannot import {module}: {summary}"
    outcome = Outcome(ERROR, message, text, kind)

    class ImportFailure(unittest.TestCase):
        import_note = f"error at import: {summary}"  # kept by -k: a broken suite must not vanish

        def run(self, result: Any = None) -> Any:
            self.result = result  # the result the report is handed to (test_import)
            return super().run(result)

        def test_import(self) -> None:
            report = TestReport(self.id(), module, ERROR, message, text, kind, own=outcome)
            hand_report(self.result, self, report)
            raise replaying(SuiteImportError(f"{message}\n{text}"), report)

    ImportFailure.__module__ = module
    ImportFailure.__qualname__ = "ImportFailure"
    return ImportFailure("test_import")


def _import_skip(module: str, reason: str) -> unittest.TestCase:
    """A test standing for a module that skipped itself at import; running it skips."""

    class ImportSkipped(unittest.TestCase):
        import_note = f"skipped at import: {reason}"  # kept by -k, shown in the summary

        def test_import(self) -> None:
            raise unittest.SkipTest(reason)

    ImportSkipped.__module__ = module
    ImportSkipped.__qualname__ = "ImportSkipped"
    return ImportSkipped("test_import")


def flatten(suite: Any) -> List[unittest.TestCase]:
    if isinstance(suite, unittest.TestSuite):
        return [test for item in suite for test in flatten(item)]
    return [suite]


class _Tee(io.TextIOBase):
    """A stream that writes through to another one and, while `keep` is set, keeps a copy."""

    def __init__(self, stream: TextIO, copy: io.StringIO) -> None:
        self.stream, self.copy, self.keep = stream, copy, True

    def write(self, text: str) -> int:
        if self.keep:
            self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()


@contextlib.contextmanager
def _teed_output() -> Iterator[io.StringIO]:
    """What the block prints (still shown), so that a suite's skip message can be its reason."""
    seen = io.StringIO()
    tees = [_Tee(sys.stdout, seen), _Tee(sys.stderr, seen)]
    try:
        with contextlib.redirect_stdout(tees[0]), contextlib.redirect_stderr(tees[1]):
            yield seen
    finally:
        for tee in tees:  # a module may keep sys.stderr (a logging handler): stop copying
            tee.keep = False


def _traceback_text(error: BaseException) -> str:
    """The import's traceback without importlib's frames."""
    frames = [
        frame for frame in traceback.extract_tb(error.__traceback__)
        if not frame.filename.startswith("<frozen")
        and frame.filename not in (__file__, importlib.__file__, contextlib.__file__)
    ]
    return "Traceback (most recent call last):\n" + "".join(
        traceback.format_list(frames) + traceback.format_exception_only(type(error), error)
    )


class SuiteLoader(unittest.TestLoader):
    """unittest's loader, importing a suite module by the documented rules first.

    A module that skips itself at import (SkipTest, or sys.exit(0)/sys.exit() after printing
    why) loads as one skipped test with that reason; any other exception or exit code at
    import loads as one test in error with the import's traceback. A suite is never dropped.
    """

    def loadTestsFromModuleName(self, name: str) -> unittest.TestSuite:  # noqa: N802
        """The tests of module `name` (unittest's order and load_tests protocol), or the one
        stand-in test for a module that skipped itself or failed at import."""
        try:
            with _teed_output() as printed:
                module = importlib.import_module(name)
        except KeyboardInterrupt:
            raise
        except unittest.SkipTest as skip:
            stand_in = _import_skip(name, str(skip) or "unittest.SkipTest raised at import")
        except SystemExit as stop:
            if stop.code is None or stop.code == 0:
                said = last_line(printed.getvalue())
                stand_in = _import_skip(name, said or f"sys.exit({stop.code}) at import")
            else:
                stand_in = _import_failure(name, _traceback_text(stop), "SystemExit")
        except BaseException as error:  # noqa: BLE001 - whatever it is, the suite is in error
            stand_in = _import_failure(name, _traceback_text(error), type(error).__name__)
        else:
            return self.loadTestsFromModule(module)
        return self.suiteClass([stand_in])


def load_module(module: str) -> List[unittest.TestCase]:
    """The module's tests in run order, by SuiteLoader's import rules, with their pytest marks
    honoured (harness/single_process/pytest_marks.py)."""
    return honour_pytest_marks(flatten(SuiteLoader().loadTestsFromModuleName(module)))


def name_matcher(pattern: str) -> Callable[[str], bool]:
    """unittest's -k rule: fnmatch on the full test id; a pattern without `*` matches substrings."""
    if not pattern:
        raise UsageError("-k: empty pattern")
    glob = pattern if "*" in pattern else f"*{pattern}*"
    return lambda test_id: fnmatch.fnmatchcase(test_id, glob)


def select(plan: Plan, patterns: Sequence[str]) -> Plan:
    """Keep tests matching any pattern (stand-ins for suites that skipped or failed at import
    always stay). UsageError for a pattern that matches no test (a typo must not turn into a
    green run of nothing), unless a suite skipped or failed at import (its tests are unknown;
    the run reports that suite)."""
    if not patterns:
        return plan
    matchers = [(pattern, name_matcher(pattern)) for pattern in patterns]
    used = set()
    selected: Plan = []
    for module, tests in plan:
        kept = []
        for test in tests:
            hits = [pattern for pattern, match in matchers if match(test.id())]
            used.update(hits)
            if hits or getattr(test, "import_note", ""):
                kept.append(test)
        selected.append((module, kept))
    unused = [pattern for pattern in patterns if pattern not in used]
    unknown = any(getattr(test, "import_note", "") for _, tests in plan for test in tests)
    if unused and not unknown:  # with a suite not loaded, that is the news
        raise UsageError(f"-k {unused[0]!r} matches no test in the selected modules")
    return [(module, tests) for module, tests in selected if tests]


def shard(plan: Plan, index: int, count: int) -> Plan:
    """Shard `index` of `count` (1-based): the i-th test id in sorted order goes to shard
    i % count + 1, so shards are disjoint, cover the run and do not depend on load order."""
    ids = sorted({test.id() for _, tests in plan for test in tests})
    position = {test_id: i for i, test_id in enumerate(ids)}
    kept = [
        (module, [t for t in tests if position[t.id()] % count == index - 1])
        for module, tests in plan
    ]
    return [(module, tests) for module, tests in kept if tests]


def repeat(plan: Plan, times: int) -> Plan:
    """Each module's tests `times` times over, as fresh TestCase instances."""
    if times == 1:
        return plan
    return [
        (module, tests + [type(t)(unittest_internals.method_name(t))
                          for _ in range(times - 1) for t in tests])
        for module, tests in plan
    ]
