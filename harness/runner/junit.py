"""JUnit XML through unittest-xml-reporting (xmlrunner), with one testcase per test.

xmlrunner writes one testcase per unittest event, so a test with three failing grid points
would appear as three failures; the result class here folds them into one testcase through
`records.GridFold` (the fold the summary uses too), and can report records built elsewhere
(by the engine, or fixture results that belong to no test method, through `stand_in_for`).
"""

from __future__ import annotations

import time
import unittest
from typing import Any, Optional

from harness.runner.records import (
    GridFold,
    RunRecord,
    formatted,
    interrupted_now,
    reported_exc_info,
)


def junit_result_class() -> type:
    """xmlrunner's result, with one testcase per test: failing grid points are folded into it."""
    from xmlrunner.result import _XMLTestResult

    class JUnitResult(_XMLTestResult):
        def _outcomes(self) -> int:
            return sum(len(found) for found in (
                self.successes, self.failures, self.errors, self.skipped,
                self.expectedFailures, self.unexpectedSuccesses,
            ))

        def startTest(self, test: Any) -> None:  # noqa: N802
            self._fold, self._test, self._outcomes_before = GridFold(), test, self._outcomes()
            super().startTest(test)

        def _exc_info_to_string(self, err: Any, test: Any) -> str:
            text = formatted(err)
            return text if text is not None else super()._exc_info_to_string(err, test)

        def _folding(self) -> bool:
            return bool(getattr(self, "_fold", None) and self._fold.failed_points)

        def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802
            if err is None:
                self._fold.subtest(subtest)
                return
            text = self._exc_info_to_string(err, test)
            self._fold.subtest(subtest, text, err[0].__name__)
            if self.failfast:
                self.stop()

        def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802
            if self._folding():
                self._fold.error("failed", err[0].__name__, self._exc_info_to_string(err, test))
                err = self._fold.take_folded(test.id())
            super().addFailure(test, err)

        def addError(self, test: Any, err: Any) -> None:  # noqa: N802
            if self._folding():
                self._fold.error("error", err[0].__name__, self._exc_info_to_string(err, test))
                return super().addFailure(test, self._fold.take_folded(test.id()))
            super().addError(test, err)

        def addSkip(self, test: Any, reason: str) -> None:  # noqa: N802
            if getattr(self, "_test", None) not in (None, test):  # a grid point skipped itself
                self._fold.point_skipped(reason)
                return
            super().addSkip(test, reason)

        def stopTest(self, test: Any) -> None:  # noqa: N802
            if not interrupted_now():
                if self._folding():
                    super().addFailure(test, self._fold.take_folded(test.id()))
                elif self._outcomes() == self._outcomes_before:  # only grid points, no verdict
                    every_point_skipped = self._fold.every_point_skipped()
                    if every_point_skipped is not None:
                        super().addSkip(test, every_point_skipped)
                    else:
                        self.addSuccess(test)
            self._fold = GridFold()  # an interrupted test did not finish: no testcase for it
            self._test = None
            super().stopTest(test)

        def add_record(self, test: Any, record: RunRecord) -> None:
            """Report a record built elsewhere (the engine's, folded by the Collector)."""
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


def xml_runner(output: str, resultclass: Optional[type] = None, **kwargs: Any) -> Any:
    """An XMLTestRunner writing TEST-<module>.<Class>.xml files into `output`, with
    `resultclass` (junit_result_class() or a subclass of it)."""
    import xmlrunner

    return xmlrunner.XMLTestRunner(
        output=output, outsuffix="", resultclass=resultclass or junit_result_class(), **kwargs
    )


def stand_in_for(record: RunRecord) -> unittest.TestCase:
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
