"""JUnit XML through unittest-xml-reporting (xmlrunner), with one testcase per test.

xmlrunner writes one testcase per unittest event, so a test with three failing grid points
would appear as three failures; the result class here folds them into one testcase through
`records.GridFold` (the fold the summary uses too), and can report records built elsewhere
(by the engine, or fixture results that belong to no test method, through `stand_in_for`).

Each finished test rewrites its class's file (`write_each_test_to`), atomically (a temp file
renamed over it), so a run killed by CI after its timeout, even with SIGKILL, leaves the
record of every test that finished; the closing XML is the same as if written only at the end.
"""

from __future__ import annotations

import os
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
    from xml.dom.minidom import Document

    from xmlrunner.result import _XMLTestResult, testcase_name

    class JUnitResult(_XMLTestResult):
        output_dir: Optional[str] = None  # set: each finished test's class file is written
        encoding = "UTF-8"

        def write_each_test_to(self, output_dir: str, encoding: str = "UTF-8") -> None:
            """Rewrite a test's class file in `output_dir` as soon as the test finished."""
            self.output_dir, self.encoding = output_dir, encoding

        def _write_suite(self, output_dir: str, suite: str, encoding: str) -> str:
            """Write TEST-<suite>.xml atomically, as xmlrunner writes it; its path."""
            doc = Document()
            tests = self._get_info_by_testcase().get(suite, [])
            self._report_testsuite(suite, tests, doc, doc, self.properties)
            os.makedirs(output_dir, exist_ok=True)
            path = os.path.join(output_dir, f"TEST-{suite}.xml")
            partial = os.path.join(output_dir, f".TEST-{suite}.xml.partial")
            with open(partial, "wb") as f:
                f.write(doc.toprettyxml(indent="\t", encoding=encoding))
            os.replace(partial, path)
            return path

        def generate_reports(self, test_runner: Any) -> None:
            """xmlrunner's reports, each file written atomically (see `_write_suite`)."""
            if not isinstance(test_runner.output, str) or test_runner.outsuffix:
                return super().generate_reports(test_runner)
            for suite in self._get_info_by_testcase():
                path = self._write_suite(test_runner.output, suite, test_runner.encoding)
                if self.showAll:
                    self.stream.writeln(f"Generated XML report: {path}")

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
            super().stopTest(test)  # adds the test's testcase
            if self.output_dir is not None:
                self._write_suite(self.output_dir, testcase_name(test), self.encoding)

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

    class Runner(xmlrunner.XMLTestRunner):
        def _make_result(self) -> Any:
            result = super()._make_result()
            if isinstance(self.output, str) and hasattr(result, "write_each_test_to"):
                result.write_each_test_to(self.output, self.encoding)
            return result

    return Runner(
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
