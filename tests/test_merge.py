"""harness.outcome.merge: every rank's record, turned into one outcome by docs/design.md's rules.

Records and events are built by hand, so each rule (pass, raise, signal, exit code, skip,
timeout, failing grid point) is checked without starting a process.
"""

from __future__ import annotations

import unittest
from typing import Any, Dict

from harness.outcome.collective_trace import CollectiveCall
from harness.outcome.merge import OUTPUT_TAIL_LINES, decide, merge_subtests, output_section
from harness.outcome.rank_record import Event, RankRecord, signal_name
from harness.outcome.report import Outcome, PointReport, RankReport, TestReport
from harness.outcome.stacks import Frame
from harness.requirements.decorators import TEST_SKIPS
from tests.fixtures.events import rank_failure

TRACEBACK = 'Traceback (most recent call last):\n  File "t.py", line 3\nAssertionError: boom\n'


def done(rank: int, *events: Event, count: int = 0, **fields: Any) -> RankRecord:
    """A rank that ran to the end of its test and exited 0."""
    fields.setdefault("exitcode", 0)
    return RankRecord(rank=rank, events=[*events, Event(kind="done", count=count)], **fields)


def point(params: Dict[str, Any], status: str, text: str = "") -> Event:
    if status == "fail":
        return rank_failure(text, "subtest", status, params)
    return Event(kind="subtest", params=params, status=status, text=text)


