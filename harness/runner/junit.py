"""JUnit XML in unittest-xml-reporting's (xmlrunner's) format, one testcase per TestReport.

The result class here is xmlrunner's (through harness/compat/xmlrunner_internals.py, the one
module that touches its private API), for its text output and its XML writer, but the
testcases it writes come from TestReports (harness/outcome/report.py), never from
xmlrunner's per-event lists: a test with three failing grid points is one testcase with one
failure listing them, a multi-rank test is the report its ranks' merge built. Reports
arrive as tests finish in this process (`OneReportPerTest` builds or takes them) or, from
run_all.py's engine, built elsewhere (`report_done`; fixture results that belong to no test
method through `stand_in_for`).

Each report rewrites its class's file at once when asked (`write_each_test_to`), atomically
(a temp file renamed over it), so a run killed by CI after its timeout, even with SIGKILL,
leaves the record of every test that finished; the closing XML is the same as if written
only at the end.
"""

from __future__ import annotations

import datetime
import inspect
import os
import sys
import unittest
from typing import Any, Dict, List, Optional, Tuple

from harness.compat import unittest_internals
from harness.outcome.fold import OneReportPerTest
from harness.outcome.report import ERROR, FAILED, PASSED, SKIPPED, TestReport

# xmlrunner's order of testcases within a file: by outcome, then as they finished.
OUTCOME_ORDER = (PASSED, FAILED, ERROR, SKIPPED)


def source_of(test: Any) -> Tuple[Optional[str], Optional[int], Optional[str]]:
    """(file, line, docstring) of a test's method, as xmlrunner finds them; a stand-in's
    module file only."""
    if getattr(test, "stand_in", False):
        module = sys.modules.get(type(test).__module__)
        try:
            return inspect.getsourcefile(module) if module else None, None, None  # type: ignore[arg-type]
        except TypeError:  # a built-in module
            return None, None, None
    try:
        method = getattr(test, unittest_internals.method_name(test))
        filename = inspect.getsourcefile(type(test))
        method = getattr(method, "func", method)
        _, lineno = inspect.getsourcelines(method)
        return filename, lineno, method.__doc__
    except (AttributeError, OSError, TypeError):
        return None, None, None


def junit_result_class() -> type:
    """xmlrunner's result, writing one testcase per TestReport."""
    from xml.dom.minidom import Document

    from harness.compat.xmlrunner_internals import TestInfo, XMLTestResult, testcase_name

    class ReportInfo(TestInfo):
        """What xmlrunner's writer reads of a testcase, taken from a TestReport."""

        OUTCOMES = {PASSED: TestInfo.SUCCESS, FAILED: TestInfo.FAILURE,
                    ERROR: TestInfo.ERROR, SKIPPED: TestInfo.SKIP}

        def __init__(self, test: Any, report: TestReport, stdout: str, stderr: str) -> None:
            self.report = report
            self.outcome = self.OUTCOMES[report.status]
            self.elapsed_time = report.duration
            self.timestamp = datetime.datetime.now().replace(microsecond=0).isoformat()
            self.test_exception_name = "skip" if report.status == SKIPPED else report.exc_type
            self.test_exception_message = report.message
            self.test_exception_info = report.detail if report.failed else ""
            self.stdout, self.stderr = stdout, stderr
            self.test_name = testcase_name(test)
            self.test_id = self.test_description = report.test_id
            self.filename, self.lineno, self.doc = source_of(test)

    class JUnitResult(OneReportPerTest, XMLTestResult):
        output_dir: Optional[str] = None  # set: each finished test's class file is written
        encoding = "UTF-8"
        _running: Any = None  # the test running in this result (its output is captured)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.reports: List[ReportInfo] = []
            self._by_file: Dict[str, List[ReportInfo]] = {}  # the reports of each file

        def write_each_test_to(self, output_dir: str, encoding: str = "UTF-8") -> None:
            """Rewrite a test's class file in `output_dir` as soon as the test finished."""
            self.output_dir, self.encoding = output_dir, encoding

        def report_done(self, test: Any, report: TestReport) -> None:
            """A finished test's report (or a fixture's: `test` is then unittest's stand-in,
            or one from `stand_in_for`): its testcase."""
            super().report_done(test, report)
            if not isinstance(test, unittest.TestCase):
                test = stand_in_for(report)
            stdout, stderr = self.captured_output() if test is self._running else ("", "")
            info = ReportInfo(test, report, stdout, stderr)
            self.reports.append(info)
            self._by_file.setdefault(info.test_name, []).append(info)
            if self.output_dir is not None:
                self._write_suite(self.output_dir, info.test_name, self.encoding)

        def startTest(self, test: Any) -> None:  # noqa: N802
            self._running = test
            super().startTest(test)

        def stopTest(self, test: Any) -> None:  # noqa: N802
            try:
                super().stopTest(test)  # xmlrunner keeps the test's output; its report is done
            finally:
                self._running = None

        def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802
            super().addSubTest(test, subtest, err)
            if err is not None and self.failfast:  # xmlrunner's own addSubTest does not stop
                self.stop()

        def _testcases(self, suite: str) -> List[ReportInfo]:
            """The testcases of file `suite`, in xmlrunner's order: by outcome, then as they
            finished."""
            infos = self._by_file.get(suite, [])
            return sorted(infos, key=lambda info: OUTCOME_ORDER.index(info.report.status))

        def testcases_by_file(self) -> Dict[str, List[ReportInfo]]:
            """The testcases of each file (what xmlrunner writes), from the reports."""
            return {suite: self._testcases(suite) for suite in self._by_file}

        def _write_suite(self, output_dir: str, suite: str, encoding: str) -> str:
            """Write TEST-<suite>.xml atomically, as xmlrunner writes it; its path."""
            doc = Document()
            tests = self._testcases(suite)
            self.write_testsuite(doc, suite, tests)
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
            for suite in self.testcases_by_file():
                path = self._write_suite(test_runner.output, suite, test_runner.encoding)
                if self.showAll:
                    self.stream.writeln(f"Generated XML report: {path}")

    return JUnitResult


def xml_runner(output: str, resultclass: Optional[type] = None, **kwargs: Any) -> Any:
    """An XMLTestRunner writing TEST-<module>.<Class>.xml files into `output`, with
    `resultclass` (junit_result_class() or a subclass of it)."""
    from harness.compat.xmlrunner_internals import XMLTestRunner

    class Runner(XMLTestRunner):
        def prepare_result(self, result: Any) -> Any:
            if isinstance(self.output, str) and hasattr(result, "write_each_test_to"):
                result.write_each_test_to(self.output, self.encoding)
            return result

    return Runner(
        output=output, outsuffix="", resultclass=resultclass or junit_result_class(), **kwargs
    )


def stand_in_for(report: TestReport) -> unittest.TestCase:
    """A TestCase carrying only an id, for reports that belong to no test method (class and
    module fixtures); named after the class it stands for, so the XML groups it there."""

    class Fixture(unittest.TestCase):
        stand_in = True

        def runTest(self) -> None:  # noqa: N802
            """Never run: the instance only names a fixture result in the XML report."""

        def id(self) -> str:
            return report.test_id

        def __str__(self) -> str:
            return report.test_id

    owner = report.test_id.rpartition(".")[0]
    module, _, name = owner.rpartition(".")
    Fixture.__module__ = module or report.suite
    Fixture.__name__ = Fixture.__qualname__ = name or "Fixture"
    return Fixture()
