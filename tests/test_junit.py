"""harness.runner.junit: one <testcase> per test, failing grid points folded into it the same
way as in the summary (records.GridFold), and records built elsewhere reported as given."""

from __future__ import annotations

import io
import tempfile
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict

from harness.runner.junit import junit_result_class, stand_in_for, xml_runner
from harness.runner.records import RunRecord
from tests.test_records import _grid_cases, collect


def junit_cases(*tests: unittest.TestCase, records: tuple = ()) -> Dict[str, ET.Element]:
    """Run `tests` (then report `records`) through the JUnit result: <testcase> by name."""
    result = junit_result_class()(io.StringIO(), verbosity=0)
    unittest.TestSuite(tests).run(result)
    for record in records:
        result.add_record(stand_in_for(record), record)
    with tempfile.TemporaryDirectory() as folder:
        result.generate_reports(xml_runner(folder))
        return {
            case.get("name"): case
            for path in sorted(Path(folder).glob("TEST-*.xml"))
            for case in ET.parse(path).getroot().iter("testcase")
        }


class GridPointsInXml(unittest.TestCase):
    NAMES = ("test_one_failing_point", "test_two_failing_points", "test_failure_after_a_point",
             "test_skipped_points", "test_every_point_skipped", "test_skipped_after_points",
             "test_error_point")

    @classmethod
    def setUpClass(cls) -> None:
        grid = _grid_cases()
        cls.cases = junit_cases(*(grid(name) for name in cls.NAMES))
        cls.records = {name: collect(grid(name)) for name in cls.NAMES}

    def test_one_testcase_per_test(self) -> None:
        self.assertEqual(sorted(self.cases), sorted(self.NAMES))

    def test_failing_points_are_one_failure_with_the_summarys_message(self) -> None:
        for name in ("test_one_failing_point", "test_two_failing_points",
                     "test_failure_after_a_point", "test_error_point"):
            with self.subTest(name=name):
                failures = self.cases[name].findall("failure")
                self.assertEqual(len(failures), 1)
                self.assertEqual(len(self.cases[name].findall("error")), 0)
                self.assertEqual(failures[0].get("message"), self.records[name].message)
                self.assertEqual(failures[0].get("type"), self.records[name].exc_type)

    def test_the_tests_own_error_follows_its_points(self) -> None:
        text = self.cases["test_failure_after_a_point"].find("failure").text
        self.assertLess(text.index("grid point (value=3) failed"),
                        text.index("ValueError: then the test itself"))

    def test_skips(self) -> None:
        self.assertEqual(list(self.cases["test_skipped_points"]), [])  # some points ran: passed
        for name in ("test_skipped_after_points", "test_every_point_skipped"):
            with self.subTest(name=name):
                skipped = self.cases[name].find("skipped")
                self.assertEqual(skipped.get("message"), self.records[name].message)
                self.assertEqual(self.records[name].status, "skipped")


class RecordsInXml(unittest.TestCase):
    def test_a_fixture_record_is_reported_under_its_class(self) -> None:
        record = RunRecord("pkg.mod.TestC.setUpClass", "pkg.mod", "error", "boom: no",
                           "Traceback\nboom: no", "RuntimeError")
        error = junit_cases(records=(record,))["setUpClass"].find("error")
        self.assertEqual((error.get("type"), error.get("message")), ("RuntimeError", "boom: no"))
        self.assertIn("Traceback\nboom: no", error.text)


if __name__ == "__main__":
    unittest.main()
