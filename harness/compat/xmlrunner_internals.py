"""unittest-xml-reporting's (xmlrunner's) private API, which the harness touches here only:
its result class (`_XMLTestResult`) with the test output it captures (`_stdout_data`,
`_stderr_data`), its grouping of testcases by file (`_get_info_by_testcase`) and its
testsuite writer (`_report_testsuite`); the record of one testcase its writer reads
(`_TestInfo`); and the runner's hook that makes a result (`XMLTestRunner._make_result`).

harness/runner/junit.py writes xmlrunner's XML from the harness's TestReports through the
public names here. A release that moves or changes one of these breaks the harness here, in
one place: the harness's own tests (tests/test_compat_xmlrunner_internals.py) name the
symbol and the installed xmlrunner. Imported only when XML is written.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import xmlrunner
from xmlrunner.result import _TestInfo, _XMLTestResult, testcase_name

__all__ = ["TestInfo", "XMLTestResult", "XMLTestRunner", "about", "testcase_name"]

# The record of one testcase that xmlrunner's writer reads: `outcome` (one of its SUCCESS,
# FAILURE, ERROR, SKIP), `elapsed_time`, `timestamp`, `test_exception_name`,
# `test_exception_message`, `test_exception_info`, `stdout`, `stderr`, `test_name`,
# `test_id`, `test_description`, `filename`, `lineno`, `doc`.
TestInfo = _TestInfo


def about(symbol: str) -> str:
    """`symbol` and the installed xmlrunner, for a message."""
    return f"{symbol} of unittest-xml-reporting {xmlrunner.__version__}"


class XMLTestResult(_XMLTestResult):
    """xmlrunner's result, with its private parts behind public names: `captured_output()`,
    `testcases_by_file()` (what xmlrunner's `generate_reports` writes; override it to write
    other testcases) and `write_testsuite`."""

    def captured_output(self) -> Tuple[str, str]:
        """(stdout, stderr) of the test that just ran, as xmlrunner captured them."""
        return self._stdout_data or "", self._stderr_data or ""

    def testcases_by_file(self) -> Dict[str, List[Any]]:
        """Each XML file's testcases (TestInfo records), by name: xmlrunner's own grouping of
        the tests this result saw."""
        return super()._get_info_by_testcase()

    def _get_info_by_testcase(self) -> Dict[str, List[Any]]:
        return self.testcases_by_file()

    def write_testsuite(self, doc: Any, suite: str, infos: List[Any]) -> None:
        """Add the testsuite `suite` with the testcases `infos` to the XML document `doc`, as
        xmlrunner writes one file (with this result's properties)."""
        self._report_testsuite(suite, infos, doc, doc, self.properties)


class XMLTestRunner(xmlrunner.XMLTestRunner):
    """xmlrunner's runner; `prepare_result(result)` sees each result it makes."""

    def _make_result(self) -> Any:
        return self.prepare_result(super()._make_result())

    def prepare_result(self, result: Any) -> Any:
        """The result the runner will use, given the one it made (itself, by default)."""
        return result
