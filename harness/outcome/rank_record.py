"""What one rank reports about one test: its events, and the record that travels between modes.

A rank reports through `ReportingResult`, which turns each outcome (unittest's callbacks, for
a test class; its `report_*` methods, for a pytest function's rank program) into an `Event`,
an exception as its Failure (`raised_event`), and sends it to a sink: a pipe to the
supervising process (fresh and shared processes, so a failure is seen at once and the other
ranks are stopped), or a `RecordSink` that appends it to the rank's `RankRecord` in memory
(threads, torchrun).
`RankRecord` is the one record every launch mode hands to the merge
(harness/outcome/merge.py); `to_json`/`from_json` carry it across hosts (torchrun's ranks
exchange it). Kept free of process and thread handling so both modes can build on it.
"""

from __future__ import annotations

import json
import pickle
import signal
import time
import unittest
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from harness.outcome.collective_trace import CollectiveCall
from harness.outcome.failure import Failure
from harness.outcome.report import Shown, params_from_json, params_to_json
from harness.outcome.stacks import Frame, format_stack
from harness.requirements.skip_codes import SKIP_BY_EXIT_CODE

ExcInfo = Tuple[Any, Any, Any]


class Event(NamedTuple):
    """One report from a rank: what its test did, made picklable.

    kind: "success", "failure" (failure: what was raised, as data; status "error" when unittest
    counts it an error, not a failed assertion), "skip" (text: reason), "expected_failure"
    (failure), "unexpected_success", "subtest" (params, status pass/fail/skip; text: a skip's
    reason; failure: a failed point's), "exit" (count: the code the test passed to sys.exit,
    upstream's exit code of the rank), "set_up" (a marked function's own fixtures are set up
    in the rank: its call begins), "done" (count: grid points the rank ran).
    A failure's `text` is its `failure.text`, the traceback for display.
    """

    kind: str
    text: str = ""
    params: Optional[Dict[str, Any]] = None
    status: str = ""
    count: int = 0
    failure: Optional[Failure] = None


SET_UP = "set_up"  # the kind of the event a rank sends once the test's own fixtures are set up


class FixtureError(Exception):
    """Raised in a rank when the test's own fixtures failed there (a marked pytest function's
    `@rank_fixture`s) in `phase` "setup" or "teardown", with that error as its `__cause__`:
    reported as the error itself, in that phase, so that pytest can say "ERROR at setup" or
    "ERROR at teardown" as it does for its own fixtures."""

    def __init__(self, phase: str, message: str) -> None:
        super().__init__(message)
        self.phase = phase


def picklable_params(params: Dict[str, Any]) -> Dict[str, Any]:
    """Grid-point params that can cross the pipe: unpicklable values become their repr."""
    safe = {}
    for name, value in params.items():
        try:
            pickle.dumps(value)
        except Exception:
            value = Shown(repr(value))
        safe[name] = value
    return safe


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


