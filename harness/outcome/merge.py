"""The one merge: every rank's RankRecord of a test, turned into that test's TestReport.

Whatever mode ran the ranks (fresh or shared processes, threads, torchrun), `decide` applies
docs/design.md's rules (what counts as a failure, a skip or a timeout, and what the message
says), merges the grid points the ranks ran, and folds both into the test's one report
(fold.py), which every reporter reads: the runner's, pytest's longrepr for a marked function
(harness/pytest_plugin/run.py), and replay.py, which reports it through unittest's API as a
test class's supervising case's own outcome. Kept free of process and thread handling so
the rules can be read, and tested, in one place.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from harness.outcome import stacks
from harness.outcome.collective_trace import (
    DEFAULT_GROUP,
    collectives_section,
    disagreement,
    waiting_in,
)
from harness.outcome.fold import fold
from harness.outcome.rank_record import Event, RankRecord
from harness.outcome.report import (
    ERROR,
    FAILED,
    PASSED,
    SKIPPED,
    Outcome,
    PointReport,
    RankReport,
    TestReport,
)
from harness.outcome.stacks import Frame

OUTPUT_TAIL_LINES = 200
CONSEQUENCE_LINE = 100  # characters of a consequence's exception line kept in the head


ExitAccepted = Callable[[int, int], bool]


class Problem(NamedTuple):
    """One way one rank failed: `head` as "rank N raised", `detail` its traceback or stack."""

    rank: int
    head: str
    exception: str
    detail: str
    consequence: bool
    phase: str = ""  # "setup"/"teardown": raised by the test's own fixtures (Failure.phase)
    frames: Tuple[Frame, ...] = ()  # where it happened, the user's frames, oldest first
    exc_class: Tuple[str, str] = ("", "")  # what it raised: (module, qualified name)

    def headline(self) -> str:
        if not self.exception:
            return self.head
        line = self.exception.splitlines()[0]
        if self.consequence:  # the cause is told before; this only says what followed
            line = line if len(line) <= CONSEQUENCE_LINE else line[: CONSEQUENCE_LINE - 3] + "..."
            return f"{self.head} as a consequence: {line}"
        return f"{self.head}: {line}"

    def section(self) -> Tuple[str, str]:
        """(title, text) of the report's section on this problem; untitled when one line."""
        if not self.detail:
            return "", self.headline()
        if self.consequence:
            return f"{self.head} as a consequence", self.detail
        if self.exception:
            return self.head, self.detail
        return f"{self.head}; its stack (most recent call last)", self.detail


# A rank that failed because a peer failed first: its error names the peer's absence.
CONSEQUENCE_MARKERS = (
    "Connection closed by peer", "Connection reset by peer", "remote worker crashing",
    "Broken pipe", "RankReleased", "communicator was aborted", "abandoned: rank",
    "run aborted: rank",
)


def is_consequence(messages: Sequence[str]) -> bool:
    """Whether a rank's exception (or one in its chain) says it failed because a peer failed
    (or left) first."""
    return any(marker in message for message in messages for marker in CONSEQUENCE_MARKERS)


def problems_of(
    record: RankRecord, exit_accepted: Optional[ExitAccepted] = None
) -> List[Problem]:
    """The record's problems: each exception it raised (from its Failure), then its exit."""
    found = [_raised_problem(record.rank, event) for event in record.raised()]
    # died by a signal (not stopped, no exit code of its own): the stack it crashed with
    crashed = (record.exitcode is not None and record.exitcode < 0 and not record.stopped
               and record.test_exit_code() is None)
    for head in record.exit_problems(exit_accepted):
        detail, frames = "", ()
        if crashed:
            detail = record.stack.strip("\n")
            frames = tuple(stacks.visible(record.stack_frames))
        found.append(Problem(record.rank, head, "", detail, False, frames=frames))
    return found


def _raised_problem(rank: int, event: Event) -> Problem:
    failure = event.failure
    assert failure is not None, f"a rank's {event.kind} event without its Failure"
    return Problem(
        rank, f"rank {rank} raised", failure.exception, event.text.rstrip(),
        is_consequence(failure.messages), failure.phase, tuple(stacks.visible(failure.frames)),
        (failure.exc_module, failure.exc_qualname),
    )


def ordered_problems(
    failing: List[RankRecord], exit_accepted: Optional[ExitAccepted] = None
) -> List[Problem]:
    """Every problem, the cause first: a rank that failed on its own before any rank that
    failed as a consequence of it (which stay labelled so); by time seen, then rank."""
    problems = [p for r in failing for p in problems_of(r, exit_accepted)]
    causes = [p for p in problems if not p.consequence]
    if not causes:  # every failure looks like a consequence: nothing to blame but the first
        return [p._replace(consequence=False) for p in problems]
    return causes + [p for p in problems if p.consequence]


