"""A TestReport replayed into unittest's result API: the adapter for runners that know only
unittest's events (plain unittest runners, pytest).

The supervising case of a multi-rank test (harness/launch/ranked_case.py) hands its report to a
result that takes it (`add_report`, fold.py) and then replays it here: every grid point
becomes the case's subTest with its params (failing points reported one by one), then the
case fails, errs or skips as the test itself did. The harness's own reporters read the
report, not this replay.
"""

from __future__ import annotations

import unittest
from typing import Optional

from harness.outcome.report import ERROR, FAILED, SKIPPED, RankReport, TestReport

# unittest (and pytest) hide frames of modules that define these: a report's traceback is the
# ranks' story, not the frames that raise it here.
__unittest = True
__tracebackhide__ = True


class RankError(RuntimeError):
    """A rank raised an exception other than an assertion's: the test is an error, as
    unittest reports such an exception in a single process (upstream raises RuntimeError)."""


def replay(case: unittest.TestCase, report: TestReport) -> None:
    """Report `report` as `case`'s own outcome, through unittest's API (run inside the case's
    test method)."""
    for point in report.points:
        with case.subTest(**point.params):
            if point.status == FAILED:
                raise replaying(case.failureException(point.text), report, point.lead)
            if point.status == SKIPPED:
                raise unittest.SkipTest(point.text)
    own = report.own
    if own.status == FAILED:
        raise replaying(case.failureException(own.detail), report, own.lead)
    if own.status == ERROR:
        raise replaying(RankError(own.detail), report, own.lead)
    if own.status == SKIPPED:
        raise unittest.SkipTest(own.message)


def replaying(
    error: BaseException, report: TestReport, lead: Optional[RankReport] = None
) -> BaseException:
    """`error`, carrying its report in parts (`rank_report`, read by harness/pytest_plugin.py)
    and the TestReport it replays (so that a result that took the report ignores it)."""
    error.rank_report = lead  # type: ignore[attr-defined]
    error.replays = report  # type: ignore[attr-defined]
    return error


def rank_report(error: BaseException) -> Optional[RankReport]:
    """The report in parts a multi-rank failure carries, else None."""
    lead = getattr(error, "rank_report", None)
    return lead if isinstance(lead, RankReport) else None


def replayed_report(error: BaseException) -> Optional[TestReport]:
    """The TestReport an exception of the replay stands for, else None."""
    report = getattr(error, "replays", None)
    return report if isinstance(report, TestReport) else None