@dataclass
class RankRecord:
    """Everything known about one rank of one test, whichever mode ran it."""

    rank: int
    pid: Optional[int] = None
    events: List[Event] = field(default_factory=list)
    exitcode: Optional[int] = None
    stopped: bool = False  # the supervisor stopped it (fail-fast or timeout)
    output: str = ""
    stack: str = ""  # Python stack taken just before the supervisor stopped it, for display
    stack_frames: List[Frame] = field(default_factory=list)  # ... and its frames, oldest first
    collectives: Optional[List[CollectiveCall]] = None  # what it entered, when it could tell
    problem_at: float = float("inf")  # when the supervisor first saw this rank fail
    duration: float = 0.0  # seconds the rank spent on the test, when it measured them

    def set_stack(self, frames: List[Frame], shown: str = "") -> None:
        """The rank's stack when it was stopped or crashed: its frames, shown in the report's
        format (`shown` where there are none to show: a dump that held no thread's stack)."""
        self.stack_frames = list(frames)
        self.stack = format_stack(frames) if frames else shown

    @property
    def finished(self) -> bool:
        return any(e.kind == "done" for e in self.events)

    @property
    def grid_points(self) -> int:
        return max((e.count for e in self.events if e.kind == "done"), default=0)

    def skip_reason(self) -> Optional[str]:
        """Why this rank skipped the test (SkipTest or a TEST_SKIPS exit code), if it did."""
        for event in self.events:
            if event.kind == "skip":
                return event.text
        if not self.finished and self.exitcode in SKIP_BY_EXIT_CODE:
            return SKIP_BY_EXIT_CODE[self.exitcode].message
        return None

    def test_exit_code(self) -> Optional[int]:
        """The code the test gave sys.exit in this rank (other than 0 or a skip), if it did."""
        return next((e.count for e in self.events if e.kind == "exit"), None)

    def raised_error(self) -> bool:
        """Whether the first exception this rank reported was an error, not an assertion's."""
        raised = [e for e in self.events if raised_in_rank(e)]
        return bool(raised) and raised[0].status == "error"

    def problems(self, exit_accepted: Optional[Callable[[int, int], bool]] = None) -> List[str]:
        """Each way this rank failed, as 'rank N ...' text; empty when it did not fail. The
        exceptions it raised come first, in the order of their events.

        `exit_accepted(rank, exitcode)` says which exits the test expects (upstream's
        `special_return_code_checks`, `skip_return_code_checks`): those are no problem.
        """
        raised = [f"rank {self.rank} raised:\n{e.text.rstrip()}" for e in self.raised()]
        return raised + self.exit_problems(exit_accepted)

    def raised(self) -> List[Event]:
        """The events of the exceptions the test raised in this rank, in order."""
        return [e for e in self.events if raised_in_rank(e)]

    def exit_problems(
        self, exit_accepted: Optional[Callable[[int, int], bool]] = None
    ) -> List[str]:
        """The ways this rank failed other than by raising: its exit, a signal (one line each)."""
        found: List[str] = []
        code = self.test_exit_code()
        if code is not None:  # the test ended with sys.exit(code): the process's exit, upstream
            if exit_accepted is None or not exit_accepted(self.rank, code):
                found.append(f"rank {self.rank} exited with code {code} (sys.exit in its test)")
            return found
        if self.stopped or self.exitcode is None or self.exitcode in SKIP_BY_EXIT_CODE:
            return found  # a skip code is decided by skip_reason()
        if exit_accepted is not None and exit_accepted(self.rank, self.exitcode):
            return found
        if self.exitcode < 0:
            found.append(f"rank {self.rank} died by signal {signal_name(-self.exitcode)}")
        elif self.exitcode != 0:
            after = " after its test finished" if self.finished else ""
            found.append(f"rank {self.rank} exited with code {self.exitcode}{after}")
        elif not self.finished:
            found.append(f"rank {self.rank} exited with code 0 before its test finished")
        return found

    @property
    def failed(self) -> bool:
        return bool(self.problems())

    def to_json(self) -> str:
        """The record as JSON text; params that JSON cannot carry travel as their repr."""
        data: Dict[str, Any] = {
            "rank": self.rank,
            "pid": self.pid,
            "events": [_event_to_json(e) for e in self.events],
            "exitcode": self.exitcode,
            "stopped": self.stopped,
            "output": self.output,
            "stack": self.stack,
            "stack_frames": [list(frame) for frame in self.stack_frames],
            "collectives": None if self.collectives is None else [
                [c.op, c.group, c.seq, list(c.inputs), c.completed] for c in self.collectives
            ],
            "problem_at": None if self.problem_at == float("inf") else self.problem_at,
            "duration": self.duration,
        }
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> RankRecord:
        """The record `to_json` wrote (a value that travelled as its repr comes back `Shown`)."""
        data = json.loads(text)
        calls = data["collectives"]
        return cls(
            rank=data["rank"],
            pid=data["pid"],
            events=[_event_from_json(e) for e in data["events"]],
            exitcode=data["exitcode"],
            stopped=data["stopped"],
            output=data["output"],
            stack=data["stack"],
            stack_frames=[Frame(*frame) for frame in data["stack_frames"]],
            collectives=None if calls is None else [
                CollectiveCall(op, group, seq, tuple(inputs), completed)
                for op, group, seq, inputs, completed in calls
            ],
            problem_at=float("inf") if data["problem_at"] is None else data["problem_at"],
            duration=data["duration"],
        )


def _event_to_json(event: Event) -> Dict[str, Any]:
    data = event._asdict()
    if event.params is not None:
        data["params"] = params_to_json(event.params)
    if event.failure is not None:
        data["failure"] = event.failure.to_data()
    return data


def _event_from_json(data: Dict[str, Any]) -> Event:
    params, failure = data.get("params"), data.get("failure")
    if params is not None:
        data = {**data, "params": params_from_json(params)}
    if failure is not None:
        data = {**data, "failure": Failure.from_data(failure)}
    return Event(**data)


def raised_event(
    exc_info: ExcInfo, kind: str = "failure", status: Optional[str] = None, phase: str = "",
    params: Optional[Dict[str, Any]] = None,
) -> Event:
    """THE one place a rank's exception becomes its event: the Failure, built here from the
    live exception, and its text. `status` "error" unless the exception is an assertion's
    (unittest's distinction), where the caller does not say."""
    failure = Failure.from_exc_info(exc_info, phase)
    if status is None:
        status = "" if failure.is_assertion else "error"
    return Event(kind, failure.text, params, status, failure=failure)


def raised_in_rank(event: Event) -> bool:
    """Whether `event` is an exception the test raised in its rank (a failure, an error, or
    an expected failure's)."""
    return event.kind in ("failure", "expected_failure")


