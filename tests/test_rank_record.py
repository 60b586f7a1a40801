"""harness.outcome.rank_record: what a rank reports, and the record that carries it between modes.

Events and records are built by hand (no rank is started): the record's rules, its JSON round
trip (torchrun's ranks exchange it), and the result that turns unittest's callbacks into
events for any sink.
"""

from __future__ import annotations

import enum
import pickle
import sys
import unittest

from harness.outcome.collective_trace import CollectiveCall
from harness.outcome.rank_record import (
    Event,
    FixtureError,
    RankRecord,
    RecordSink,
    ReportingResult,
    picklable_params,
)
from harness.outcome.report import Shown
from harness.requirements.decorators import TEST_SKIPS
from tests.fixtures.events import rank_failure


def done(rank: int, *events: Event) -> RankRecord:
    return RankRecord(rank=rank, events=[*events, Event(kind="done")], exitcode=0)


class RankRecordRules(unittest.TestCase):
    def test_no_exit_code_yet_is_not_a_problem(self) -> None:
        self.assertEqual(RankRecord(rank=0).problems(), [])
        self.assertFalse(RankRecord(rank=0).failed)

    def test_finished_and_grid_points_come_from_done_events(self) -> None:
        record = RankRecord(rank=0, events=[Event("done", count=2), Event("done", count=4)])
        self.assertEqual((record.finished, record.grid_points), (True, 4))
        self.assertEqual((RankRecord(rank=0).finished, RankRecord(rank=0).grid_points), (False, 0))

    def test_skip_event_wins_over_exit_code(self) -> None:
        record = RankRecord(
            rank=0, events=[Event("skip", text="why")], exitcode=TEST_SKIPS["nccl"].exit_code
        )
        self.assertEqual(record.skip_reason(), "why")
        self.assertIsNone(done(0).skip_reason())


class Picklable(unittest.TestCase):
    def test_unpicklable_values_become_their_repr(self) -> None:
        fn = lambda: None  # noqa: E731 (a lambda is what cannot be pickled)
        safe = picklable_params({"n": 3, "fn": fn})
        self.assertEqual(safe["n"], 3)
        self.assertIsInstance(safe["fn"], Shown)
        self.assertEqual(repr(safe["fn"]), repr(fn))
        self.assertEqual(pickle.loads(pickle.dumps(safe)), {"n": 3, "fn": repr(fn)})


class Colour(enum.Enum):
    RED = 1


class JsonRoundTrip(unittest.TestCase):
    def test_every_field_survives(self) -> None:
        record = RankRecord(
            rank=1, pid=42, exitcode=-11, stopped=True, output="out\n", stack="stack",
            events=[Event("success"), rank_failure("tb"), Event("done", count=3)],
            collectives=[
                CollectiveCall("all_reduce", "the default group", 7, ("float32[4]",), False),
                CollectiveCall("barrier", "group 1", 2, (), True),
            ],
            problem_at=12.5, duration=0.25,
        )
        self.assertEqual(RankRecord.from_json(record.to_json()), record)

    def test_unset_fields_survive(self) -> None:
        record = RankRecord(rank=0)
        back = RankRecord.from_json(record.to_json())
        self.assertEqual(back, record)
        self.assertIsNone(back.collectives)
        self.assertEqual(back.problem_at, float("inf"))

    def test_params_json_cannot_carry_come_back_as_their_repr(self) -> None:
        params = {
            "n": 3, "x": 0.5, "s": "a", "b": True, "none": None, "pair": (1, 2),
            "colour": Colour.RED, "fn": len,
        }
        record = RankRecord(rank=0, events=[Event("subtest", "", params, "pass")])
        back = RankRecord.from_json(record.to_json()).events[0].params
        assert back is not None
        self.assertEqual(
            {k: back[k] for k in ("n", "x", "s", "b", "none")},
            {"n": 3, "x": 0.5, "s": "a", "b": True, "none": None},
        )
        self.assertIs(type(back["b"]), bool)
        for name in ("pair", "colour", "fn"):
            self.assertIsInstance(back[name], Shown)
            self.assertEqual(repr(back[name]), repr(params[name]))

    def test_shown_values_stay_shown(self) -> None:
        event = Event("subtest", "", {"fn": Shown("<lambda>")}, "fail")
        back = RankRecord.from_json(RankRecord(rank=0, events=[event]).to_json())
        self.assertEqual(back.events, [event])
        self.assertEqual(repr(back.events[0].params["fn"]), "<lambda>")  # type: ignore[index]


class Reporting(unittest.TestCase):
    """ReportingResult sends unittest's callbacks, as events, to a RecordSink."""

    def run_case(self, body: object) -> RankRecord:
        case_type = type("Case", (unittest.TestCase,), {"test_body": body})
        record = RankRecord(rank=0)
        result = ReportingResult(RecordSink(record))
        case_type("test_body").run(result)
        return record

    def test_pass(self) -> None:
        self.assertEqual(self.run_case(lambda self: None).events, [Event("success")])

    def test_failure_carries_the_traceback_and_when(self) -> None:
        def body(case: unittest.TestCase) -> None:
            raise ValueError("boom")

        record = self.run_case(body)
        self.assertEqual([e.kind for e in record.events], ["failure"])
        self.assertIn("ValueError: boom", record.events[0].text)
        self.assertLess(record.problem_at, float("inf"))

    def test_a_set_up_error_is_its_cause_in_phase_setup(self) -> None:
        def body(case: unittest.TestCase) -> None:
            try:
                raise ValueError("no data")
            except ValueError as error:
                raise FixtureError("setup", "setup of test_x failed") from error

        event, = self.run_case(body).events
        self.assertEqual((event.kind, event.status, event.failure.phase),
                         ("failure", "error", "setup"))
        self.assertTrue(event.text.rstrip().endswith("ValueError: no data"), event.text)
        self.assertNotIn("FixtureError", event.text)  # the cause is the report, not its wrapper
        self.assertEqual(self.run_case(lambda self: 1 / 0).events[0].failure.phase, "")

    def test_exit_with_a_skip_code_is_a_skip(self) -> None:
        def body(case: unittest.TestCase) -> None:
            sys.exit(TEST_SKIPS["multi-gpu-2"].exit_code)

        record = self.run_case(body)
        self.assertEqual(record.events, [Event("skip", TEST_SKIPS["multi-gpu-2"].message)])

    def test_grid_points_are_subtest_events(self) -> None:
        def body(case: unittest.TestCase) -> None:
            for n in (1, 2):
                with case.subTest(n=n):
                    case.assertEqual(n, 1)

        events = self.run_case(body).events
        self.assertEqual([(e.kind, e.params, e.status) for e in events[:2]],
                         [("subtest", {"n": 1}, "pass"), ("subtest", {"n": 2}, "fail")])
        self.assertEqual(len(events), 2)  # a test with a failing point reports no success

    def test_sink_of_a_stopped_rank_keeps_only_done(self) -> None:
        record = RankRecord(rank=0, stopped=True)
        sink = RecordSink(record)
        sink.send(rank_failure("fallout"))
        sink.send(Event("done"))
        self.assertEqual(record.events, [Event("done")])
        self.assertFalse(sink.failed)