def decide(
    records: List[RankRecord], timed_out_after: Optional[float],
    exit_accepted: Optional[ExitAccepted] = None, test_id: str = "",
) -> TestReport:
    """The test's report from every rank's record, by docs/design.md's rules.

    `exit_accepted(rank, exitcode)` names exits the test expects (no problem then).
    """
    return fold(test_id, merge_subtests(records), own_outcome(records, timed_out_after,
                                                               exit_accepted))


def own_outcome(
    records: List[RankRecord], timed_out_after: Optional[float],
    exit_accepted: Optional[ExitAccepted] = None,
) -> Outcome:
    """How the test itself ended in its ranks, grid points aside: its message's first line
    (the head), the whole report, and the report in parts."""
    failing = sorted(
        (r for r in records if r.problems(exit_accepted)), key=lambda r: (r.problem_at, r.rank)
    )
    if timed_out_after is not None:
        running = [r for r in records if r.stopped]
        names = ", ".join(f"rank {r.rank}" for r in running)
        head = f"timed out after {timed_out_after:g} s with {names} still running"
        problems = ordered_problems(failing, exit_accepted)
        collectives = ranks_collectives(running)
        first, blamed = hung_first(running)
        # a rank still running outside every collective is what the others wait for; else a
        # rank that ended the test alone
        left = None if blamed else left_while_waiting(records, exit_accepted)
        if left is not None:
            head = f"{left.head}; {head}"
        elif blamed:
            head += f"; rank {first.rank} hung first (in no collective, the others wait in one)"
        by_cause = sorted(running, key=lambda r: r is not first)  # the cause's stack first
        sections = [("", collectives), ("", stacks_section(by_cause))]
        sections += [p.section() for p in problems]
        label = f"rank {left.rank}" if left else f"rank {first.rank}" if first else "timed out"
        lead = RankReport(
            label, head[len(label) + 1:] if left else head,
            stacks.visible(first.stack_frames) if first and not left else [],
            [titled(collectives)]
            + [(f"stack of rank {r.rank}", stopped_stack(r)) for r in by_cause]
            + [p.section() for p in problems],
            hang=True,
        )
        # An error, as upstream's (its timeout is a RuntimeError): the test did not fail an
        # assertion, it never finished; JUnit consumers count it with the errors.
        return Outcome(ERROR, head, report(head, sections, records), "RankError", lead)
    if failing:
        problems = ordered_problems(failing, exit_accepted)
        left = left_while_waiting(records, exit_accepted)
        if left is not None and all(p.consequence for p in problems_of_all(failing, exit_accepted)):
            # every failure is a peer's leaving (gloo's "Connection closed by peer"): the rank
            # that left is the cause, and theirs are consequences
            problems = [left] + [p._replace(consequence=True) for p in problems]
        head = "; ".join(p.headline() for p in problems)
        stopped = [r for r in records if r.stopped]
        sections = [p.section() for p in problems if p.detail]
        calls = {r.rank: r.collectives for r in records if r.collectives is not None}
        if stopped or disagreement(calls):
            sections.append(("", collectives_section(calls)))
        stopped_parts = [(stopped_title(r), stopped_stack(r)) for r in stopped]
        lead_problem = problems[0]
        rest = [p.section() for p in problems[1:]]
        phase = lead_problem.phase
        if phase == "teardown" and (stopped or any(p.phase != phase for p in problems)):
            phase = ""  # the test itself did not pass in every rank: no teardown error alone
        lead = RankReport(
            f"rank {lead_problem.rank}",
            lead_problem.exception or lead_problem.head[len(f"rank {lead_problem.rank} "):],
            list(lead_problem.frames),
            rest + [titled(s[1]) for s in sections if not s[0]] + stopped_parts,
            phase=phase, exc_class=lead_problem.exc_class,
        )
        message = report(head, sections + stopped_parts, records)
        # The rank named first decides, as unittest would in that rank: an exception other
        # than an assertion's is an error; a crash, a signal or an exit code is a failure.
        raised = lead_problem.head == f"rank {lead_problem.rank} raised"
        errored = raised and any(r.rank == lead_problem.rank and r.raised_error() for r in failing)
        if errored:
            return Outcome(ERROR, head, message, "RankError", lead)
        return Outcome(FAILED, head, message, "AssertionError", lead)
    reasons = [reason for reason in (r.skip_reason() for r in records) if reason is not None]
    if reasons:
        return Outcome(SKIPPED, reasons[0])
    return Outcome(PASSED)


