"""Running suites: `run_tests()` for one test file, and the engine behind run_all.py.

unittest reports many events per test (a failing grid point is one `addSubTest` each). The
engine folds them into one `RunRecord` per test, because everything downstream wants one
answer per test: the progress line, the per-suite table, the closing
`N passed, N failed, N skipped` line, one JUnit testcase per test (failing grid points listed
in it with their parameters), and, under torchrun, the one message a rank sends rank 0.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import importlib.util
import json
import os
import sys
import threading
import time
import traceback
import unittest
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, TextIO, Tuple

from harness import devices

SUITES_PACKAGE = "test_cases"
PROGRESS_INTERVAL_ENV = "HARNESS_PROGRESS_INTERVAL"
DEFAULT_PROGRESS_INTERVAL_S = 30.0
DEFAULT_XML_DIR = "test-reports"
FAILED = ("failed", "error")
SEPARATOR = "=" * 70

Plan = List[Tuple[str, List[unittest.TestCase]]]  # (module, its tests in run order)


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit code 2."""


# --- one record per test ---


@dataclass
class RunRecord:
    """Everything reported about one test (or one class/module fixture, or a failed import)."""

    test_id: str
    suite: str
    status: str = "passed"  # passed | failed | error | skipped
    message: str = ""  # one line: why it failed, or the skip reason
    detail: str = ""  # tracebacks, failing grid points with their parameters
    exc_type: str = ""
    grid_points: int = 0
    duration: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        return cls(**json.loads(text))


def merge_ranks(records: Sequence[RunRecord]) -> RunRecord:
    """One record from every rank's record of the same test: any failing rank fails it."""
    first = records[0]
    failing = [(rank, rec) for rank, rec in enumerate(records) if rec.status in FAILED]
    merged = RunRecord(
        test_id=first.test_id,
        suite=first.suite,
        grid_points=max(rec.grid_points for rec in records),
        duration=max(rec.duration for rec in records),
    )
    if failing:
        merged.status = "failed" if any(r.status == "failed" for _, r in failing) else "error"
        merged.message = "; ".join(f"rank {rank}: {rec.message}" for rank, rec in failing)
        merged.detail = "\n".join(f"--- rank {rank} ---\n{rec.detail}" for rank, rec in failing)
        merged.exc_type = failing[0][1].exc_type
    else:
        skipped = [rec for rec in records if rec.status == "skipped"]
        if skipped:
            merged.status, merged.message = "skipped", skipped[0].message
    return merged


def _params_text(subtest: Any) -> str:
    params = getattr(subtest, "params", None) or {}
    return ", ".join(f"{name}={value!r}" for name, value in params.items())


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else ""


def fold_grid_points(points: Sequence[Tuple[str, str]], main: str = "") -> Tuple[str, str]:
    """(message, detail) for a test whose grid points `(params, traceback)` failed."""
    shown = "; ".join(f"({params})" for params, _ in points)
    message = f"{len(points)} grid point(s) failed: {shown}"
    parts = [f"grid point ({params}) failed:\n{text}" for params, text in points]
    if main:
        parts.append(main)
        message = f"{message}; then: {_last_line(main)}"
    return message, "\n".join(parts)


