"""harness.outcome.replay: a TestReport reported through unittest's API, for plain runners."""

from __future__ import annotations

import unittest
from typing import Any, Dict, List, Tuple

from harness.outcome.fold import fold
from harness.outcome.replay import RankError, rank_report, replay, replayed_report
from harness.outcome.report import Outcome, PointReport, RankReport, TestReport


class SubtestsSeen(unittest.TestResult):
    """A TestResult that keeps every subtest it is told of, passing ones included."""

    def __init__(self) -> None:
        super().__init__()
        self.points: List[Tuple[Dict[str, Any], Any]] = []

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802 - unittest's
        super().addSubTest(test, subtest, err)
        self.points.append((dict(subtest.params), err))


def failure(message: str) -> Outcome:
    return Outcome("failed", message, message, "AssertionError")


class Replay(unittest.TestCase):
    """replay inside a real case, executed by unittest through a TestResult."""

    def run_case(self, report: TestReport) -> Tuple[unittest.TestResult, unittest.TestCase]:
        class Supervised(unittest.TestCase):
            def test_body(self) -> None:
                replay(self, report)

        case = Supervised("test_body")
        result = SubtestsSeen()
        case.run(result)
        return result, case

    def test_pass(self) -> None:
        result, case = self.run_case(
            fold("t", [PointReport({"n": 1}, "passed")])
        )
        self.assertTrue(result.wasSuccessful())
        self.assertEqual((result.testsRun, result.skipped), (1, []))
        self.assertEqual(result.points, [({"n": 1}, None)])  # passing points are replayed too
        self.assertEqual(set(vars(case)) - set(vars(unittest.TestCase("run"))), set())

    def test_fail(self) -> None:
        result, case = self.run_case(fold("t", [], failure("rank 1 exited with code 3")))
        self.assertEqual(len(result.failures), 1)
        failed, text = result.failures[0]
        self.assertIs(failed, case)
        self.assertIn("AssertionError: rank 1 exited with code 3", text)
        self.assertNotIn("harness/outcome/replay.py", text)  # the harness's own frames are hidden

    def test_skip(self) -> None:
        result, case = self.run_case(fold("t", [], Outcome("skipped", "needs 8 GPUs")))
        self.assertEqual(result.skipped, [(case, "needs 8 GPUs")])
        self.assertEqual(result.failures, [])

    def test_failing_grid_point_is_a_subtest_failure_with_params(self) -> None:
        subtests = [
            PointReport({"n": 1}, "passed"),
            PointReport({"n": 2, "mode": "x"}, "failed", "rank 0 failed this grid point:\ntb"),
            PointReport({"n": 3}, "skipped", "not here"),
        ]
        result, case = self.run_case(fold("t", subtests, failure("rank 0 raised")))
        descriptions = [(str(test), text) for test, text in result.failures]
        self.assertEqual(len(descriptions), 2)
        sub_desc, sub_text = descriptions[0]
        self.assertTrue(sub_desc.endswith(" (n=2, mode='x')"), sub_desc)
        self.assertIn("AssertionError: rank 0 failed this grid point:\ntb", sub_text)
        self.assertEqual(descriptions[1][0], str(case))
        self.assertIn("AssertionError: rank 0 raised", descriptions[1][1])
        (skipped_test, reason), = result.skipped
        self.assertTrue(str(skipped_test).endswith(" (n=3)"))
        self.assertEqual(reason, "not here")

    def test_an_error_is_a_rank_error(self) -> None:
        report = fold("t", [], Outcome("error", "rank 0 raised", "rank 0 raised: x", "RankError"))
        result, _ = self.run_case(report)
        self.assertEqual(result.failures, [])
        self.assertIn(f"{RankError.__name__}: rank 0 raised: x", result.errors[0][1])

    def test_replayed_exceptions_carry_the_report_and_its_lead(self) -> None:
        lead = RankReport("rank 1", "ValueError: x", [], [])
        report = fold("t", [], Outcome("failed", "rank 1 raised", "rank 1 raised", "", lead))
        seen: List[BaseException] = []

        class Supervised(unittest.TestCase):
            def test_body(self) -> None:
                try:
                    replay(self, report)
                except AssertionError as error:
                    seen.append(error)

        Supervised("test_body").run(unittest.TestResult())
        self.assertIs(replayed_report(seen[0]), report)
        self.assertIs(rank_report(seen[0]), lead)
        self.assertIsNone(rank_report(ValueError("plain")))
        self.assertIsNone(replayed_report(ValueError("plain")))


if __name__ == "__main__":
    unittest.main()
