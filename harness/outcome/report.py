"""TestReport: the one record of one test's outcome, built once and read by every reporter.

A multi-rank test's report is built by `decide` (merge.py) from its ranks' records; a plain
test's, and a class or module fixture's, by `ReportBuilder` (fold.py) from unittest's events.
Whichever built it, the progress line, the summary table, the closing tally, the JUnit XML
and a parallel worker's messages (`to_json`/`from_json`) read this object, never unittest's
events again. A test is one report however many grid points it ran: each point is a
`PointReport` in it, and the fold rule (fold.py) decides the test's status from them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from harness.outcome.stacks import Frame

PASSED, FAILED, ERROR, SKIPPED = "passed", "failed", "error", "skipped"
PROBLEMS = (FAILED, ERROR)  # the statuses that fail a run


class Shown(str):
    """A parameter value that could not cross to another process, kept as its repr so it
    displays the same."""

    def __repr__(self) -> str:
        return str(self)


_JSON_SAFE = (str, int, float, bool, type(None))


def params_to_json(params: Dict[str, Any]) -> Dict[str, List[Any]]:
    """Grid-point params as JSON data: each value tagged "v" (kept as is) or "r" (its repr:
    an object JSON cannot carry, or a tuple that would come back a list)."""
    return {
        name: ["v", value] if type(value) in _JSON_SAFE else ["r", repr(value)]
        for name, value in params.items()
    }


def params_from_json(data: Dict[str, List[Any]]) -> Dict[str, Any]:
    """The params `params_to_json` wrote; a value that travelled as its repr comes back `Shown`."""
    return {name: value if tag == "v" else Shown(value) for name, (tag, value) in data.items()}


def params_text(params: Dict[str, Any]) -> str:
    """`a=1, b='x'`: how a grid point is named in messages and reports."""
    return ", ".join(f"{name}={value!r}" for name, value in params.items())


class RankReport(NamedTuple):
    """A multi-rank failure's report in parts, for runners that lay it out themselves (the
    pytest plugin): what failed first (`label`: "rank 1"; `message`: its exception line, or
    what happened to it), where (`frames`, oldest first, harness frames hidden) and the other
    sections, titled."""

    label: str
    message: str
    frames: List[Frame]
    sections: List[Tuple[str, str]]
    hang: bool = False  # the test timed out: `frames` are where the rank waits
    phase: str = ""  # "setup"/"teardown": in the test's own fixtures, in the rank
    # the lead rank's exception class (module, qualified name); empty when it raised none
    exc_class: Tuple[str, str] = ("", "")

    def to_data(self) -> Dict[str, Any]:
        return {"label": self.label, "message": self.message,
                "frames": [list(f) for f in self.frames],
                "sections": [list(s) for s in self.sections], "hang": self.hang,
                "phase": self.phase, "exc_class": list(self.exc_class)}

    @classmethod
    def from_data(cls, data: Dict[str, Any]) -> RankReport:
        return cls(data["label"], data["message"], [Frame(*f) for f in data["frames"]],
                   [(title, text) for title, text in data["sections"]], data["hang"],
                   data["phase"], tuple(data["exc_class"]))  # type: ignore[arg-type]


class Outcome(NamedTuple):
    """How a test itself ended, its grid points aside (for a skip, `message` is the reason):
    what a replay into unittest's API re-raises after the grid points."""

    status: str = PASSED
    message: str = ""
    detail: str = ""
    exc_type: str = ""
    lead: Optional[RankReport] = None

    def to_data(self) -> List[Any]:
        return [self.status, self.message, self.detail, self.exc_type,
                None if self.lead is None else self.lead.to_data()]

    @classmethod
    def from_data(cls, data: List[Any]) -> Outcome:
        *fields, lead = data
        return cls(*fields, None if lead is None else RankReport.from_data(lead))


@dataclass
class PointReport:
    """One grid point of a test (a subTest): passed, failed (`text`: its traceback, or what
    each rank reported) or skipped (`text`: the reason)."""

    params: Dict[str, Any]
    status: str  # passed | failed | skipped
    text: str = ""
    exc_type: str = ""  # the failure's exception type
    lead: Optional[RankReport] = None  # a multi-rank failure's report in parts

    def to_data(self) -> Dict[str, Any]:
        return {"params": params_to_json(self.params), "status": self.status, "text": self.text,
                "exc_type": self.exc_type,
                "lead": None if self.lead is None else self.lead.to_data()}

    @classmethod
    def from_data(cls, data: Dict[str, Any]) -> PointReport:
        lead = data["lead"]
        return cls(params_from_json(data["params"]), data["status"], data["text"],
                   data["exc_type"], None if lead is None else RankReport.from_data(lead))


@dataclass
class TestReport:
    """Everything reported about one test (or one class/module fixture, or a failed import).

    `message` is one line (why it failed, or the skip reason); `detail` the full text
    (tracebacks, the ranks' report, failing grid points with their parameters); `points`
    every grid point it ran, in order; `own` how the test itself ended. Reporters read the
    first fields: the fold (fold.py) made them from `points` and `own`.
    """

    __test__ = False  # not a test class, whatever pytest's name rules say

    test_id: str
    suite: str = ""
    status: str = PASSED  # passed | failed | error | skipped
    message: str = ""
    detail: str = ""
    exc_type: str = ""
    duration: float = 0.0
    points: List[PointReport] = field(default_factory=list)
    lead: Optional[RankReport] = None  # a multi-rank failure's report in parts
    own: Outcome = Outcome()

    @property
    def failed(self) -> bool:
        return self.status in PROBLEMS

    @property
    def grid_points(self) -> int:
        return len(self.points)

    def to_json(self) -> str:
        """The report as one line of JSON; params JSON cannot carry travel as their repr."""
        return json.dumps(self.to_data())

    @classmethod
    def from_json(cls, text: str) -> TestReport:
        """The report `to_json` wrote (a param that travelled as its repr comes back `Shown`)."""
        return cls.from_data(json.loads(text))

    def to_data(self) -> Dict[str, Any]:
        """The report as JSON data (a part of a larger message: a -j worker's)."""
        return {
            "test_id": self.test_id, "suite": self.suite, "status": self.status,
            "message": self.message, "detail": self.detail, "exc_type": self.exc_type,
            "duration": self.duration, "points": [p.to_data() for p in self.points],
            "lead": None if self.lead is None else self.lead.to_data(),
            "own": self.own.to_data(),
        }

    @classmethod
    def from_data(cls, data: Dict[str, Any]) -> TestReport:
        data = dict(data)
        lead = data.pop("lead")
        points = [PointReport.from_data(p) for p in data.pop("points")]
        own = Outcome.from_data(data.pop("own"))
        return cls(**data, points=points, own=own,
                   lead=None if lead is None else RankReport.from_data(lead))