class Reported(AssertionError):
    """An outcome that was already formatted (by a rank, or folded from grid points)."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


def reported_exc_info(record: RunRecord) -> Tuple[type, BaseException, None]:
    """An exc_info triple for `record`, for result classes that want one (JUnit XML)."""
    name = record.exc_type or "AssertionError"
    kind = type(name, (Reported,), {})
    return kind, kind(record.message, record.detail), None


class Collector(unittest.TestResult):
    """A unittest result that turns each test's events into one RunRecord."""

    def __init__(
        self,
        on_start: Callable[[unittest.TestCase], None],
        on_record: Callable[[Any, RunRecord], None],
    ) -> None:
        super().__init__()
        self.suite = ""
        self._on_start = on_start
        self._on_record = on_record
        self._test: Any = None
        self._started = 0.0
        self._main: Optional[Tuple[str, str, str]] = None  # status, exc_type, traceback
        self._skip: Optional[str] = None
        self._points: List[Tuple[str, str, str]] = []
        self._point_count = 0

    def startTest(self, test: unittest.TestCase) -> None:  # noqa: N802 - unittest's naming
        super().startTest(test)
        self._test, self._started = test, time.monotonic()
        self._main, self._skip, self._points, self._point_count = None, None, [], 0
        self._on_start(test)

    def _exc_info_to_string(self, err: Any, test: Any) -> str:
        if isinstance(err[1], Reported):
            return err[1].detail
        return super()._exc_info_to_string(err, test)

    def _outside(self, test: Any, status: str, message: str, detail: str, exc: str) -> None:
        """A class/module fixture error or skip: reported as a record of its own, with an id
        like a test's (`setUpClass (mod.Class)` becomes `mod.Class.setUpClass`)."""
        hook, _, owner = str(test).partition(" (")
        test_id = f"{owner.rstrip(')')}.{hook}" if owner else str(test)
        self._on_record(test, RunRecord(test_id, self.suite, status, message, detail, exc))

    def _error(self, test: Any, status: str, err: Any) -> None:
        text = self._exc_info_to_string(err, test)
        if self._test is None:
            self._outside(test, status, _last_line(text), text, err[0].__name__)
        else:
            self._main = (status, err[0].__name__, text)

    def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        self._error(test, "failed", err)

    def addError(self, test: Any, err: Any) -> None:  # noqa: N802
        self._error(test, "error", err)

    def addSkip(self, test: Any, reason: str) -> None:  # noqa: N802
        if self._test is None:
            self._outside(test, "skipped", reason, "", "")
        elif test is self._test:
            self._skip = reason
        else:  # a grid point skipped itself
            self._point_count += 1

    def addExpectedFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        """Counts as passed: the test failed as it declared it would."""

    def addUnexpectedSuccess(self, test: Any) -> None:  # noqa: N802
        text = "unexpected success: the test is marked expectedFailure but passed"
        self._main = ("failed", "UnexpectedSuccess", text)

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802
        self._point_count += 1
        if err is not None:
            text = self._exc_info_to_string(err, test)
            self._points.append((_params_text(subtest), text, err[0].__name__))

    def stopTest(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().stopTest(test)
        record = RunRecord(test.id(), self.suite, duration=time.monotonic() - self._started)
        record.grid_points = max(getattr(test, "_grid_points_run", 0) or 0, self._point_count)
        main_text = self._main[2] if self._main else ""
        if self._points:
            record.status = "failed"
            points = [(params, text) for params, text, _ in self._points]
            record.message, record.detail = fold_grid_points(points, main_text)
            record.exc_type = self._points[0][2]
        elif self._main:
            record.status, record.exc_type, record.detail = self._main
            record.message = _last_line(main_text)
        elif self._skip is not None:
            record.status, record.message = "skipped", self._skip
        self._test = None
        self._on_record(test, record)


# --- JUnit XML (unittest-xml-reporting) ---


def junit_result_class() -> type:
    """xmlrunner's result, with one testcase per test: failing grid points are folded into it."""
    from xmlrunner.result import _XMLTestResult

    class JUnitResult(_XMLTestResult):
        def startTest(self, test: Any) -> None:  # noqa: N802
            self._points: List[Tuple[str, str]] = []
            super().startTest(test)

        def _exc_info_to_string(self, err: Any, test: Any) -> str:
            if isinstance(err[1], Reported):
                return err[1].detail
            return super()._exc_info_to_string(err, test)

        def _fold(self, test: Any, err: Any = None) -> Any:
            main = self._exc_info_to_string(err, test) if err is not None else ""
            points, self._points = self._points, []
            message, detail = fold_grid_points(points, main)
            record = RunRecord(test.id(), "", "failed", message, detail, "AssertionError")
            return reported_exc_info(record)

        def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802
            if err is not None:
                self._points.append((_params_text(subtest), self._exc_info_to_string(err, test)))
                if self.failfast:
                    self.stop()

        def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802
            super().addFailure(test, self._fold(test, err) if self._points else err)

        def addError(self, test: Any, err: Any) -> None:  # noqa: N802
            if getattr(self, "_points", None):
                return super().addFailure(test, self._fold(test, err))
            super().addError(test, err)

        def stopTest(self, test: Any) -> None:  # noqa: N802
            if getattr(self, "_points", None):
                super().addFailure(test, self._fold(test))
            super().stopTest(test)

        def add_record(self, test: Any, record: RunRecord) -> None:
            """Report a record built elsewhere (by the engine, or merged from ranks)."""
            self.startTest(test)
            if getattr(test, "stand_in", False):  # no source line of its own
                self.lineno = self.doc = None
            self.start_time = time.time() - record.duration
            if record.status == "passed":
                self.addSuccess(test)
            elif record.status == "skipped":
                self.addSkip(test, record.message)
            elif record.status == "error":
                super().addError(test, reported_exc_info(record))
            else:
                super().addFailure(test, reported_exc_info(record))
            self.stopTest(test)

    return JUnitResult


def xml_runner(output: str, **kwargs: Any) -> Any:
    """An XMLTestRunner writing TEST-<module>.<Class>.xml files into `output`."""
    import xmlrunner

    return xmlrunner.XMLTestRunner(
        output=output, outsuffix="", resultclass=junit_result_class(), **kwargs
    )


def _stand_in(record: RunRecord) -> unittest.TestCase:
    """A TestCase carrying only an id, for results that belong to no test method (class and
    module fixtures); named after the class it stands for, so the XML groups it there."""

    class Fixture(unittest.TestCase):
        stand_in = True

        def runTest(self) -> None:  # noqa: N802
            """Never run: the instance only names a fixture result in the XML report."""

        def id(self) -> str:
            return record.test_id

        def __str__(self) -> str:
            return record.test_id

    owner = record.test_id.rpartition(".")[0]
    module, _, name = owner.rpartition(".")
    Fixture.__module__ = module or record.suite
    Fixture.__name__ = Fixture.__qualname__ = name or "Fixture"
    return Fixture()


# --- progress while it runs ---


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


class Progress:
    """How far the run is: a live line on a terminal, plain periodic lines otherwise.

    -q shows nothing; -v adds one line per finished test.
    """

    def __init__(self, total: int, stream: TextIO, verbosity: int, interval: float) -> None:
        self.total, self.stream, self.verbosity, self.interval = total, stream, verbosity, interval
        self.live = verbosity > 0 and stream.isatty()
        self.done = 0
        self.current = ""
        self._begun = self._current_since = self._last_line = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def begin(self, suites: int) -> None:
        if self.verbosity == 0:
            return
        self._print(f"running {self.total} test(s) from {suites} suite(s)")
        self._thread = threading.Thread(target=self._tick, name="harness-progress", daemon=True)
        self._thread.start()

    def _status(self) -> str:
        now = time.monotonic()
        width = len(str(self.total))
        line = f"[{self.done:>{width}}/{self.total}] {_clock(now - self._begun)}"
        if self.current:
            line += f" running {self.current} ({_clock(now - self._current_since)})"
        return line

    def _live_status(self) -> str:
        """The status cut to the terminal's width, so that \r can redraw it in place."""
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError):
            columns = 0
        return self._status()[: columns - 1 if columns > 20 else 200]

    def _print(self, line: str) -> None:
        with self._lock:
            if self.live:
                self.stream.write("\r\x1b[K")
            self.stream.write(line + "\n")
            if self.live:
                self.stream.write(self._live_status())
            self.stream.flush()
            self._last_line = time.monotonic()

    def _tick(self) -> None:
        while not self._stop.wait(0.5 if self.live else min(self.interval, 1.0) or 0.05):
            if self.live:
                with self._lock:
                    self.stream.write("\r\x1b[K" + self._live_status())
                    self.stream.flush()
            elif time.monotonic() - self._last_line >= self.interval:
                self._print(self._status())

    def start(self, test_id: str) -> None:
        self.current, self._current_since = test_id, time.monotonic()

    def finish(self, record: RunRecord) -> None:
        self.done += 1
        self.current = ""
        if self.verbosity == 0:
            return
        label = {"passed": "ok", "skipped": "skip", "failed": "FAIL", "error": "ERROR"}
        if self.verbosity > 1 or record.status in FAILED:
            width = len(str(self.total))
            self._print(
                f"[{self.done:>{width}}/{self.total}] {label[record.status]:<5} "
                f"{record.test_id} ({record.duration:.2f}s)"
            )

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.live:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


