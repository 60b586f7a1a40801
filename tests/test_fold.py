"""harness.outcome.fold: the grid-point fold rule, the reports built from unittest's events,
and the result mixin that takes a test's own report instead of folding its replay."""

from __future__ import annotations

import gc
import sys
import unittest
from typing import Any, List, Tuple

from harness.outcome.fold import (
    OneReportPerTest,
    ReportBuilder,
    ReportReceiver,
    fixture_report,
    fold,
    hand_report,
    with_own_problem,
)
from harness.outcome.replay import replay
from harness.outcome.report import Outcome, PointReport, RankReport, TestReport


def point(status: str, text: str = "", **params: Any) -> PointReport:
    return PointReport(params, status, text, "AssertionError" if status == "failed" else "")


class FoldRule(unittest.TestCase):
    def test_failing_points_fail_the_test_naming_each(self) -> None:
        report = fold("t", [point("passed", a=0), point("failed", "tb1", a=1),
                            point("failed", "tb3", a=3)])
        self.assertEqual((report.status, report.grid_points), ("failed", 3))
        self.assertEqual(report.message, "2 grid point(s) failed: (a=1); (a=3)")
        self.assertEqual(report.detail, "grid point (a=1) failed:\ntb1\ngrid point (a=3) failed:\n"
                                        "tb3")
        self.assertEqual(report.exc_type, "AssertionError")

    def test_the_tests_own_problem_follows_its_points(self) -> None:
        own = Outcome("error", "ValueError", "main tb\nValueError", "ValueError")
        report = fold("t", [point("failed", "tb1", a=1), point("failed", "tb3", a=3)], own)
        self.assertEqual(report.message, "2 grid point(s) failed: (a=1); (a=3); then: ValueError")
        self.assertEqual(report.detail, "grid point (a=1) failed:\ntb1\ngrid point (a=3) failed:\n"
                                        "tb3\nmain tb\nValueError")
        self.assertEqual((report.status, report.exc_type), ("failed", "AssertionError"))
        self.assertEqual(report.own, own)

    def test_every_point_skipped_skips_with_the_first_reason(self) -> None:
        report = fold("t", [point("skipped", "first", a=1), point("skipped", "second", a=2)])
        self.assertEqual((report.status, report.message), ("skipped", "first"))

    def test_some_points_skipped_is_a_pass(self) -> None:
        report = fold("t", [point("skipped", "no", a=1), point("passed", a=2)])
        self.assertEqual(report.status, "passed")

    def test_the_tests_own_outcome_without_failing_points(self) -> None:
        error = Outcome("error", "KeyError: 'k'", "tb\nKeyError: 'k'", "KeyError")
        report = fold("t", [point("passed", a=1)], error)
        self.assertEqual((report.status, report.message, report.detail, report.exc_type),
                         ("error", "KeyError: 'k'", "tb\nKeyError: 'k'", "KeyError"))
        skipped = fold("t", [point("passed", a=1)], Outcome("skipped", "why"))
        self.assertEqual((skipped.status, skipped.message), ("skipped", "why"))

    def test_the_first_failing_points_lead_leads(self) -> None:
        lead = RankReport("rank 1", "AssertionError: p", [], [])
        failing = PointReport({"a": 1}, "failed", "tb", "AssertionError", lead)
        self.assertIs(fold("t", [failing]).lead, lead)

    def test_a_later_problem_keeps_the_first_and_adds_its_text(self) -> None:
        first = fold("t", [], Outcome("failed", "rank 0 raised", "rank 0 raised: x", "AE"))
        both = with_own_problem(first, Outcome("error", "E: td", "tb\nE: td", "E"))
        self.assertEqual((both.status, both.message, both.exc_type),
                         ("failed", "rank 0 raised", "AE"))
        self.assertEqual(both.detail, "rank 0 raised: x\ntb\nE: td")
        passed = with_own_problem(fold("t", []), Outcome("failed", "exit 3", "exit 3", "AE"))
        self.assertEqual((passed.status, passed.message), ("failed", "exit 3"))


class Builder(unittest.TestCase):
    def test_a_skip_from_another_test_is_a_grid_points(self) -> None:
        test = unittest.FunctionTestCase(lambda: None)
        builder = ReportBuilder(test)
        builder.skipped(type("SubTest", (), {"params": {"a": 1}})(), "point skips")
        builder.skipped(test, "the test skips")
        report = builder.report()
        self.assertEqual(report.points, [PointReport({"a": 1}, "skipped", "point skips")])
        self.assertEqual((report.status, report.message), ("skipped", "the test skips"))

    def test_a_fixtures_report_is_named_like_a_test(self) -> None:
        report = fixture_report("setUpClass (pkg.mod.TestC)", "error", "E: x", "tb", "E", "pkg")
        self.assertEqual((report.test_id, report.status, report.suite),
                         ("pkg.mod.TestC.setUpClass", "error", "pkg"))