class Decide(unittest.TestCase):
    def test_all_ranks_pass(self) -> None:
        records = [done(r, Event(kind="success"), count=2) for r in range(3)]
        verdict = decide(records, None)
        self.assertEqual(verdict, TestReport("", own=Outcome("passed")))

    def test_rank_that_raises_fails_with_its_traceback(self) -> None:
        records = [done(0, Event(kind="success")), done(1, rank_failure(text=TRACEBACK))]
        verdict = decide(records, None)
        self.assertEqual(verdict.own.status, "failed")
        head, body = verdict.own.detail.split("\n\n", 1)
        self.assertEqual(head, "rank 1 raised: AssertionError: boom")
        self.assertEqual(body, "rank 1 raised:\n" + TRACEBACK.rstrip())
        self.assertNotIn("rank 0", verdict.own.detail)

    def test_expected_failure_event_counts_as_raised(self) -> None:
        records = [done(0, rank_failure(kind="expected_failure", text="Traceback\nValueError: x"))]
        self.assertEqual(
            decide(records, None).own.detail.splitlines()[0], "rank 0 raised: ValueError: x"
        )

    def test_rank_killed_by_signal_names_rank_and_signal(self) -> None:
        records = [done(0, Event(kind="success")), RankRecord(rank=1, exitcode=-11)]
        verdict = decide(records, None)
        self.assertEqual(verdict.own.status, "failed")
        self.assertEqual(verdict.own.detail.splitlines()[0], "rank 1 died by signal SIGSEGV")

    def test_unexpected_exit_code_names_rank_and_code(self) -> None:
        verdict = decide([done(0), RankRecord(rank=1, exitcode=3)], None)
        self.assertEqual(verdict.own.status, "failed")
        self.assertEqual(verdict.own.detail.splitlines()[0], "rank 1 exited with code 3")

    def test_exit_0_before_the_test_finished_is_a_failure(self) -> None:
        verdict = decide([RankRecord(rank=0, exitcode=0)], None)
        self.assertEqual(verdict.own.status, "failed")
        self.assertEqual(
            verdict.own.detail.splitlines()[0], "rank 0 exited with code 0 before its test finished"
        )

    def test_every_problem_of_every_rank_is_in_the_head(self) -> None:
        records = [
            done(0, rank_failure(text=TRACEBACK), exitcode=-6),
            RankRecord(rank=1, exitcode=2),
        ]
        head = decide(records, None).own.detail.split("\n\n")[0]
        self.assertEqual(
            head,
            "rank 0 raised: AssertionError: boom; rank 0 died by signal SIGABRT; "
            "rank 1 exited with code 2",
        )

    def test_first_rank_seen_failing_comes_first(self) -> None:
        records = [
            RankRecord(rank=0, exitcode=5, problem_at=2.0),
            RankRecord(rank=1, exitcode=-11, problem_at=1.0),
        ]
        head = decide(records, None).own.detail.split("\n\n")[0]
        self.assertEqual(head, "rank 1 died by signal SIGSEGV; rank 0 exited with code 5")

    def test_fail_fast_stopped_ranks_show_their_stack(self) -> None:
        records = [
            RankRecord(rank=0, exitcode=4),
            RankRecord(rank=1, exitcode=-9, stopped=True, stack="File b.py, in wait"),
            RankRecord(rank=2, exitcode=-9, stopped=True),
        ]
        verdict = decide(records, None)
        self.assertEqual(verdict.own.detail.split("\n\n")[0], "rank 0 exited with code 4")
        self.assertIn(
            "rank 1 was still running and was stopped; its stack then:\nFile b.py, in wait\n\n"
            "rank 2 was still running and was stopped; its stack then:\n"
            "(no stack: the rank did not answer the dump signal)",
            verdict.own.detail,
        )
        self.assertNotIn("SIGKILL", verdict.own.detail)

    def test_skip_test_on_one_rank_skips_with_its_reason(self) -> None:
        records = [done(0, Event(kind="success")), done(1, Event(kind="skip", text="needs 8 GPUs"))]
        self.assertEqual(
            decide(records, None),
            TestReport("", status="skipped", message="needs 8 GPUs",
                       own=Outcome("skipped", "needs 8 GPUs")),
        )

    def test_test_skips_exit_code_skips_with_its_message(self) -> None:
        skip = TEST_SKIPS["small_worldsize"]
        records = [RankRecord(rank=0, exitcode=skip.exit_code), done(1)]
        verdict = decide(records, None)
        self.assertEqual((verdict.status, verdict.message), ("skipped", skip.message))

    def test_a_failing_rank_beats_a_skipping_rank(self) -> None:
        records = [
            RankRecord(rank=0, exitcode=TEST_SKIPS["generic"].exit_code),
            done(1, rank_failure(text=TRACEBACK)),
        ]
        verdict = decide(records, None)
        self.assertEqual(verdict.own.status, "failed")
        self.assertTrue(verdict.own.detail.startswith("rank 1 raised"))

    def test_timeout_names_running_ranks_and_shows_their_stacks(self) -> None:
        records = [
            done(0),
            RankRecord(rank=1, stopped=True, exitcode=-9, stack="File a.py, line 9, in body"),
            RankRecord(rank=2, stopped=True, exitcode=-9),
        ]
        verdict = decide(records, 2.5)
        self.assertEqual(verdict.own.status, "error")  # as upstream's timeouts
        self.assertEqual(
            verdict.own.detail,
            "timed out after 2.5 s with rank 1, rank 2 still running\n\n"
            "Python stacks of the ranks still running:\n"
            "--- stack of rank 1 ---\nFile a.py, line 9, in body\n"
            "--- stack of rank 2 ---\n(no stack: the rank did not answer the dump signal)",
        )

    def test_timeout_also_reports_ranks_that_failed(self) -> None:
        records = [RankRecord(rank=0, exitcode=7), RankRecord(rank=1, stopped=True, stack="s")]
        message = decide(records, 60.0).own.detail
        self.assertTrue(message.startswith("timed out after 60 s with rank 1 still running"))
        self.assertTrue(message.endswith("\n\nrank 0 exited with code 7"))

    def test_failure_report_ends_with_every_ranks_output(self) -> None:
        records = [
            done(0, rank_failure(text=TRACEBACK), output="hello\nworld\n"),
            done(1, output=""),
            done(2, output="bye"),
        ]
        message = decide(records, None).own.detail
        self.assertTrue(
            message.endswith(
                "captured output:\n[rank 0] hello\n[rank 0] world\n[rank 2] bye"
            ),
            message,
        )

    def test_failing_grid_point_is_reported_with_its_params(self) -> None:
        records = [
            done(0, point({"n": 1}, "pass"), point({"n": 2}, "fail", "tb0"), count=2),
            done(1, point({"n": 1}, "pass"), point({"n": 2}, "pass"), count=2),
        ]
        verdict = decide(records, None)
        self.assertEqual(
            verdict.points,
            [
                PointReport({"n": 1}, "passed"),
                PointReport(
                    {"n": 2}, "failed", "rank 0 failed this grid point:\ntb0", "AssertionError",
                    RankReport("rank 0", "tb0", [], []),
                ),
            ],
        )


