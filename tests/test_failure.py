"""harness.outcome.failure: a rank's exception as data, read from the live exception only."""

from __future__ import annotations

import builtins
import json
import sys
import unittest

from harness.outcome.failure import Failure
from harness.outcome.merge import decide
from harness.outcome.rank_record import Event, RankRecord, raised_event


class Mine(ValueError):
    pass


def caught(fn) -> Failure:  # type: ignore[no-untyped-def]
    try:
        fn()
    except BaseException:
        return Failure.from_exc_info(sys.exc_info())
    raise AssertionError("nothing raised")


def raise_mine() -> None:
    raise Mine("boom")


def chained() -> None:
    """Fails because a peer left: its cause says so."""
    try:
        raise RuntimeError("Connection closed by peer")
    except RuntimeError as error:
        raise ValueError("collective failed") from error


def event_of(fn) -> Event:  # type: ignore[no-untyped-def]
    """The event a rank sends when `fn` raises there."""
    try:
        fn()
    except BaseException:
        return raised_event(sys.exc_info())
    raise AssertionError("nothing raised")


class FromTheLiveException(unittest.TestCase):
    def test_class_message_and_frames(self) -> None:
        failure = caught(raise_mine)
        self.assertEqual((failure.exc_module, failure.exc_qualname), (__name__, "Mine"))
        self.assertEqual(failure.exception, f"{__name__}.Mine: boom")
        self.assertFalse(failure.is_assertion)
        last = failure.frames[-1]
        self.assertEqual((last.filename, last.name, last.line), (__file__, "raise_mine",
                                                                 'raise Mine("boom")'))
        self.assertIn("Mine: boom", failure.text)

    def test_a_message_that_looks_like_a_traceback_adds_no_frame(self) -> None:
        fake = 'Traceback (most recent call last):\n  File "/elsewhere.py", line 1, in f\nX: y'

        def raise_fake() -> None:
            raise AssertionError(fake)

        failure = caught(raise_fake)
        self.assertTrue(failure.is_assertion)
        self.assertNotIn("/elsewhere.py", [f.filename for f in failure.frames])
        self.assertEqual(failure.frames[-1].name, "raise_fake")

    def test_every_message_of_the_chain(self) -> None:
        failure = caught(chained)
        self.assertEqual(failure.messages,
                         ("ValueError: collective failed",
                          "RuntimeError: Connection closed by peer"))

    def test_crosses_as_json(self) -> None:
        failure = caught(raise_mine)
        self.assertEqual(Failure.from_data(json.loads(json.dumps(failure.to_data()))), failure)


class MergedFromData(unittest.TestCase):
    def test_lead_names_the_class_and_the_raising_frame(self) -> None:
        record = RankRecord(1, events=[event_of(raise_mine), Event("done")], exitcode=0)
        lead = decide([RankRecord(0, events=[Event("done")], exitcode=0), record], None).lead
        assert lead is not None
        self.assertEqual(lead.exc_class, (__name__, "Mine"))
        self.assertEqual(lead.message, f"{__name__}.Mine: boom")
        self.assertEqual(lead.frames[-1].name, "raise_mine")

    def test_a_peer_leaving_in_a_cause_is_a_consequence(self) -> None:
        consequence, cause = event_of(chained), event_of(raise_mine)
        records = [RankRecord(0, events=[consequence, Event("done")], exitcode=0, problem_at=1.0),
                   RankRecord(1, events=[cause, Event("done")], exitcode=0, problem_at=2.0)]
        self.assertEqual(decide(records, None).lead.label, "rank 1")


class ExceptionLines(unittest.TestCase):
    def test_a_syntax_error_is_its_own_line_not_its_location(self) -> None:
        failure = caught(lambda: compile("x = (", "<cfg>", "exec"))
        self.assertEqual(failure.exception, "SyntaxError: '(' was never closed")

    @unittest.skipIf(sys.version_info < (3, 11), "exception groups are Python 3.11's")
    def test_a_group_holds_its_exceptions_messages(self) -> None:
        group = builtins.ExceptionGroup

        def grouped() -> None:
            raise group("two", [ValueError("a"), RuntimeError("Connection closed by peer")])

        failure = caught(grouped)
        self.assertEqual(failure.exception, "ExceptionGroup: two (2 sub-exceptions)")
        self.assertIn("RuntimeError: Connection closed by peer", failure.messages)

    def test_a_multi_line_message_keeps_every_line(self) -> None:
        def explained() -> None:
            raise AssertionError("assert 1 == 2\n    where 1 = f()")

        self.assertEqual(caught(explained).exception,
                         "AssertionError: assert 1 == 2\n    where 1 = f()")
