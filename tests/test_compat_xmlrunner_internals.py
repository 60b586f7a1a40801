"""harness.compat.xmlrunner_internals: each private symbol of unittest-xml-reporting (xmlrunner)
the harness uses exists and behaves as the harness expects with the installed release. A
failure names the symbol and the release: a new xmlrunner that moved or changed one fails
here, in the project's own tests, not in a user's XML report."""

from __future__ import annotations

import io
import sys
import tempfile
import unittest
from pathlib import Path
from xml.dom.minidom import Document

import xmlrunner
import xmlrunner.result

from harness.compat import xmlrunner_internals
from harness.compat.xmlrunner_internals import XMLTestResult, XMLTestRunner, about

# What the harness's testcase record (harness/runner/junit.py's ReportInfo) sets: all that
# xmlrunner's writer may read of one.
INFO_FIELDS = (
    "outcome", "elapsed_time", "timestamp", "test_exception_name", "test_exception_message",
    "test_exception_info", "stdout", "stderr", "test_name", "test_id", "test_description",
    "filename", "lineno", "doc",
)


class Printing(unittest.TestCase):
    __test__ = False  # run by the tests below, not collected

    def test_prints(self) -> None:
        print("to stdout")
        print("to stderr", file=sys.stderr)


def _ran(result: XMLTestResult) -> XMLTestResult:
    Printing("test_prints").run(result)
    return result


class PrivateSymbols(unittest.TestCase):
    def test_every_symbol_exists(self) -> None:
        for owner, names in (
            (xmlrunner.result, ("_TestInfo", "_XMLTestResult", "testcase_name")),
            (xmlrunner.result._TestInfo, ("SUCCESS", "FAILURE", "ERROR", "SKIP")),
            (xmlrunner.result._XMLTestResult, ("_get_info_by_testcase", "_report_testsuite",
                                               "generate_reports")),
            (xmlrunner.XMLTestRunner, ("_make_result",)),
        ):
            for name in names:
                self.assertTrue(hasattr(owner, name), about(f"{owner.__name__}.{name}"))
        self.assertTrue(issubclass(XMLTestResult, xmlrunner.result._XMLTestResult))
        self.assertIs(xmlrunner_internals.TestInfo, xmlrunner.result._TestInfo)

    def test_about_names_the_symbol_and_the_release(self) -> None:
        text = about("_XMLTestResult._stdout_data")
        self.assertIn("_XMLTestResult._stdout_data", text)
        self.assertIn(xmlrunner.__version__, text)

    def test_captured_output_is_the_tests(self) -> None:
        symbol = about("_XMLTestResult._stdout_data and _stderr_data")
        result = _ran(XMLTestResult(io.StringIO(), verbosity=0))
        stdout, stderr = result.captured_output()
        self.assertIn("to stdout", stdout, symbol)
        self.assertIn("to stderr", stderr, symbol)
        self.assertEqual(XMLTestResult(io.StringIO()).captured_output(), ("", ""), symbol)

    def test_testcases_by_file_is_xmlrunners_grouping_and_what_it_writes(self) -> None:
        symbol = about("_XMLTestResult._get_info_by_testcase")
        result = _ran(XMLTestResult(io.StringIO(), verbosity=0))
        grouped = result.testcases_by_file()
        self.assertEqual(list(grouped), [f"{__name__}.Printing"], symbol)
        self.assertEqual([info.test_id for info in grouped[f"{__name__}.Printing"]],
                         [Printing("test_prints").id()], symbol)

        class Renamed(XMLTestResult):
            def testcases_by_file(self):  # noqa: ANN202
                return {"renamed": super().testcases_by_file()[f"{__name__}.Printing"]}

        with tempfile.TemporaryDirectory() as folder:
            runner = XMLTestRunner(output=folder, outsuffix="", stream=io.StringIO())
            _ran(Renamed(io.StringIO(), verbosity=0)).generate_reports(runner)
            self.assertEqual([p.name for p in Path(folder).iterdir()], ["TEST-renamed.xml"],
                             symbol)

    def test_write_testsuite_writes_what_the_harness_sets(self) -> None:
        symbol = about("_XMLTestResult._report_testsuite and the _TestInfo fields it reads")
        result = XMLTestResult(io.StringIO(), verbosity=0)
        info = object.__new__(xmlrunner_internals.TestInfo)  # as junit's: only these fields
        for field in INFO_FIELDS:
            setattr(info, field, "")
        info.outcome, info.elapsed_time, info.lineno = xmlrunner_internals.TestInfo.SUCCESS, 0.5, 3
        info.test_name, info.test_id = "suite", "suite.Case.test_x"
        doc = Document()
        result.write_testsuite(doc, "suite", [info])
        xml = doc.toxml()
        self.assertIn('<testsuite name="suite" tests="1"', xml, symbol)
        self.assertIn('name="test_x"', xml, symbol)

    def test_prepare_result_sees_each_result_the_runner_makes(self) -> None:
        symbol = about("XMLTestRunner._make_result")
        seen = []

        class Runner(XMLTestRunner):
            def prepare_result(self, result):  # noqa: ANN001, ANN202
                seen.append(result)
                return result

        with tempfile.TemporaryDirectory() as folder:
            Runner(output=folder, stream=io.StringIO()).run(Printing("test_prints"))
        self.assertEqual(len(seen), 1, symbol)
        self.assertIsInstance(seen[0], xmlrunner.result._XMLTestResult, symbol)

    def test_the_module_lists_what_it_offers(self) -> None:
        for name in xmlrunner_internals.__all__:
            self.assertTrue(hasattr(xmlrunner_internals, name), name)


if __name__ == "__main__":
    unittest.main()
