"""One record per test: what the runner knows about a test once it has finished.

unittest reports many events per test (a grid point is one `addSubTest` each). `GridFold`
folds one test's events into one `RunRecord`, because everything downstream wants one answer
per test: the progress line, the per-suite table, the closing `N passed, N failed, N skipped`
line, and one JUnit testcase per test (failing grid points listed in it with their
parameters). The `Collector` (run_all.py's result) and the JUnit result both fold through it.
Ranks are merged before this, in the supervising case (harness/outcome/merge.py).
"""

from __future__ import annotations

import sys
import time
import unittest
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

FAILED = ("failed", "error")


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


def params_text(subtest: Any) -> str:
    params = getattr(subtest, "params", None) or {}
    return ", ".join(f"{name}={value!r}" for name, value in params.items())


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else ""


def fold_grid_points(points: Sequence[Tuple[str, str]], main: str = "") -> Tuple[str, str]:
    """(message, detail) for a test whose grid points `(params, traceback)` failed."""
    shown = "; ".join(f"({params})" for params, _ in points)
    message = f"{len(points)} grid point(s) failed: {shown}"
    parts = [f"grid point ({params}) failed:\n{text}" for params, text in points]
    if main:
        parts.append(main)
        message = f"{message}; then: {last_line(main)}"
    return message, "\n".join(parts)


class Reported(AssertionError):
    """An outcome that was already formatted (by a rank, or folded from grid points)."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


class ReportedError(Exception):
    """Like Reported, for an error rather than a failed check (a suite that cannot load)."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


def formatted(err: Any) -> Optional[str]:
    """The prepared text of a Reported/ReportedError exc_info triple, else None."""
    return err[1].detail if isinstance(err[1], (Reported, ReportedError)) else None


def interrupted_now() -> bool:
    """Whether an interruption (Ctrl-C, SIGTERM, SIGHUP) is unwinding through the caller: a
    test whose stopTest sees one did not finish and gets no verdict."""
    return isinstance(sys.exc_info()[1], KeyboardInterrupt)


class Tally:
    """Mixin for a unittest result class: one verdict per finished test, for the closing
    `N passed, N failed, N skipped` line, by GridFold's rule (a test with failing grid
    points counts once, one whose every grid point skipped is a skip). A class or module
    fixture that fails (or skips) counts as one failure (or skip)."""

    _verdict_fold: Optional[GridFold] = None  # own name: JUnitResult, mixed in too, has _fold
    _current: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self.tally = {"passed": 0, "failed": 0, "skipped": 0}

    def startTest(self, test: Any) -> None:  # noqa: N802 - unittest's naming
        super().startTest(test)  # type: ignore[misc]
        self._current, self._verdict_fold = test, GridFold()

    def _problem(self, status: str, exc_type: str) -> None:
        if self._verdict_fold is None:  # a fixture outside any test
            self.tally["failed"] += 1
        else:
            self._verdict_fold.error(status, exc_type, "")

    def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        super().addFailure(test, err)  # type: ignore[misc]
        self._problem("failed", err[0].__name__)

    def addError(self, test: Any, err: Any) -> None:  # noqa: N802
        super().addError(test, err)  # type: ignore[misc]
        self._problem("error", err[0].__name__)

    def addUnexpectedSuccess(self, test: Any) -> None:  # noqa: N802
        super().addUnexpectedSuccess(test)  # type: ignore[misc]
        self._problem("failed", "UnexpectedSuccess")

    def addSkip(self, test: Any, reason: str) -> None:  # noqa: N802
        super().addSkip(test, reason)  # type: ignore[misc]
        if self._verdict_fold is None:
            self.tally["skipped"] += 1
        elif test is self._current:
            self._verdict_fold.skipped(reason)
        else:  # a grid point skipped itself
            self._verdict_fold.point_skipped(reason)

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802
        super().addSubTest(test, subtest, err)  # type: ignore[misc]
        if self._verdict_fold is not None:
            self._verdict_fold.subtest(subtest, None if err is None else "", "")

    def stopTest(self, test: Any) -> None:  # noqa: N802
        super().stopTest(test)  # type: ignore[misc]
        if self._verdict_fold is not None and not interrupted_now():
            status = self._verdict_fold.record(test.id()).status
            self.tally["failed" if status in FAILED else status] += 1
        self._current = self._verdict_fold = None


def reported_exc_info(record: RunRecord) -> Tuple[type, BaseException, None]:
    """An exc_info triple for `record`, for result classes that want one (JUnit XML)."""
    name = record.exc_type or "AssertionError"
    kind = type(name, (Reported,), {})
    return kind, kind(record.message, record.detail), None