# --- choosing the tests ---


def suite_modules() -> List[str]:
    """Every suite in test_cases/, as dotted module names."""
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


def resolve_modules(names: Sequence[str]) -> List[str]:
    """Dotted module names for `names` (`test_misc`, `test_cases.test_misc`, a .py path or a
    folder); all suites in test_cases/ when empty. UsageError for anything unknown."""
    if not names:
        return suite_modules()
    resolved: List[str] = []
    for name in names:
        path = Path(name)
        if name.endswith(".py") and path.is_file():
            found = [_module_of_path(path)]
        elif path.is_dir():
            found = [_module_of_path(p) for p in sorted(path.glob("test_*.py"))]
            if not found:
                raise UsageError(f"folder {name!r} has no test_*.py modules")
        elif "." in name and not name.endswith(".py") and _module_exists(name):
            found = [name]
        elif name.isidentifier() and _module_exists(f"{SUITES_PACKAGE}.{name}"):
            found = [f"{SUITES_PACKAGE}.{name}"]
        else:
            known = ", ".join(m.rpartition(".")[2] for m in suite_modules())
            raise UsageError(f"unknown test module {name!r} (suites in test_cases/: {known})")
        resolved += [module for module in found if module not in resolved]
    return resolved


def _import_failure(module: str, text: str) -> unittest.TestCase:
    """A test standing for a module that failed to import; running it reports the error."""

    class ImportFailure(unittest.TestCase):
        import_failure = True  # kept by -k: a suite that cannot load must not vanish

        def test_import(self) -> None:
            raise Reported(f"cannot import {module}: {_last_line(text)}", text)

    ImportFailure.__module__ = module
    ImportFailure.__qualname__ = "ImportFailure"
    return ImportFailure("test_import")