USER_TB = (
    "Traceback (most recent call last):\n"
    '  File "/u/test_x.py", line 7, in test_x\n'
    "    dist.all_reduce(t)\n"
)
RESET = USER_TB + "RuntimeError: [pair.cc:537] Read error: Connection reset by peer\n"


class CauseFirst(unittest.TestCase):
    """A crash or hang report leads with the rank that caused it; the others come after."""

    def test_crash_leads_and_the_peers_reset_is_a_labelled_consequence(self) -> None:
        records = [
            done(0, rank_failure(text=RESET), problem_at=1.0),
            RankRecord(rank=1, exitcode=-6, problem_at=2.0,
                       stack='  File "/u/test_x.py", line 6, in test_x',
                       stack_frames=[Frame("/u/test_x.py", 6, "test_x")]),
        ]
        verdict = decide(records, None)
        head, body = verdict.own.detail.split("\n\n", 1)
        self.assertEqual(
            head,
            "rank 1 died by signal SIGABRT; rank 0 raised as a consequence: "
            "RuntimeError: [pair.cc:537] Read error: Connection reset by peer",
        )
        self.assertTrue(body.startswith(
            "rank 1 died by signal SIGABRT; its stack (most recent call last):\n"
            '  File "/u/test_x.py", line 6, in test_x\n\nrank 0 raised as a consequence:\n'
        ), body)
        lead = verdict.lead
        self.assertEqual((lead.label, lead.message), ("rank 1", "died by signal SIGABRT"))
        self.assertEqual([f.lineno for f in lead.frames], [6])
        self.assertEqual(lead.sections[0][0], "rank 0 raised as a consequence")

    def test_raised_error_leads_with_its_exception_line_and_frames(self) -> None:
        records = [done(1, rank_failure(text=USER_TB + "ValueError: bad\n"))]
        lead = decide(records, None).lead
        self.assertEqual((lead.label, lead.message), ("rank 1", "ValueError: bad"))
        self.assertEqual([(f.filename, f.lineno, f.name) for f in lead.frames],
                         [("/u/test_x.py", 7, "test_x")])

    def test_the_lead_problem_keeps_its_phase(self) -> None:
        set_up = rank_failure(text=USER_TB + "ValueError: bad\n", status="error",
                       phase="setup")
        stopped = RankRecord(rank=0, stopped=True, stack=USER_TB)
        verdict = decide([stopped, done(1, set_up)], None)
        self.assertEqual((verdict.own.status, verdict.lead.phase), ("error", "setup"))
        later = rank_failure(text=TRACEBACK)  # raised in the test, after its set-up
        self.assertEqual(decide([done(1, later)], None).lead.phase, "")

    def test_a_teardown_error_is_alone_only_when_the_test_passed_in_every_rank(self) -> None:
        torn = rank_failure(text=USER_TB + "OSError: x\n", status="error",
                     phase="teardown")
        self.assertEqual(decide([done(0), done(1, torn)], None).lead.phase, "teardown")
        stopped = RankRecord(rank=0, stopped=True, stack=USER_TB)  # still in its test
        self.assertEqual(decide([stopped, done(1, torn)], None).lead.phase, "")
        failed = done(0, rank_failure(text=TRACEBACK), problem_at=2.0)
        records = [failed, done(1, torn, problem_at=1.0)]  # the teardown error seen first
        verdict = decide(records, None)
        self.assertEqual((verdict.lead.label, verdict.lead.phase), ("rank 1", ""))

    def test_hang_is_blamed_on_the_rank_outside_the_collectives(self) -> None:
        waiting = [CollectiveCall("all_reduce", "the default group", 2, (), False)]
        records = [
            RankRecord(rank=0, stopped=True, stack="s0", collectives=waiting),
            RankRecord(rank=1, stopped=True, stack='  File "/u/t.py", line 3, in test_x',
                       collectives=[]),
        ]
        verdict = decide(records, 8.0)
        self.assertEqual(
            verdict.own.detail.splitlines()[0],
            "timed out after 8 s with rank 0, rank 1 still running; rank 1 hung first "
            "(in no collective, the others wait in one)",
        )
        self.assertLess(verdict.own.detail.index("stack of rank 1"),
                        verdict.own.detail.index("stack of rank 0"))
        self.assertEqual((verdict.lead.label, verdict.lead.hang), ("rank 1", True))

    def test_a_rank_that_left_while_a_peer_waits_is_the_culprit_of_the_hang(self) -> None:
        waiting = [CollectiveCall("all_reduce", "the default group", 1, (), True),
                   CollectiveCall("all_reduce", "the default group", 2, (), False)]
        records = [RankRecord(rank=0, stopped=True, stack="s0", collectives=waiting),
                   done(1, exitcode=0)]
        verdict = decide(records, 14.9)
        self.assertEqual(
            verdict.own.detail.splitlines()[0],
            "rank 1 left the test while rank 0 waits in all_reduce #2; timed out after 14.9 s "
            "with rank 0 still running",
        )
        self.assertEqual((verdict.lead.label, verdict.lead.hang), ("rank 1", True))
        self.assertTrue(verdict.lead.message.startswith("left the test while rank 0 waits"))

    def test_a_shared_rank_that_returned_is_the_culprit_too(self) -> None:
        waiting = [CollectiveCall("barrier", "the default group", 3, (), False)]
        records = [RankRecord(rank=0, stopped=True, collectives=waiting), done(1)]
        self.assertEqual(decide(records, 5.0).lead.label, "rank 1")

    def test_a_rank_running_outside_every_collective_is_blamed_before_one_that_left(
        self,
    ) -> None:
        waiting = [CollectiveCall("all_reduce", "the default group", 2, (), False)]
        records = [RankRecord(rank=0, stopped=True, stack="s0", collectives=waiting),
                   done(1), RankRecord(rank=2, stopped=True, stack="s2", collectives=[])]
        verdict = decide(records, 5.0)
        self.assertIn("rank 2 hung first", verdict.own.detail.splitlines()[0])
        self.assertEqual(verdict.lead.label, "rank 2")

    def test_no_one_who_left_is_blamed_for_a_subgroups_collective(self) -> None:
        waiting = [CollectiveCall("all_reduce", "group 1", 2, (), False)]
        records = [RankRecord(rank=0, stopped=True, collectives=waiting), done(1)]
        self.assertTrue(decide(records, 5.0).own.detail.startswith("timed out after 5 s"))

    def test_ranks_stopped_outside_any_collective_wait_for_no_one_who_left(self) -> None:
        records = [RankRecord(rank=0, stopped=True, collectives=[]), done(1, exitcode=0)]
        self.assertTrue(decide(records, 5.0).own.detail.startswith("timed out after 5 s"))

    def test_a_peers_broken_connection_is_the_consequence_of_its_leaving(self) -> None:
        closed = rank_failure(status="error", text=(
            'Traceback (most recent call last):\n  File "/u/t.py", line 9, in test_x\n'
            "RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:123\n"))
        records = [done(0, closed, exitcode=0, problem_at=1.0), done(1, exitcode=0)]
        verdict = decide(records, None)
        self.assertEqual(verdict.lead.label, "rank 1")
        self.assertTrue(verdict.own.detail.startswith(
            "rank 1 left the test while rank 0 was in a collective with it; rank 0 raised as a "
            "consequence: RuntimeError: [gloo] Connection closed by peer"), verdict.own.detail)