def fails_rank(event: Event) -> bool:
    """THE rule for which of a rank's events mean the test failed there: it raised, or it
    called sys.exit with a code. The verdict (`RankRecord.problems`), the launchers' fail-fast
    (harness/launch/fail_fast.py) and the process supervisor all read it."""
    return raised_in_rank(event) or event.kind == "exit"


def exit_ends_rank(code: Any) -> bool:
    """Whether `sys.exit(code)` in a test ends its rank as upstream's rank process ends (0 or
    None: a pass; another int that is no skip code: the rank's exit code, a failure), rather
    than being reported as raised (a skip code: a skip; anything else: an error)."""
    return code in (0, None) or (type(code) is int and code not in SKIP_BY_EXIT_CODE)


def skip_exit_reason(exc_info: ExcInfo) -> Optional[str]:
    """The TEST_SKIPS message when the error is `sys.exit(code)` with a skip code, else None."""
    exctype, value, _ = exc_info
    if exctype is not None and issubclass(exctype, SystemExit):
        code = getattr(value, "code", None)
        if code in SKIP_BY_EXIT_CODE:
            return SKIP_BY_EXIT_CODE[code].message
    return None


class ReportingResult(unittest.TestResult):
    """The rank's side of the report: every event sent to a sink (anything with
    `.send(event)`) instead of kept. A unittest result for the classes' ranks, whose unittest
    callbacks say what happened; `report_*` for a rank that runs a function, not a case."""

    def __init__(self, sink: Any, hold_success: bool = False) -> None:
        super().__init__()
        self._sink = sink
        self._hold_success = hold_success  # sent with "done" by the caller: one message less
        self.held: List[Event] = []
        self.failed = False  # the test itself (not a grid point) failed in this rank
        self.passed = False  # it passed in this rank (no failure, skip or failed grid point)

    def report_success(self) -> None:
        """The test passed in this rank."""
        self.passed = True
        if self._hold_success:
            self.held.append(Event("success"))
        else:
            self._sink.send(Event("success"))

    def report_set_up(self) -> None:
        """The test's own fixtures are set up in this rank: its call begins (the pytest
        process waits for this in pytest's set-up phase)."""
        self._sink.send(Event(SET_UP))

    def report_skip(self, reason: str) -> None:
        """The test skipped itself in this rank."""
        self._sink.send(Event("skip", reason))

    def report_raised(self, err: ExcInfo, status: Optional[str] = None) -> None:
        """The test raised `err` in this rank: a failure (status "", an assertion's), else an
        error; `sys.exit` with a skip code is a skip; a FixtureError is its cause, raised in
        the phase it names."""
        skip = skip_exit_reason(err)
        if skip is not None:
            self.report_skip(skip)
            return
        self.failed = True
        if isinstance(err[1], FixtureError) and err[1].__cause__ is not None:
            cause = err[1].__cause__
            self._sink.send(raised_event((type(cause), cause, cause.__traceback__),
                                         status="error", phase=err[1].phase))
        else:
            self._sink.send(raised_event(err, status=status))

    def addSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802 - unittest's naming
        self.report_success()

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        self.report_raised(err, status="")

    def addError(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        self.report_raised(err, status="error")

    def addSkip(self, test: Any, reason: str) -> None:  # noqa: N802
        if getattr(test, "test_case", None) is not None:  # a skipped grid point (subTest)
            self._sink.send(Event("subtest", reason, _params_of(test), "skip"))
        else:
            self.report_skip(reason)

    def addSubTest(self, test: unittest.TestCase, subtest: Any, err: Any) -> None:  # noqa: N802
        params = _params_of(subtest)
        if err is None:
            self._sink.send(Event("subtest", "", params, "pass"))
            return
        skip = skip_exit_reason(err)
        if skip is not None:
            self._sink.send(Event("subtest", skip, params, "skip"))
        else:
            self._sink.send(raised_event(err, "subtest", "fail", params=params))

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        self.failed = True
        self._sink.send(raised_event(err, "expected_failure", status=""))

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        self._sink.send(Event("unexpected_success"))

    def add_exit(self, code: int) -> None:
        """The test called sys.exit(code) in this rank (upstream: its process's exit code)."""
        self.failed = True
        self._sink.send(Event("exit", count=code))


def _params_of(subtest: Any) -> Dict[str, Any]:
    return picklable_params(dict(getattr(subtest, "params", {}) or {}))


class RecordSink:
    """A sink that appends each event to a RankRecord in memory: the stand-in for a pipe
    where the rank and its record live in one process (threads, torchrun)."""

    def __init__(self, record: RankRecord) -> None:
        self.record = record

    def send(self, event: Event) -> None:
        if self.record.stopped and event.kind != "done":
            return  # the fallout of being stopped; the stack taken before says more
        if fails_rank(event):
            self.record.problem_at = min(self.record.problem_at, time.monotonic())
        self.record.events.append(event)

    @property
    def failed(self) -> bool:
        """Whether the rank reported a failure of the test (grid points aside)."""
        return any(fails_rank(e) for e in self.record.events)