class Reports(OneReportPerTest, unittest.TestResult):
    """The mixin on unittest's plain result, keeping every report it is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.reports: List[Tuple[Any, TestReport]] = []

    def report_done(self, test: Any, report: TestReport) -> None:
        self.reports.append((test, report))


def run(*tests: unittest.TestCase) -> Reports:
    result = Reports()
    unittest.TestSuite(tests).run(result)
    return result


def _cases() -> type:
    """Tests for the mixin (made here so that no runner collects them)."""
    given = fold("", [PointReport({"n": 1}, "passed"),
                      PointReport({"n": 2}, "failed", "rank 0 failed this grid point:\ntb",
                                  "AssertionError")],
                 Outcome("error", "rank 1 raised", "rank 1 raised: ValueError", "RankError"))

    class Cases(unittest.TestCase):
        given_report = given

        def run(self, result: Any = None) -> Any:
            self.result = result
            return super().run(result)

        def test_points(self) -> None:
            for n in (1, 2, 3):
                with self.subTest(n=n):
                    if n == 3:
                        self.skipTest("three skips")
                    self.assertEqual(n, 1)

        def test_hands_its_report(self) -> None:
            hand_report(self.result, self, given)
            replay(self, given)

        def test_hands_a_passing_report_then_tear_down_fails(self) -> None:
            report = fold("", [PointReport({"n": 1}, "passed")])
            hand_report(self.result, self, report)
            replay(self, report)

        def test_interrupted(self) -> None:
            raise KeyboardInterrupt

        def tearDown(self) -> None:
            if self._testMethodName == "test_hands_a_passing_report_then_tear_down_fails":
                raise OSError("tearDown broke")

    return Cases


class Mixin(unittest.TestCase):
    def test_a_plain_test_is_folded_from_its_events(self) -> None:
        cases = _cases()
        [(test, report)] = run(cases("test_points")).reports
        self.assertEqual(report.test_id, test.id())
        self.assertEqual([(p.params, p.status) for p in report.points],
                         [({"n": 1}, "passed"), ({"n": 2}, "failed"), ({"n": 3}, "skipped")])
        self.assertEqual(report.message, "1 grid point(s) failed: (n=2)")
        self.assertIn("AssertionError: 2 != 1", report.detail)
        self.assertGreater(report.duration, 0.0)

    def test_a_handed_report_is_taken_and_its_replay_not_folded_again(self) -> None:
        cases = _cases()
        self.assertIsInstance(Reports(), ReportReceiver)
        result = run(cases("test_hands_its_report"))
        [(test, report)] = result.reports
        given = cases.given_report
        self.assertEqual(report.points, given.points)  # not twice
        self.assertEqual((report.status, report.message, report.detail),
                         (given.status, given.message, given.detail))
        self.assertEqual(report.test_id, test.id())
        # plain unittest still sees the replay
        self.assertEqual((len(result.failures), len(result.errors)), (1, 1))
        self.assertIn("RankError: rank 1 raised: ValueError", result.errors[0][1])

    def test_a_problem_after_the_handed_report_is_added(self) -> None:
        cases = _cases()
        [(_, report)] = run(cases("test_hands_a_passing_report_then_tear_down_fails")).reports
        self.assertEqual((report.status, report.exc_type), ("error", "OSError"))
        self.assertEqual(report.grid_points, 1)
        self.assertIn("OSError: tearDown broke", report.detail)

    def test_an_interrupted_test_has_no_report(self) -> None:
        cases = _cases()
        result = Reports()
        with self.assertRaises(KeyboardInterrupt):
            cases("test_interrupted").run(result)
        self.assertEqual(result.reports, [])

    def test_an_interruption_as_a_test_part_ends_adds_no_failure_later(self) -> None:
        # Ctrl-C landing in the context manager's __exit__ of unittest's testPartExecutor:
        # its generator is closed when the interruption is dropped, adding GeneratorExit as
        # an error of the test that already stopped (run_all once counted it as a failure).
        cases = _cases()
        result = Reports()

        def interrupt_at_exit(frame: Any, event: str, arg: Any) -> Any:
            gen = frame.f_locals.get("self") if frame.f_code.co_name == "__exit__" else None
            if event == "call" and getattr(getattr(gen, "gen", None), "__name__", "") == (
                "testPartExecutor"
            ):
                sys.settrace(None)
                raise KeyboardInterrupt
            return None

        def run_interrupted() -> None:
            sys.settrace(interrupt_at_exit)
            try:
                cases("test_points").run(result)
            finally:
                sys.settrace(None)

        with self.assertRaises(KeyboardInterrupt):
            run_interrupted()
        gc.collect()
        self.assertEqual(result.reports, [])

    def test_a_result_that_takes_no_report_sees_only_the_replay(self) -> None:
        cases = _cases()
        result = unittest.TestResult()
        self.assertNotIsInstance(result, ReportReceiver)
        cases("test_hands_its_report").run(result)
        self.assertEqual((len(result.failures), len(result.errors)), (1, 1))


if __name__ == "__main__":
    unittest.main()