class MergeSubtests(unittest.TestCase):
    def test_points_merge_across_ranks_in_first_seen_order(self) -> None:
        records = [
            RankRecord(rank=0, events=[point({"a": 2}, "pass"), point({"a": 1}, "pass")]),
            RankRecord(rank=1, events=[point({"a": 1}, "pass"), point({"a": 3}, "pass")]),
        ]
        self.assertEqual(
            [(v.params, v.status) for v in merge_subtests(records)],
            [({"a": 2}, "passed"), ({"a": 1}, "passed"), ({"a": 3}, "passed")],
        )

    def test_param_order_does_not_split_a_point(self) -> None:
        records = [
            RankRecord(rank=0, events=[point({"a": 1, "b": "x"}, "pass")]),
            RankRecord(rank=1, events=[point({"b": "x", "a": 1}, "fail", "tb")]),
        ]
        merged = merge_subtests(records)
        self.assertEqual(len(merged), 1)
        self.assertEqual(merged[0].status, "failed")

    def test_every_failing_rank_text_is_kept(self) -> None:
        records = [
            RankRecord(rank=r, events=[point({"k": None}, "fail", f"tb{r}")]) for r in (0, 1)
        ]
        self.assertEqual(
            merge_subtests(records),
            [
                PointReport(
                    {"k": None},
                    "failed",
                    "rank 0 failed this grid point:\ntb0\nrank 1 failed this grid point:\ntb1",
                    "AssertionError",
                    RankReport("rank 0", "tb0", [], [("rank 1 failed this grid point", "tb1")]),
                )
            ],
        )

    def test_skip_only_when_every_rank_skipped(self) -> None:
        all_skip = [RankRecord(rank=r, events=[point({"p": 0}, "skip", "no")]) for r in (0, 1)]
        self.assertEqual(merge_subtests(all_skip), [PointReport({"p": 0}, "skipped", "no")])
        one_skip = [
            RankRecord(rank=0, events=[point({"p": 0}, "skip", "no")]),
            RankRecord(rank=1, events=[point({"p": 0}, "pass")]),
        ]
        self.assertEqual(merge_subtests(one_skip), [PointReport({"p": 0}, "passed")])

    def test_non_subtest_events_are_ignored(self) -> None:
        records = [done(0, rank_failure(text="x"), Event(kind="success"))]
        self.assertEqual(merge_subtests(records), [])


