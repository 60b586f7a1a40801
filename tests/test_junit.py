"""harness.runner.junit: one <testcase> per TestReport, failing grid points folded into it the
same way as in the summary (harness/outcome/fold.py), and reports built elsewhere written as
given; each finished test's report on disk at once (atomically), the closing XML unchanged by
that."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Dict, List

import pytest

from harness.outcome.report import TestReport
from harness.runner.junit import junit_result_class, stand_in_for, xml_runner
from tests.fixtures import child_env
from tests.test_results import _grid_cases, collect

WAIT_S = 240.0


def junit_cases(*tests: unittest.TestCase, reports: tuple = ()) -> Dict[str, ET.Element]:
    """Run `tests` (then write `reports`) through the JUnit result: <testcase> by name."""
    result = junit_result_class()(io.StringIO(), verbosity=0)
    unittest.TestSuite(tests).run(result)
    for report in reports:
        result.report_done(stand_in_for(report), report)
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
        cls.reports = {name: collect(grid(name)) for name in cls.NAMES}

    def test_one_testcase_per_test(self) -> None:
        self.assertEqual(sorted(self.cases), sorted(self.NAMES))

    def test_failing_points_are_one_failure_with_the_summarys_message(self) -> None:
        for name in ("test_one_failing_point", "test_two_failing_points",
                     "test_failure_after_a_point", "test_error_point"):
            with self.subTest(name=name):
                failures = self.cases[name].findall("failure")
                self.assertEqual(len(failures), 1)
                self.assertEqual(len(self.cases[name].findall("error")), 0)
                self.assertEqual(failures[0].get("message"), self.reports[name].message)
                self.assertEqual(failures[0].get("type"), self.reports[name].exc_type)

    def test_the_tests_own_error_follows_its_points(self) -> None:
        text = self.cases["test_failure_after_a_point"].find("failure").text
        self.assertLess(text.index("grid point (value=3) failed"),
                        text.index("ValueError: then the test itself"))

    def test_skips(self) -> None:
        self.assertEqual(list(self.cases["test_skipped_points"]), [])  # some points ran: passed
        for name in ("test_skipped_after_points", "test_every_point_skipped"):
            with self.subTest(name=name):
                skipped = self.cases[name].find("skipped")
                self.assertEqual(skipped.get("message"), self.reports[name].message)
                self.assertEqual(self.reports[name].status, "skipped")


def _canned_ranks() -> type:
    """A multi-rank case whose launcher hands back records written here: rank 1 failed grid
    point n=2 (made here so that no loader collects it)."""
    from harness.launch.launcher import Launcher
    from harness.launch.ranked_case import RankedTestCase
    from harness.outcome.rank_record import Event, RankRecord
    from tests.fixtures.events import rank_failure

    traceback = ('Traceback (most recent call last):\n  File "/u/test_grid.py", line 9, in '
                 'test_grid\n    self.assertEqual(n, 1)\nAssertionError: 2 != 1\n')

    def ran(rank: int, second: str, text: str = "") -> RankRecord:
        point = (rank_failure(text, "subtest", second, {"n": 2}) if second == "fail"
                 else Event("subtest", text, {"n": 2}, second))
        events = [Event("subtest", "", {"n": 1}, "pass"), point, Event("success"),
                  Event("done", count=2)]
        return RankRecord(rank=rank, events=events, exitcode=0)

    class Canned(Launcher):
        def start(self, job: Any) -> None:
            pass

        def join(self, job: Any) -> tuple:
            return [ran(0, "pass"), ran(1, "fail", traceback)], None

        def close(self) -> None:
            pass

    class RankedGrid(RankedTestCase):
        world_size = 2

        def make_launcher(self) -> Launcher:
            return Canned()

        def test_grid(self) -> None:
            """Never runs here: its ranks' records are canned."""

    return RankedGrid


class OneFailingGridPoint(unittest.TestCase):
    """From rank 1's events to the testcase: decide's TestReport, handed to the result by the
    supervising case (add_report), is what the XML says; the replay is not counted again."""

    def test_rank_events_to_xml(self) -> None:
        case = _canned_ranks()("test_grid")
        result = junit_result_class()(io.StringIO(), verbosity=0)
        case.run(result)
        [info] = result.reports
        report = info.report
        self.assertEqual([(p.params, p.status) for p in report.points],
                         [({"n": 1}, "passed"), ({"n": 2}, "failed")])
        self.assertEqual(report.message, "1 grid point(s) failed: (n=2)")
        with tempfile.TemporaryDirectory() as folder:
            result.generate_reports(xml_runner(folder))
            [path] = Path(folder).glob("TEST-*.xml")
            suite = ET.parse(path).getroot()
        [testcase] = suite.iter("testcase")
        self.assertEqual((testcase.get("name"), suite.get("failures")), ("test_grid", "1"))
        failure = testcase.find("failure")
        self.assertEqual(failure.get("message"), "1 grid point(s) failed: (n=2)")
        self.assertEqual(failure.get("type"), "AssertionError")
        self.assertTrue(failure.text.startswith(
            "grid point (n=2) failed:\nrank 1 failed this grid point:\nTraceback"), failure.text)
        self.assertIn("AssertionError: 2 != 1", failure.text)
        # unittest's own lists still see the replay (the text a plain runner prints)
        self.assertEqual(len(result.failures), 1)


