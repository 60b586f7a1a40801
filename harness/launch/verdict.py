"""The one merge: every rank's RankRecord of a test, turned into that test's outcome.

Whatever mode ran the ranks (fresh or shared processes, threads, torchrun), `decide` applies
DESIGN.md's rules (what counts as a failure, a skip or a timeout, and what the message
says) and `apply_verdict` reports the result as the supervising case's own outcome, each
grid point replayed as a subtest. Kept free of process and thread handling so the rules can
be read, and tested, in one place.
"""

from __future__ import annotations

import unittest
from typing import Any, Callable, Dict, List, NamedTuple, Optional

from harness.launch.collective_trace import collectives_section, disagreement
from harness.launch.report import RankRecord

# unittest hides frames of modules that define this: a verdict's report is the ranks' story,
# not the frames that raise it here.
__unittest = True

OUTPUT_TAIL_LINES = 200

ExitAccepted = Callable[[int, int], bool]


class RankError(RuntimeError):
    """A rank raised an exception other than an assertion's: the test is an error, as
    unittest reports such an exception in a single process (upstream raises RuntimeError)."""


class SubtestVerdict(NamedTuple):
    """One grid point, merged over ranks: fail if any rank failed it, skip if every rank did."""

    params: Dict[str, Any]
    status: str  # "pass" | "fail" | "skip"
    text: str


class Verdict(NamedTuple):
    kind: str  # "pass" | "fail" | "error" | "skip"
    message: str
    subtests: List[SubtestVerdict]
    grid_points: int


def decide(
    records: List[RankRecord], timed_out_after: Optional[float],
    exit_accepted: Optional[ExitAccepted] = None,
) -> Verdict:
    """The test's outcome from every rank's record, by DESIGN.md's rules.

    `exit_accepted(rank, exitcode)` names exits the test expects (no problem then).
    """
    subtests = merge_subtests(records)
    grid_points = max((r.grid_points for r in records), default=0)
    failing = sorted(
        (r for r in records if r.problems(exit_accepted)), key=lambda r: (r.problem_at, r.rank)
    )
    if timed_out_after is not None:
        running = [r for r in records if r.stopped]
        names = ", ".join(f"rank {r.rank}" for r in running)
        head = f"timed out after {timed_out_after:g} s with {names} still running"
        body = [ranks_collectives(running), stacks_section(running)]
        body += [p for r in failing for p in r.problems(exit_accepted)]
        return Verdict("fail", report(head, body, records), subtests, grid_points)
    if failing:
        problems = [p for r in failing for p in r.problems(exit_accepted)]
        head = "; ".join(p.splitlines()[0].rstrip(":") for p in problems)
        stopped = [r for r in records if r.stopped]
        details = [p for p in problems if "\n" in p]  # one-line problems are all in the head
        calls = {r.rank: r.collectives for r in records if r.collectives is not None}
        if stopped or disagreement(calls):
            details.append(collectives_section(calls))
        body = details + ([stopped_section(stopped)] if stopped else [])
        # The rank named first decides, as unittest would in that rank: an exception other
        # than an assertion's is an error; a crash, a signal or an exit code is a failure.
        kind = "error" if failing[0].raised_error() else "fail"
        return Verdict(kind, report(head, body, records), subtests, grid_points)
    reasons = [reason for reason in (r.skip_reason() for r in records) if reason is not None]
    if reasons:
        return Verdict("skip", reasons[0], subtests, grid_points)
    return Verdict("pass", "", subtests, grid_points)


def merge_subtests(records: List[RankRecord]) -> List[SubtestVerdict]:
    """Every grid point any rank ran, in first-seen order, with each rank's failure text."""
    points: Dict[str, Dict[str, Any]] = {}
    for record in records:
        for event in record.events:
            if event.kind != "subtest":
                continue
            key = repr(sorted((k, repr(v)) for k, v in (event.params or {}).items()))
            point = points.setdefault(
                key, {"params": event.params or {}, "ranks": 0, "failed": [], "skipped": []}
            )
            point["ranks"] += 1
            if event.status == "fail":
                point["failed"].append(f"rank {record.rank} failed this grid point:\n{event.text}")
            elif event.status == "skip":
                point["skipped"].append(event.text)
    verdicts = []
    for point in points.values():
        if point["failed"]:
            verdicts.append(SubtestVerdict(point["params"], "fail", "\n".join(point["failed"])))
        elif len(point["skipped"]) == point["ranks"]:
            verdicts.append(SubtestVerdict(point["params"], "skip", point["skipped"][0]))
        else:
            verdicts.append(SubtestVerdict(point["params"], "pass", ""))
    return verdicts


def ranks_collectives(records: List[RankRecord]) -> str:
    """Which collective each rank is in (and where they disagree), for ranks that could tell."""
    return collectives_section({r.rank: r.collectives for r in records})


def stacks_section(running: List[RankRecord]) -> str:
    parts = ["Python stacks of the ranks still running:"]
    for record in running:
        stack = record.stack.strip() or "(no stack: the rank did not answer the dump signal)"
        parts.append(f"--- stack of rank {record.rank} ---\n{stack}")
    return "\n".join(parts)


def stopped_section(stopped: List[RankRecord]) -> str:
    parts = []
    for record in stopped:
        parts.append(f"rank {record.rank} was still running and was stopped; its stack then:")
        parts.append(record.stack.strip() or "(no stack: the rank did not answer the dump signal)")
    return "\n".join(parts)


def output_section(records: List[RankRecord]) -> str:
    """Every rank's captured stdout/stderr, each line prefixed by its rank."""
    parts = []
    for record in records:
        if not record.output.strip():
            continue
        lines = record.output.splitlines()
        if len(lines) > OUTPUT_TAIL_LINES:
            omitted = len(lines) - OUTPUT_TAIL_LINES
            lines = [f"... ({omitted} earlier lines omitted)"] + lines[-OUTPUT_TAIL_LINES:]
        parts.extend(f"[rank {record.rank}] {line}" for line in lines)
    if not parts:
        return ""
    return "captured output:\n" + "\n".join(parts)


def report(head: str, body: List[str], records: List[RankRecord]) -> str:
    sections = [head, *body, output_section(records)]
    return "\n\n".join(s for s in sections if s)


def apply_verdict(case: unittest.TestCase, verdict: Verdict) -> None:
    """Report a verdict as the supervising case's own outcome.

    Every grid point the ranks ran becomes the case's subtest with its params (so failing
    points are reported one by one); then the case fails or skips with the verdict's message.
    """
    for point in verdict.subtests:
        with case.subTest(**point.params):
            if point.status == "fail":
                raise case.failureException(point.text)
            if point.status == "skip":
                raise unittest.SkipTest(point.text)
    if verdict.kind == "fail":
        raise case.failureException(verdict.message)
    if verdict.kind == "error":
        raise RankError(verdict.message)
    if verdict.kind == "skip":
        raise unittest.SkipTest(verdict.message)