def _flatten(suite: Any) -> List[unittest.TestCase]:
    if isinstance(suite, unittest.TestSuite):
        return [test for item in suite for test in _flatten(item)]
    return [suite]


def load_module(module: str) -> List[unittest.TestCase]:
    """The module's tests in unittest's order; a failed import becomes one failing test."""
    try:
        loaded = importlib.import_module(module)
    except Exception as error:
        frames = [
            frame for frame in traceback.extract_tb(error.__traceback__)
            if not frame.filename.startswith("<frozen")
            and frame.filename not in (__file__, importlib.__file__)
        ]
        text = "Traceback (most recent call last):\n" + "".join(
            traceback.format_list(frames) + traceback.format_exception_only(type(error), error)
        )
        return [_import_failure(module, text)]
    return _flatten(unittest.defaultTestLoader.loadTestsFromModule(loaded))


def name_matcher(pattern: str) -> Callable[[str], bool]:
    """unittest's -k rule: fnmatch on the full test id; a pattern without `*` matches substrings."""
    if not pattern:
        raise UsageError("-k: empty pattern")
    glob = pattern if "*" in pattern else f"*{pattern}*"
    return lambda test_id: fnmatch.fnmatchcase(test_id, glob)


def select(plan: Plan, patterns: Sequence[str]) -> Plan:
    """Keep tests matching any pattern (import failures always stay). UsageError for a pattern
    that matches no test (a typo must not turn into a green run of nothing), unless a module
    failed to import (its tests are unknown; the import failure fails the run anyway)."""
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
            if hits or getattr(test, "import_failure", False):
                kept.append(test)
        selected.append((module, kept))
    unused = [pattern for pattern in patterns if pattern not in used]
    broken = any(getattr(test, "import_failure", False) for _, tests in plan for test in tests)
    if unused and not broken:  # with a broken module, the import error is the news
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
        (module, tests + [type(t)(t._testMethodName) for _ in range(times - 1) for t in tests])
        for module, tests in plan
    ]


# --- running and reporting ---


@dataclass
class SuiteStats:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    grid_points: int = 0
    seconds: float = 0.0


@dataclass
class Options:
    """What run_all.py (or run_tests under torchrun) asked for, besides the test selection."""

    xml_dir: Optional[str] = None
    failfast: bool = False
    verbosity: int = 1
    stream: TextIO = field(default_factory=lambda: sys.stdout)
    progress_stream: TextIO = field(default_factory=lambda: sys.stderr)


def progress_interval() -> float:
    """Seconds between plain progress lines: HARNESS_PROGRESS_INTERVAL, else 30."""
    value = os.environ.get(PROGRESS_INTERVAL_ENV, "")
    try:
        interval = float(value) if value else DEFAULT_PROGRESS_INTERVAL_S
    except ValueError:
        interval = -1.0
    if interval < 0:
        raise devices.HarnessConfigError(
            f"{PROGRESS_INTERVAL_ENV}={value!r} is not a number of seconds >= 0"
        )
    return interval


def _test_timeout(test: Any) -> float:
    timeout = getattr(test, "timeout", None)
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0:
        return float(timeout)
    return devices.default_timeout()