class SignalName(unittest.TestCase):
    def test_known_and_unknown_signals(self) -> None:
        self.assertEqual(signal_name(11), "SIGSEGV")
        self.assertEqual(signal_name(9), "SIGKILL")
        self.assertEqual(signal_name(6), "SIGABRT")
        self.assertEqual(signal_name(999), "999")
        verdict = decide([RankRecord(rank=0, exitcode=-999)], None)
        self.assertEqual(verdict.own.detail, "rank 0 died by signal 999")

    def test_exit_code_after_the_test_finished_still_fails(self) -> None:
        verdict = decide([RankRecord(rank=0, events=[Event("done")], exitcode=1)], None)
        self.assertEqual(verdict.own.status, "failed")
        self.assertEqual(verdict.own.detail, "rank 0 exited with code 1 after its test finished")

    def test_one_line_problem_is_not_repeated_and_blank_output_adds_nothing(self) -> None:
        verdict = decide([RankRecord(rank=1, exitcode=-11, output="\n")], None)
        self.assertEqual(verdict.own.detail, "rank 1 died by signal SIGSEGV")


class OutputSection(unittest.TestCase):
    def test_long_output_keeps_its_tail(self) -> None:
        lines = [f"line {i}" for i in range(OUTPUT_TAIL_LINES + 5)]
        text = output_section([RankRecord(rank=3, output="\n".join(lines))]).splitlines()
        self.assertEqual(text[:3], ["captured output:", "[rank 3] ... (5 earlier lines omitted)",
                                    "[rank 3] line 5"])
        self.assertEqual(text[-1], f"[rank 3] line {OUTPUT_TAIL_LINES + 4}")
        self.assertEqual(len(text), OUTPUT_TAIL_LINES + 2)

    def test_no_output_no_section(self) -> None:
        self.assertEqual(output_section([RankRecord(rank=0), RankRecord(rank=1, output="")]), "")
