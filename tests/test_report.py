"""harness.outcome.report: the one per-test record, and its JSON form (a -j worker sends it)."""

from __future__ import annotations

import enum
import json
import unittest

from harness.outcome.report import (
    Outcome,
    PointReport,
    RankReport,
    Shown,
    TestReport,
    params_from_json,
    params_text,
    params_to_json,
)
from harness.outcome.stacks import Frame


class Colour(enum.Enum):
    RED = 1


LEAD = RankReport("rank 1", "ValueError: x", [Frame("/u/t.py", 7, "test_x")],
                  [("rank 0 raised as a consequence", "tb0")], hang=False, phase="setup")


class JsonRoundTrip(unittest.TestCase):
    def test_every_field_survives(self) -> None:
        report = TestReport(
            "mod.C.test_x", "mod", "failed", "1 grid point(s) failed: (n=2)",
            "grid point (n=2) failed:\nrank 1 ...", "AssertionError", 1.25,
            points=[PointReport({"n": 1}, "passed"),
                    PointReport({"n": 2}, "failed", "rank 1 ...", "AssertionError", LEAD),
                    PointReport({"n": 3}, "skipped", "not here")],
            lead=LEAD, own=Outcome("failed", "rank 1 raised", "rank 1 raised: x", "", LEAD),
        )
        text = report.to_json()
        self.assertEqual(len(text.splitlines()), 1)  # one line: a worker's message
        self.assertEqual(TestReport.from_json(text), report)
        self.assertEqual(TestReport.from_data(json.loads(text)), report)

    def test_a_plain_report_survives(self) -> None:
        report = TestReport("mod.C.test_y")
        self.assertEqual(TestReport.from_json(report.to_json()), report)

    def test_params_json_cannot_carry_come_back_as_their_repr(self) -> None:
        params = {
            "n": 3, "x": 0.5, "s": "a", "b": True, "none": None, "pair": (1, 2),
            "colour": Colour.RED, "fn": len, "obj": object(),
        }
        report = TestReport("t", points=[PointReport(params, "failed", "tb", "KeyError")])
        back = TestReport.from_json(report.to_json()).points[0].params
        self.assertEqual(
            {k: back[k] for k in ("n", "x", "s", "b", "none")},
            {"n": 3, "x": 0.5, "s": "a", "b": True, "none": None},
        )
        self.assertIs(type(back["b"]), bool)
        for name in ("pair", "colour", "fn", "obj"):
            self.assertIsInstance(back[name], Shown)
            self.assertEqual(repr(back[name]), repr(params[name]))
        # the point is named the same on both sides of the pipe
        self.assertEqual(params_text(back), params_text(params))

    def test_shown_values_stay_shown(self) -> None:
        back = params_from_json(json.loads(json.dumps(params_to_json({"fn": Shown("<fn>")}))))
        self.assertIsInstance(back["fn"], Shown)
        self.assertEqual(repr(back["fn"]), "<fn>")


class Fields(unittest.TestCase):
    def test_failed_and_grid_points(self) -> None:
        points = [PointReport({"a": 1}, "passed"), PointReport({"a": 2}, "skipped", "no")]
        self.assertEqual(TestReport("t", points=points).grid_points, 2)
        self.assertTrue(TestReport("t", status="failed").failed)
        self.assertTrue(TestReport("t", status="error").failed)
        self.assertFalse(TestReport("t", status="skipped").failed)

    def test_params_text_names_a_point(self) -> None:
        self.assertEqual(params_text({"a": 1, "b": "x"}), "a=1, b='x'")


if __name__ == "__main__":
    unittest.main()