class Engine:
    """Runs a plan, reports progress, and returns the exit code (0 nothing failed, 1 failed).

    Launched by torchrun, every rank runs the same plan and exchanges each test's record
    with the others (harness/torchrun.py); only rank 0 reports.
    """

    def __init__(self, plan: Plan, options: Options) -> None:
        self.plan, self.options = plan, options
        self.stats: Dict[str, SuiteStats] = {module: SuiteStats() for module, _ in plan}
        self.failures: List[RunRecord] = []
        self.aborted = ""
        self.exchange: Any = None
        if devices.torchrun_env() is not None:
            from harness.torchrun import RankExchange

            self.exchange = RankExchange()
        self.reporting = self.exchange is None or self.exchange.rank == 0
        total = sum(len(tests) for _, tests in plan)
        verbosity = options.verbosity if self.reporting else 0
        self.progress = Progress(total, options.progress_stream, verbosity, progress_interval())
        self.collector = Collector(self._started, self._recorded)
        self.junit: Any = None
        if options.xml_dir is not None and self.reporting:
            self.junit = junit_result_class()(open(os.devnull, "w"), verbosity=0)

    def _started(self, test: unittest.TestCase) -> None:
        self.progress.start(test.id())

    def _recorded(self, test: Any, record: RunRecord) -> None:
        if self.exchange is not None and not self.aborted:
            from harness.torchrun import RanksOutOfStep

            try:
                texts = self.exchange.exchange(record.to_json(), _test_timeout(test))
                record = merge_ranks([RunRecord.from_json(text) for text in texts])
            except RanksOutOfStep as error:
                self.aborted = str(error)
                record.status, record.message = "failed", str(error)
                record.detail = f"{error}\n{record.detail}".rstrip()
                self.collector.stop()
        stats = self.stats[record.suite]
        stats.grid_points += record.grid_points
        if record.status in FAILED:
            stats.failed += 1
            self.failures.append(record)
            if self.options.failfast:
                self.collector.stop()
        elif record.status == "skipped":
            stats.skipped += 1
        else:
            stats.passed += 1
        self.progress.finish(record)
        if self.junit is not None:
            stand_in = test if isinstance(test, unittest.TestCase) else _stand_in(record)
            self.junit.add_record(stand_in, record)

    def run(self) -> int:
        self.progress.begin(len(self.plan))
        try:
            for module, tests in self.plan:
                if self.collector.shouldStop:
                    break
                self.collector.suite = module
                began = time.monotonic()
                unittest.TestSuite(tests).run(self.collector)
                self.stats[module].seconds += time.monotonic() - began
        finally:
            self.progress.close()
        if self.exchange is not None and not self.aborted:
            self.exchange.finish(devices.default_timeout())
        if self.reporting:
            self.report()
        if self.aborted:
            return 1
        if not self.reporting:
            # Rank 0 owns the verdict: a non-zero exit here would make torchrun terminate
            # rank 0 before its report is written.
            return 0
        return 1 if self.failures else 0

    def report(self) -> None:
        out = self.options.stream
        for record in self.failures:
            label = "ERROR" if record.status == "error" else "FAIL"
            print(f"{SEPARATOR}\n{label}: {record.test_id}\n{'-' * 70}", file=out)
            print(record.detail.rstrip() or record.message, file=out)
        if self.options.verbosity > 0:
            print(summary_table(self.stats), file=out)
        if self.junit is not None:
            os.makedirs(self.options.xml_dir, exist_ok=True)
            self.junit.generate_reports(xml_runner(self.options.xml_dir))
            print(f"JUnit XML written to {self.options.xml_dir}/", file=out)
        total = SuiteStats()
        for stats in self.stats.values():
            total.passed += stats.passed
            total.failed += stats.failed
            total.skipped += stats.skipped
        print(f"{total.passed} passed, {total.failed} failed, {total.skipped} skipped", file=out)
        out.flush()


def summary_table(stats: Dict[str, SuiteStats]) -> str:
    """Per suite: passed, failed, skipped, grid points run, time; then the totals."""
    header = ("suite", "passed", "failed", "skipped", "grid points", "time")
    rows = [
        (name, s.passed, s.failed, s.skipped, s.grid_points, f"{s.seconds:.1f}s")
        for name, s in stats.items()
    ]
    rows.append((
        "total",
        sum(s.passed for s in stats.values()),
        sum(s.failed for s in stats.values()),
        sum(s.skipped for s in stats.values()),
        sum(s.grid_points for s in stats.values()),
        f"{sum(s.seconds for s in stats.values()):.1f}s",
    ))
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(
            f"{value:<{widths[0]}}" if i == 0 else f"{value:>{widths[i]}}"
            for i, value in enumerate(row)
        )
        for row in [header, *rows]
    ]
    lines.insert(len(lines) - 1, "-" * len(lines[0]))
    return "\n".join(lines)


