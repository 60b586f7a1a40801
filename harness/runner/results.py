"""The runner's unittest results: each reads one TestReport per finished test.

unittest reports many events per test (a grid point is one `addSubTest` each); the outcome
model folds them into one TestReport (harness/outcome/fold.py: `OneReportPerTest`), or
takes the report a multi-rank test's supervisor built from its ranks (`add_report`). The
results here only read those reports: the `Collector` hands each to run_all.py's engine (or
a -j worker), which feeds the progress line, the per-suite table, the closing
`N passed, N failed, N skipped` line and the JUnit XML; `Tally` counts them for run_tests'
closing line.
"""

from __future__ import annotations

import unittest
from typing import Any, Callable

from harness.outcome.fold import OneReportPerTest
from harness.outcome.report import TestReport


class Tally(OneReportPerTest):
    """Mixin for a unittest result class: one verdict per finished test, for the closing
    `N passed, N failed, N skipped` line (a test with failing grid points counts once, one
    whose every grid point skipped is a skip; a class or module fixture that fails, or
    skips, counts as one failure, or skip)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self.tally = {"passed": 0, "failed": 0, "skipped": 0}

    def report_done(self, test: Any, report: TestReport) -> None:
        super().report_done(test, report)
        self.tally["failed" if report.failed else report.status] += 1


class Collector(OneReportPerTest, unittest.TestResult):
    """A unittest result that hands each test's TestReport (and each failed or skipped
    fixture's) to `on_report`, and says when a test starts (`on_start`)."""

    def __init__(
        self,
        on_start: Callable[[unittest.TestCase], None],
        on_report: Callable[[Any, TestReport], None],
    ) -> None:
        super().__init__()
        self._on_start = on_start
        self._on_report = on_report

    def startTest(self, test: unittest.TestCase) -> None:  # noqa: N802 - unittest's naming
        super().startTest(test)
        self._on_start(test)

    def report_done(self, test: Any, report: TestReport) -> None:
        self._on_report(test, report)
