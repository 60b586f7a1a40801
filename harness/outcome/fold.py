"""One test's outcome from its parts: the grid-point fold rule, and the TestReports built from
unittest's events.

unittest reports many events per test (one `addSubTest` per grid point, then the test's
own); everything downstream wants one answer per test. The rule lives in `fold` alone: a
test with failing grid points is one failed test whose message lists the points with their
parameters (then the test's own problem, if it had one); a test whose every grid point
skipped tested nothing, so it is skipped with the first point's reason; every point it ran
counts toward its grid points. `decide` (merge.py) folds a multi-rank test's merged points
through it; `ReportBuilder` folds a plain test's unittest events through it, telling a grid
point's skip from the test's own by one rule: a skip reported for a test other than the
current one is a grid point's.

`OneReportPerTest` is the unittest result side: a mixin that hands one TestReport per
finished test (and per class or module fixture that failed or skipped) to `report_done`.
A test that knows its report already (a multi-rank test's supervisor, a suite that failed
to import) hands it over through `add_report` (the `ReportReceiver` protocol) and then
replays it into unittest's API for plain runners; the replay's events are not folded again.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import unittest
from typing import Any, List, Optional, Protocol, runtime_checkable

from harness.compat import unittest_internals
from harness.outcome.replay import replayed_report
from harness.outcome.report import (
    FAILED,
    PASSED,
    PROBLEMS,
    SKIPPED,
    Outcome,
    PointReport,
    TestReport,
    params_text,
)


def last_line(text: str) -> str:
    """The last non-blank line of `text` (a traceback's exception line), at most 300 chars."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else ""


NO_PROBLEM = Outcome()


def fold(
    test_id: str, points: List[PointReport], own: Outcome = NO_PROBLEM, suite: str = "",
    duration: float = 0.0,
) -> TestReport:
    """The test's one report from its grid points and its own outcome."""
    report = TestReport(test_id, suite, duration=duration, points=list(points), own=own)
    failing = [point for point in points if point.status == FAILED]
    if failing:
        shown = "; ".join(f"({params_text(point.params)})" for point in failing)
        report.status, report.message = FAILED, f"{len(failing)} grid point(s) failed: {shown}"
        parts = [f"grid point ({params_text(p.params)}) failed:\n{p.text}" for p in failing]
        if own.status in PROBLEMS:
            parts.append(own.detail)
            report.message += f"; then: {own.message}"
        report.detail = "\n".join(parts)
        report.exc_type = failing[0].exc_type
        report.lead = failing[0].lead or own.lead
    elif own.status in PROBLEMS:
        report.status, report.message, report.detail = own.status, own.message, own.detail
        report.exc_type, report.lead = own.exc_type, own.lead
    elif own.status == SKIPPED:
        report.status, report.message = SKIPPED, own.message
    elif points and all(point.status == SKIPPED for point in points):
        report.status, report.message = SKIPPED, points[0].text
    return report


def with_own_problem(report: TestReport, problem: Outcome) -> TestReport:
    """`report` after the test itself also failed (a tearDown after the ranks' report, a
    return-code check): its grid points kept; a problem it already had leads, the new one's
    text follows."""
    own = report.own
    if own.status in PROBLEMS:
        problem = own._replace(detail=f"{own.detail}\n{problem.detail}")
    return fold(report.test_id, report.points, problem, report.suite, report.duration)


def subtest_params(subtest: Any) -> dict:
    return dict(getattr(subtest, "params", None) or {})


class ReportBuilder:
    """One test's unittest events, folded into its TestReport when it finished."""

    def __init__(self, test: Any) -> None:
        self.test = test
        self.started = time.monotonic()
        self.points: List[PointReport] = []
        self.own: Optional[Outcome] = None  # the test's own failure or error
        self.skip: Optional[str] = None
        self.given: Optional[TestReport] = None  # the report the test handed over itself
        self._replay_end_seen = False

    def give(self, report: TestReport) -> None:
        """The test's report, built by the test itself: unittest's events that replay it
        (its grid points, then its own failure or skip) are not folded again."""
        self.given = report

    def _replayed(self, err: Any = None, skip: Optional[str] = None) -> bool:
        """Whether this test-level event is the replay of the given report's own outcome."""
        given = self.given
        if given is None or self._replay_end_seen:
            return False
        if err is not None:
            seen = replayed_report(err[1]) is given
        else:
            seen = given.own.status == SKIPPED and skip == given.own.message
        self._replay_end_seen = seen
        return seen

    def point(self, subtest: Any, status: str, text: str = "", exc_type: str = "") -> None:
        """A grid point finished: passed, failed (`text`: its traceback) or skipped (`text`:
        the reason)."""
        if self.given is None:  # else the replay of a grid point the report holds
            self.points.append(PointReport(subtest_params(subtest), status, text, exc_type))

    def skipped(self, test: Any, reason: str) -> None:
        """A skip: the test's own, or, reported for another test (a subTest), a grid point's."""
        if test is not self.test:
            self.point(test, SKIPPED, reason)
        elif not self._replayed(skip=reason):
            self.skip = reason

    def problem(self, status: str, err: Any, text: str) -> None:
        """The test itself failed ("failed") or raised ("error"), with traceback `text`."""
        if err is not None and self._replayed(err=err):
            return
        exc_type = err[0].__name__ if err is not None else "UnexpectedSuccess"
        if self.own is None:
            self.own = Outcome(status, last_line(text), text, exc_type)
        else:  # a later problem (tearDown, a cleanup): its text follows the first one's
            self.own = self.own._replace(detail=f"{self.own.detail}\n{text}")

    def report(self, suite: str = "") -> TestReport:
        duration = time.monotonic() - self.started
        test_id = self.test.id()
        own = self.own or (NO_PROBLEM if self.skip is None else Outcome(SKIPPED, self.skip))
        if self.given is None:
            return fold(test_id, self.points, own, suite, duration)
        report = dataclasses.replace(self.given, test_id=test_id, suite=suite, duration=duration)
        return with_own_problem(report, own) if own.status in PROBLEMS else report


def fixture_report(
    fixture: Any, status: str, message: str, detail: str = "", exc_type: str = "",
    suite: str = "",
) -> TestReport:
    """A class/module fixture's error or skip, as a report of its own with an id like a
    test's (`setUpClass (mod.Class)` becomes `mod.Class.setUpClass`)."""
    hook, _, owner = str(fixture).partition(" (")
    test_id = f"{owner.rstrip(')')}.{hook}" if owner else str(fixture)
    return fold(test_id, [], Outcome(status, message, detail, exc_type), suite)


def interrupted_now() -> bool:
    """Whether an interruption (Ctrl-C, SIGTERM, SIGHUP) is unwinding through the caller: a
    test whose stopTest sees one did not finish and gets no report."""
    return isinstance(sys.exc_info()[1], KeyboardInterrupt)


@runtime_checkable
class ReportReceiver(Protocol):
    """A unittest result that takes a test's report from the test itself (during the test's
    run, before the test replays it into unittest's API)."""

    def add_report(self, test: unittest.TestCase, report: TestReport) -> None: ...


def hand_report(result: Any, test: unittest.TestCase, report: TestReport) -> None:
    """Give `report` to `result` when it is a ReportReceiver (plain runners are not: they
    see only the replay)."""
    if isinstance(result, ReportReceiver):
        result.add_report(test, report)


class OneReportPerTest:
    """Mixin for a unittest result: one TestReport per finished test, handed to `report_done`.

    Mixed in before the unittest result class it extends (which keeps its own behaviour:
    text output, failure lists). `suite` names the suite the reports belong to.
    """

    suite: str = ""
    _builder: Optional[ReportBuilder] = None

    def report_done(self, test: Any, report: TestReport) -> None:
        """A test (or a fixture: `test` is then unittest's stand-in for it) finished."""

    def add_report(self, test: unittest.TestCase, report: TestReport) -> None:
        """The ReportReceiver protocol: the running test's report, built by the test."""
        if self._builder is not None and test is self._builder.test:
            self._builder.give(report)

    def startTest(self, test: Any) -> None:  # noqa: N802 - unittest's naming
        super().startTest(test)  # type: ignore[misc]
        self._builder = ReportBuilder(test)

    def _text(self, err: Any, test: Any) -> str:
        return unittest_internals.exc_info_to_string(self, err, test)  # type: ignore[arg-type]

    def _problem(self, test: Any, status: str, err: Any) -> None:
        if isinstance(test, unittest.TestCase) and (
            self._builder is None or test is not self._builder.test
        ):
            # A part of a test that already stopped: an interruption that landed in unittest's
            # testPartExecutor leaves its generator to be closed later, which adds
            # GeneratorExit as an error of the stopped test. It did not fail; it was stopped.
            return
        text = self._text(err, test)
        if self._builder is None:  # a fixture outside any test
            report = fixture_report(test, status, last_line(text), text, err[0].__name__,
                                    self.suite)
            self.report_done(test, report)
        else:
            self._builder.problem(status, err, text)

    def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        super().addFailure(test, err)  # type: ignore[misc]
        self._problem(test, FAILED, err)

    def addError(self, test: Any, err: Any) -> None:  # noqa: N802
        super().addError(test, err)  # type: ignore[misc]
        self._problem(test, "error", err)

    def addSkip(self, test: Any, reason: str) -> None:  # noqa: N802
        super().addSkip(test, reason)  # type: ignore[misc]
        if self._builder is None:
            self.report_done(test, fixture_report(test, SKIPPED, reason, suite=self.suite))
        else:
            self._builder.skipped(test, reason)

    def addUnexpectedSuccess(self, test: Any) -> None:  # noqa: N802
        super().addUnexpectedSuccess(test)  # type: ignore[misc]
        if self._builder is not None:
            text = "unexpected success: the test is marked expectedFailure but passed"
            self._builder.problem(FAILED, None, text)

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802
        super().addSubTest(test, subtest, err)  # type: ignore[misc]
        if self._builder is None:
            return
        if err is None:
            self._builder.point(subtest, PASSED)
        else:
            self._builder.point(subtest, FAILED, self._text(err, test), err[0].__name__)

    def stopTest(self, test: Any) -> None:  # noqa: N802
        super().stopTest(test)  # type: ignore[misc]
        builder, self._builder = self._builder, None
        if builder is not None and not interrupted_now():  # interrupted: it did not finish
            self.report_done(test, builder.report(self.suite))
