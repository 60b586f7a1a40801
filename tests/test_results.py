"""harness.runner.results: one TestReport per test (grid points folded), the tally."""

from __future__ import annotations

import io
import unittest

from harness.outcome.report import TestReport
from harness.runner.results import Collector, Tally


def _grid_cases() -> type:
    """Tests with grid points (made here so that no runner collects them)."""

    class _Grid(unittest.TestCase):
        def points(self, failing: tuple, skipping: tuple = ()) -> None:
            for value in (1, 2, 3):
                with self.subTest(value=value):
                    if value in skipping:
                        self.skipTest(f"point {value} skips")
                    self.assertNotIn(value, failing, f"point {value} fails")

        def test_one_failing_point(self) -> None:
            self.points(failing=(2,))

        def test_two_failing_points(self) -> None:
            self.points(failing=(1, 3))

        def test_failure_after_a_point(self) -> None:
            self.points(failing=(3,))
            raise ValueError("then the test itself")

        def test_skipped_points(self) -> None:
            self.points(failing=(), skipping=(1, 3))

        def test_every_point_skipped(self) -> None:
            self.points(failing=(), skipping=(1, 2, 3))

        def test_skipped_after_points(self) -> None:
            self.points(failing=())
            self.skipTest("skipped after its points")

        def test_error_point(self) -> None:
            with self.subTest(name="x"):
                raise KeyError("k")

    return _Grid


def collect(test: unittest.TestCase) -> TestReport:
    """The Collector's one report for `test`."""
    records = []
    collector = Collector(lambda test: None, lambda test, record: records.append(record))
    test.run(collector)
    assert len(records) == 1, records
    return records[0]


class Folding(unittest.TestCase):
    """The fold through the Collector: one report per test, failing grid points listed."""

    def test_one_failing_point_fails_the_test_naming_it(self) -> None:
        record = collect(_grid_cases()("test_one_failing_point"))
        self.assertEqual((record.status, record.grid_points), ("failed", 3))
        self.assertEqual(record.message, "1 grid point(s) failed: (value=2)")
        self.assertIn("grid point (value=2) failed:\nTraceback", record.detail)
        self.assertIn("point 2 fails", record.detail)
        self.assertEqual(record.exc_type, "AssertionError")

    def test_several_failing_points_are_one_failure(self) -> None:
        record = collect(_grid_cases()("test_two_failing_points"))
        self.assertEqual(record.message, "2 grid point(s) failed: (value=1); (value=3)")
        self.assertEqual(record.detail.count("grid point (value="), 2)

    def test_a_failure_after_the_points_ends_the_message(self) -> None:
        record = collect(_grid_cases()("test_failure_after_a_point"))
        self.assertEqual(record.status, "failed")
        self.assertEqual(record.message, "1 grid point(s) failed: (value=3); "
                                         "then: ValueError: then the test itself")
        self.assertTrue(record.detail.rstrip().endswith("ValueError: then the test itself"))

    def test_skipped_points_count_and_do_not_skip_the_test(self) -> None:
        record = collect(_grid_cases()("test_skipped_points"))
        self.assertEqual((record.status, record.grid_points), ("passed", 3))

    def test_a_test_whose_every_point_skipped_is_skipped_with_the_first_reason(self) -> None:
        record = collect(_grid_cases()("test_every_point_skipped"))
        self.assertEqual((record.status, record.message), ("skipped", "point 1 skips"))
        self.assertEqual(record.grid_points, 3)

    def test_a_test_that_skips_after_its_points_is_skipped(self) -> None:
        record = collect(_grid_cases()("test_skipped_after_points"))
        self.assertEqual((record.status, record.message), ("skipped", "skipped after its points"))
        self.assertEqual(record.grid_points, 3)

    def test_the_first_failing_point_names_the_type(self) -> None:
        record = collect(_grid_cases()("test_error_point"))
        self.assertEqual((record.status, record.exc_type), ("failed", "KeyError"))
        self.assertEqual(record.message, "1 grid point(s) failed: (name='x')")


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
            for value in (1, 2):
                with self.subTest(value=value):
                    if value == 2:
                        self.skipTest("one skipped grid point does not skip the test")

        def test_skip_every_point(self) -> None:
            for value in (1, 2):
                with self.subTest(value=value):
                    self.skipTest("every grid point skipped: the test tested nothing")

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
                 "test_skip_every_point", "test_expected_failure"]
        counts = self.tally(*(cases(name) for name in names))
        self.assertEqual(counts, {"passed": 3, "failed": 2, "skipped": 2})

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