# --- run_all.py ---


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


def run_all_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="run_all.py",
        description="Run the suites in test_cases/ (or the modules named) and summarise.",
    )
    parser.add_argument(
        "modules", nargs="*", metavar="MODULE",
        help="test_misc, test_cases.test_misc, a dotted module, a .py file or a folder",
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
        "--device", choices=devices.DEVICE_CHOICES, help="sets HARNESS_DEVICE"
    )
    parser.add_argument(
        "--timeout", type=_positive(float, "--timeout"), metavar="S",
        help="per-test timeout in seconds; sets HARNESS_TIMEOUT",
    )
    parser.add_argument(
        "--repeat", type=_positive(int, "--repeat"), default=1, metavar="N",
        help="run every selected test N times",
    )
    parser.add_argument("-x", "--failfast", action="store_true", help="stop at the first failure")
    loud = parser.add_mutually_exclusive_group()
    loud.add_argument("-v", "--verbose", action="store_true", help="one line per test")
    loud.add_argument("-q", "--quiet", action="store_true", help="only failures and the last line")
    return parser


def _apply_env(args: argparse.Namespace) -> None:
    """Export --world-size/--device/--timeout as env knobs (before any suite is imported)
    and check every knob now, so a bad one is a usage error rather than 40 failing tests."""
    if args.world_size is not None:
        os.environ[devices.WORLD_SIZE_ENV] = str(args.world_size)
    if args.device is not None:
        os.environ[devices.DEVICE_ENV] = args.device
    if args.timeout is not None:
        os.environ[devices.TIMEOUT_ENV] = repr(args.timeout)
    try:
        devices.accelerator_count()
        devices.default_world_size()
        devices.default_timeout()
        devices.start_method()
        devices.torchrun_env()
        progress_interval()
    except devices.HarnessConfigError as error:
        raise UsageError(str(error)) from None


def plan_from_args(args: argparse.Namespace) -> Plan:
    if args.shard is not None and args.shard[0] > args.shard[1]:
        index, count = args.shard
        raise UsageError(f"--shard {index} {count}: the shard index must be between 1 and {count}")
    modules = resolve_modules(args.modules)
    plan = select([(module, load_module(module)) for module in modules], args.patterns)
    if args.shard is not None:
        plan = shard(plan, *args.shard)
    return plan


def _print_list(plan: Plan, out: TextIO) -> None:
    launched = devices.torchrun_env()
    if launched is not None and launched[0] != 0:
        return
    for _, tests in plan:
        for test in tests:
            print(test.id(), file=out)


def run_all_main(argv: Optional[Sequence[str]] = None) -> int:
    """run_all.py: exit 0 when nothing failed, 1 when something failed, 2 on bad input."""
    try:
        args = run_all_parser().parse_args(argv)
        _apply_env(args)
        plan = plan_from_args(args)
    except UsageError as error:
        print(f"run_all.py: error: {error}", file=sys.stderr)
        return 2
    if args.list:
        _print_list(plan, sys.stdout)
        return 0
    verbosity = 0 if args.quiet else 2 if args.verbose else 1
    options = Options(xml_dir=args.save_xml, failfast=args.failfast, verbosity=verbosity)
    try:
        return Engine(repeat(plan, args.repeat), options).run()
    except KeyboardInterrupt:
        print("run_all.py: interrupted", file=sys.stderr)
        return 130


# --- run_tests() for `python test_cases/test_x.py` ---


def run_tests_parser() -> argparse.ArgumentParser:
    parser = _Parser(add_help=False)
    parser.add_argument("--save-xml", nargs="?", const=DEFAULT_XML_DIR, metavar="DIR")
    parser.add_argument("--seed", type=_integer("--seed"))
    parser.add_argument("--repeat", type=_positive(int, "--repeat"), default=1)
    parser.add_argument("--list", action="store_true")
    return parser


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
        tests = _flatten(self.test)
        if opts.list:
            _print_list([("", tests)], sys.stdout)
            sys.exit(0)
        if opts.repeat > 1:
            self.test = unittest.TestSuite(repeat([("", tests)], opts.repeat)[0][1])
        if devices.torchrun_env() is not None:
            options = Options(xml_dir=opts.save_xml, failfast=bool(self.failfast),
                              verbosity=self.verbosity)
            modules: Dict[str, List[unittest.TestCase]] = {}
            for test in _flatten(self.test):
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