def merge_subtests(records: List[RankRecord]) -> List[PointReport]:
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
                point["failed"].append((record.rank, event))
            elif event.status == "skip":
                point["skipped"].append(event.text)
    merged = []
    for point in points.values():
        if point["failed"]:
            text = "\n".join(
                f"rank {rank} failed this grid point:\n{stacks.clean_traceback(event.text)}"
                for rank, event in point["failed"]
            )
            (rank, first), *others = point["failed"]
            failure = first.failure
            lead = RankReport(
                f"rank {rank}", failure.exception, stacks.visible(failure.frames),
                [(f"rank {r} failed this grid point", event.text) for r, event in others],
                exc_class=(failure.exc_module, failure.exc_qualname),
            )
            merged.append(PointReport(point["params"], FAILED, text, "AssertionError", lead))
        elif len(point["skipped"]) == point["ranks"]:
            merged.append(PointReport(point["params"], SKIPPED, point["skipped"][0]))
        else:
            merged.append(PointReport(point["params"], PASSED))
    return merged


def problems_of_all(
    failing: List[RankRecord], exit_accepted: Optional[ExitAccepted] = None
) -> List[Problem]:
    """Every problem of the failing ranks, as they are (consequences not reordered)."""
    return [p for r in failing for p in problems_of(r, exit_accepted)]


def left_while_waiting(
    records: List[RankRecord], exit_accepted: Optional[ExitAccepted] = None
) -> Optional[Problem]:
    """A rank that ended the test on its own, without a problem, while a peer had not: what
    that peer waits for in its collective (or failed in, when the leaving broke the
    connection). Told as `rank 1 left the test while rank 0 waits in all_reduce #2`; None
    when no rank left so, or every rank did."""
    gone = [r for r in records if not r.stopped and (r.finished or r.exitcode is not None)
            and not r.problems(exit_accepted) and r.skip_reason() is None]
    behind = [r for r in records if r.stopped or r.problems(exit_accepted)]
    if not gone or not behind:
        return None
    waits = [(r, waiting_in(r.collectives)) for r in behind if r.collectives]
    # on the default group every rank takes part; a subgroup's members are not known here
    known = [(r, call) for r, call in waits if call is not None and call.group == DEFAULT_GROUP]
    if known:
        peer, call = known[0]
        where_it_waits = f"waits in {call.describe(with_group=False)}"
    elif any(r.stopped for r in behind):
        return None  # the ones still running wait in no collective: not for it
    else:
        peer, where_it_waits = behind[0], "was in a collective with it"
    return Problem(gone[0].rank, f"rank {gone[0].rank} left the test while rank {peer.rank} "
                   f"{where_it_waits}", "", "", False)


def titled(section: str) -> Tuple[str, str]:
    """A section whose first line is its title ("Collectives of each rank:"), split."""
    title, _, text = section.partition("\n")
    return title.rstrip(":"), text


def hung_first(running: List[RankRecord]) -> Tuple[Any, bool]:
    """The rank a hang's report leads with, and whether it is to blame: one outside any
    collective while others wait in one (they wait for it); else the first still running."""
    known = [r for r in running if r.collectives is not None]
    outside = [r for r in known if waiting_in(r.collectives or []) is None]
    if outside and len(outside) < len(known):
        return outside[0], True
    return (running[0] if running else None), False


def ranks_collectives(records: List[RankRecord]) -> str:
    """Which collective each rank is in (and where they disagree), for ranks that could tell."""
    return collectives_section({r.rank: r.collectives for r in records})


NO_STACK = "(no stack: the rank did not answer the dump signal)"


def stacks_section(running: List[RankRecord]) -> str:
    parts = ["Python stacks of the ranks still running:"]
    for record in running:
        parts.append(f"--- stack of rank {record.rank} ---\n{stopped_stack(record)}")
    return "\n".join(parts)


def stopped_title(record: RankRecord) -> str:
    return f"rank {record.rank} was still running and was stopped; its stack then"


def stopped_stack(record: RankRecord) -> str:
    return record.stack.strip("\n") or NO_STACK


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


def report(head: str, body: List[Tuple[str, str]], records: List[RankRecord]) -> str:
    """The unittest report: the head, each titled section ("title:" then its text; untitled
    ones as they are), then every rank's output."""
    parts = [head]
    for title, text in body:
        parts.append(f"{title}:\n{stacks.clean_traceback(text)}" if title else text)
    parts.append(output_section(records))
    return "\n\n".join(p for p in parts if p)
