"""harness.runner.records: one record per test, merged across ranks, grid points folded."""

from __future__ import annotations

import io
import unittest

from harness.runner.records import RunRecord, Tally, fold_grid_points, merge_ranks


class RunRecords(unittest.TestCase):
    def test_any_failing_rank_fails_the_test(self) -> None:
        ok = RunRecord("t", "s", grid_points=3, duration=1.0)
        bad = RunRecord("t", "s", "failed", "boom", "Traceback...\nboom", "AssertionError", 3, 2.0)
        merged = merge_ranks([ok, bad])
        self.assertEqual(merged.status, "failed")
        self.assertEqual(merged.message, "rank 1: boom")
        self.assertIn("--- rank 1 ---\nTraceback...", merged.detail)
        self.assertEqual((merged.grid_points, merged.duration), (3, 2.0))

    def test_skip_on_one_rank_skips_when_none_fails(self) -> None:
        merged = merge_ranks([RunRecord("t", "s"), RunRecord("t", "s", "skipped", "no gpu")])
        self.assertEqual((merged.status, merged.message), ("skipped", "no gpu"))
        self.assertEqual(merge_ranks([RunRecord("t", "s")] * 2).status, "passed")

    def test_record_round_trips_through_json(self) -> None:
        record = RunRecord("t", "s", "error", "m", "d", "ValueError", 4, 0.5)
        self.assertEqual(RunRecord.from_json(record.to_json()), record)

    def test_folded_grid_points_name_their_params(self) -> None:
        message, detail = fold_grid_points([("a=1", "tb1"), ("a=3", "tb3")], "main tb\nValueError")
        self.assertEqual(message, "2 grid point(s) failed: (a=1); (a=3); then: ValueError")
        self.assertEqual(detail, "grid point (a=1) failed:\ntb1\ngrid point (a=3) failed:\n"
                                 "tb3\nmain tb\nValueError")


def _cases() -> tuple:
    """Tests with known outcomes, for the tally (made here so that no runner collects them)."""

    class _Cases(unittest.TestCase):
        def test_pass(self) -> None:
            self.assertTrue(True)

        def test_fail(self) -> None:
            self.assertTrue(False)

        def test_grid(self) -> None:
            for value in (1, 2, 3):
                with self.subTest(value=value):
                    self.assertNotEqual(value, 2)  # one failing grid point: one failed test

        def test_skip_point(self) -> None:
            with self.subTest(value=1):
                self.skipTest("a skipped grid point does not skip the test")

        def test_skip(self) -> None:
            self.skipTest("skipped")

        @unittest.expectedFailure
        def test_expected_failure(self) -> None:
            self.assertTrue(False)

        def test_interrupted(self) -> None:
            raise KeyboardInterrupt

    class _BrokenFixture(unittest.TestCase):
        @classmethod
        def setUpClass(cls) -> None:
            raise ValueError("fixture broken")

        def test_never_runs(self) -> None:
            """setUpClass fails first."""

    return _Cases, _BrokenFixture


class TallyCounts(unittest.TestCase):
    def tally(self, *tests: unittest.TestCase) -> dict:
        result = type("Tallied", (Tally, unittest.TextTestResult), {})(io.StringIO(), True, 0)
        try:
            unittest.TestSuite(tests)(result)
        except KeyboardInterrupt:
            pass
        return result.tally

    def test_one_verdict_per_finished_test(self) -> None:
        cases, _ = _cases()
        names = ["test_pass", "test_fail", "test_grid", "test_skip_point", "test_skip",
                 "test_expected_failure"]
        counts = self.tally(*(cases(name) for name in names))
        self.assertEqual(counts, {"passed": 3, "failed": 2, "skipped": 1})

    def test_an_interrupted_test_has_no_verdict(self) -> None:
        cases, _ = _cases()
        counts = self.tally(cases("test_pass"), cases("test_interrupted"), cases("test_fail"))
        self.assertEqual(counts, {"passed": 1, "failed": 0, "skipped": 0})

    def test_a_broken_class_fixture_is_one_failure(self) -> None:
        _, broken = _cases()
        counts = self.tally(broken("test_never_runs"))
        self.assertEqual(counts, {"passed": 0, "failed": 1, "skipped": 0})


if __name__ == "__main__":
    unittest.main()