class GridFold:
    """One test's unittest events folded into its one outcome, for the summary and for the XML.

    The rule lives here alone: a test with failing grid points is one failed test whose
    message lists the points with their parameters (then the test's own error, if it had
    one); a test whose every grid point skipped itself tested nothing, so it is skipped, with
    the first point's reason (as unittest's own runner lists only skips for it); every grid
    point it ran (passed, failed or skipped) counts toward its grid points.
    """

    def __init__(self) -> None:
        self.points_run = 0
        self.failed_points: List[Tuple[str, str, str]] = []  # params, traceback, exception type
        self.point_skips: List[str] = []  # each skipped grid point's reason
        self.main: Optional[Tuple[str, str, str]] = None  # status, exception type, traceback
        self.skip: Optional[str] = None

    def subtest(self, subtest: Any, text: Optional[str] = None, exc_type: str = "") -> None:
        """A grid point finished: passed (no `text`), or failed with traceback `text`."""
        self.points_run += 1
        if text is not None:
            self.failed_points.append((params_text(subtest), text, exc_type))

    def point_skipped(self, reason: str) -> None:
        self.points_run += 1
        self.point_skips.append(reason)

    def every_point_skipped(self) -> Optional[str]:
        """The first point's reason when the test ran grid points and every one skipped."""
        if self.point_skips and len(self.point_skips) == self.points_run:
            return self.point_skips[0]
        return None

    def error(self, status: str, exc_type: str, text: str) -> None:
        """The test itself failed ("failed") or raised ("error"), with traceback `text`."""
        self.main = (status, exc_type, text)

    def skipped(self, reason: str) -> None:
        self.skip = reason

    def record(self, test_id: str, suite: str = "", duration: float = 0.0) -> RunRecord:
        """The test's one record: failing grid points first, then its own error or skip."""
        record = RunRecord(test_id, suite, grid_points=self.points_run, duration=duration)
        main_text = self.main[2] if self.main else ""
        if self.failed_points:
            record.status = "failed"
            points = [(params, text) for params, text, _ in self.failed_points]
            record.message, record.detail = fold_grid_points(points, main_text)
            record.exc_type = self.failed_points[0][2]
        elif self.main:
            record.status, record.exc_type, record.detail = self.main
            record.message = last_line(main_text)
        elif self.skip is not None or self.every_point_skipped() is not None:
            record.status = "skipped"
            record.message = self.skip if self.skip is not None else self.point_skips[0]
        return record

    def take_folded(self, test_id: str) -> Tuple[type, BaseException, None]:
        """The failing grid points (and the test's own error, if any) as one failure's exc_info
        triple, for result classes that report at once (JUnit XML); they are then cleared."""
        folded = reported_exc_info(self.record(test_id))
        self.failed_points, self.main = [], None
        return folded


class Collector(unittest.TestResult):
    """A unittest result that turns each test's events into one RunRecord (through GridFold)."""

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
        self._fold = GridFold()

    def startTest(self, test: unittest.TestCase) -> None:  # noqa: N802 - unittest's naming
        super().startTest(test)
        self._test, self._started, self._fold = test, time.monotonic(), GridFold()
        self._on_start(test)

    def _exc_info_to_string(self, err: Any, test: Any) -> str:
        text = formatted(err)
        return text if text is not None else super()._exc_info_to_string(err, test)

    def _outside(self, test: Any, status: str, message: str, detail: str, exc: str) -> None:
        """A class/module fixture error or skip: reported as a record of its own, with an id
        like a test's (`setUpClass (mod.Class)` becomes `mod.Class.setUpClass`)."""
        hook, _, owner = str(test).partition(" (")
        test_id = f"{owner.rstrip(')')}.{hook}" if owner else str(test)
        self._on_record(test, RunRecord(test_id, self.suite, status, message, detail, exc))

    def _error(self, test: Any, status: str, err: Any) -> None:
        text = self._exc_info_to_string(err, test)
        if self._test is None:
            self._outside(test, status, last_line(text), text, err[0].__name__)
        else:
            self._fold.error(status, err[0].__name__, text)

    def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        self._error(test, "failed", err)

    def addError(self, test: Any, err: Any) -> None:  # noqa: N802
        self._error(test, "error", err)

    def addSkip(self, test: Any, reason: str) -> None:  # noqa: N802
        if self._test is None:
            self._outside(test, "skipped", reason, "", "")
        elif test is self._test:
            self._fold.skipped(reason)
        else:  # a grid point skipped itself
            self._fold.point_skipped(reason)

    def addExpectedFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        """Counts as passed: the test failed as it declared it would."""

    def addUnexpectedSuccess(self, test: Any) -> None:  # noqa: N802
        text = "unexpected success: the test is marked expectedFailure but passed"
        self._fold.error("failed", "UnexpectedSuccess", text)

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802
        if err is None:
            self._fold.subtest(subtest)
        else:
            self._fold.subtest(subtest, self._exc_info_to_string(err, test), err[0].__name__)

    def stopTest(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().stopTest(test)
        if interrupted_now():
            self._test = None  # interrupted, not finished: no verdict to report
            return
        record = self._fold.record(test.id(), self.suite, time.monotonic() - self._started)
        self._test = None
        self._on_record(test, record)