class ReportsInXml(unittest.TestCase):
    def test_a_fixture_report_is_written_under_its_class(self) -> None:
        report = TestReport("pkg.mod.TestC.setUpClass", "pkg.mod", "error", "boom: no",
                            "Traceback\nboom: no", "RuntimeError")
        error = junit_cases(reports=(report,))["setUpClass"].find("error")
        self.assertEqual((error.get("type"), error.get("message")), ("RuntimeError", "boom: no"))
        self.assertIn("Traceback\nboom: no", error.text)


def _steps() -> type:
    """Three tests the tests below run (made here so that no loader collects them)."""

    class Steps(unittest.TestCase):
        def test_a(self) -> None:
            pass

        def test_b(self) -> None:
            self.fail("b failed")

        def test_c(self) -> None:
            self.skipTest("c skipped")

    return Steps




def xml_testcase_names(folder: Path) -> List[str]:
    return [
        case.get("name")
        for path in sorted(folder.glob("TEST-*.xml"))
        for case in ET.parse(path).getroot().iter("testcase")
    ]


class WrittenAsTestsFinish(unittest.TestCase):
    def setUp(self) -> None:
        folder = tempfile.TemporaryDirectory()
        self.addCleanup(folder.cleanup)
        self.folder = Path(folder.name)

    def test_each_finished_test_is_on_disk_before_the_next_starts(self) -> None:
        result = junit_result_class()(io.StringIO(), verbosity=0)
        result.write_each_test_to(str(self.folder / "xml"))
        steps, seen = _steps(), []
        for name in ("test_a", "test_b", "test_c"):
            steps(name).run(result)
            seen.append(xml_testcase_names(self.folder / "xml"))
        self.assertEqual(seen, [["test_a"], ["test_a", "test_b"], ["test_a", "test_b", "test_c"]])
        self.assertEqual(os.listdir(self.folder / "xml"), [f"TEST-{steps.__module__}.Steps.xml"])

    def test_the_closing_xml_is_xmlrunners_own(self) -> None:
        """The files written at the end equal, byte for byte, those xmlrunner itself writes."""
        from xmlrunner.result import _XMLTestResult

        result = junit_result_class()(io.StringIO(), verbosity=0)
        result.write_each_test_to(str(self.folder / "each"))
        steps = _steps()
        unittest.TestSuite([steps(n) for n in ("test_a", "test_b", "test_c")]).run(result)
        result.generate_reports(xml_runner(str(self.folder / "ours")))
        _XMLTestResult.generate_reports(result, xml_runner(str(self.folder / "xmlrunner")))
        written = {
            folder: {p.name: p.read_bytes() for p in (self.folder / folder).iterdir()}
            for folder in ("each", "ours", "xmlrunner")
        }
        self.assertEqual(written["ours"], written["xmlrunner"])
        self.assertEqual(written["each"], written["xmlrunner"])


SLOW_THIRD = """
import time
import unittest

from harness import run_tests


class TestSteps(unittest.TestCase):
    def test_1_passes(self):
        pass

    def test_2_fails(self):
        self.fail("as planned")

    def test_3_sleeps(self):
        time.sleep(600)


if __name__ == "__main__":
    run_tests()
"""


@pytest.mark.slow
class KilledRun(unittest.TestCase):
    """CI kills a run past its timeout with SIGKILL: the XML still has every finished test."""

    def test_a_file_run_by_run_tests(self) -> None:
        self.kill_after_two_tests(["test_steps.py", "--save-xml", "xml"])

    def test_python_m_harness(self) -> None:  # run_all.py's engine
        self.kill_after_two_tests(["-m", "harness", "test_steps.py", "--save-xml", "xml"])

    def kill_after_two_tests(self, args: List[str]) -> None:
        folder = Path(tempfile.mkdtemp())
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", str(folder)], check=True))
        (folder / "test_steps.py").write_text(textwrap.dedent(SLOW_THIRD))
        proc = subprocess.Popen(
            [sys.executable, *args], cwd=folder, env=child_env(),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.addCleanup(proc.wait)
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        deadline = time.monotonic() + WAIT_S
        while xml_testcase_names(folder / "xml") != ["test_1_passes", "test_2_fails"]:
            self.assertIsNone(proc.poll(), "the run ended before its third test")
            self.assertLess(time.monotonic(), deadline, "no XML for the first two tests")
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        [path] = (folder / "xml").glob("TEST-*.xml")
        cases = {case.get("name"): case for case in ET.parse(path).getroot().iter("testcase")}
        self.assertEqual(list(cases), ["test_1_passes", "test_2_fails"])
        self.assertIn("as planned", cases["test_2_fails"].find("failure").get("message"))


if __name__ == "__main__":
    unittest.main()
