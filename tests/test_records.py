"""harness.records: one record per test, merged across ranks, grid points folded."""

from __future__ import annotations

import unittest

from harness.records import RunRecord, fold_grid_points, merge_ranks


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


if __name__ == "__main__":
    unittest.main()
