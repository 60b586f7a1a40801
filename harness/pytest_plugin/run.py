"""A marked function's call run on its ranks, from the pytest process: a Job, a launcher, a
TestReport.

The plugin builds a Job (harness/launch/job.py) from the FunctionCall: each rank runs the
mode's rank program (harness/pytest_plugin/rank_program.py) with the call as its inputs. The
launcher of the mode (fresh processes, or torchrun's when torchrun started this process;
shared processes; threads) starts and joins the ranks; `decide` (harness/outcome/merge.py)
turns their records into the test's one TestReport, which the plugin hands to pytest
(functions.py raises `RanksFailed` with it, report.py lays it out). No unittest case is made
here: the pytest process only supervises.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Hashable, List, Optional, Tuple

from harness import settings
from harness.launch.job import Job
from harness.launch.launcher import Launcher
from harness.launch.ranked_case import timeout_before
from harness.outcome.merge import decide
from harness.outcome.rank_record import RankRecord
from harness.outcome.report import ERROR, RankReport, TestReport
from harness.process import shared
from harness.process.launchers import FreshProcesses, SharedProcesses, process_launcher
from harness.pytest_plugin import rank_program
from harness.pytest_plugin.call import FunctionCall
from harness.threads.launcher import ThreadRanks

# pytest hides frames of modules that define this: a failure is the ranks' story.
__tracebackhide__ = True


@dataclass(frozen=True)
class SharedKey:
    """Which set of shared ranks runs a marked test: one per (module, world size, devices,
    backend, init), so that every test sent to a set wants the group it has."""

    module: str
    world_size: int
    device_type: str
    devices: Tuple[int, ...]
    backend: str
    init: bool
    pool: bool = False  # rank_pool's sets are its own: they live for the session


class RanksFailed(AssertionError):
    """The ranks failed a marked test: raised in the pytest process with the test's report.
    An assertion's failure as pytest counts it; `RanksErred` when the lead rank's exception
    was not an assertion's (or the test timed out), as unittest tells the two apart."""

    def __init__(self, report: TestReport) -> None:
        super().__init__(report.own.detail)
        self.report = report

    @property
    def lead(self) -> Optional[RankReport]:
        """The failure in parts: the rank that leads it, its message, frames and sections."""
        return self.report.own.lead


class RanksErred(RanksFailed):
    """The ranks failed a marked test with an error (not an assertion's) or a timeout."""


def raised_for(report: TestReport) -> RanksFailed:
    """The exception that tells pytest the ranks failed `report`'s test."""
    return RanksErred(report) if report.own.status == ERROR else RanksFailed(report)


@dataclass
class FunctionRun:
    """What running a call on its ranks gave: the test's report, and every rank's record
    (their output goes into pytest's report)."""

    report: TestReport
    records: List[RankRecord]


def run_on_ranks(
    call: FunctionCall, mode: str, world_size: int, timeout: Optional[float],
    deadline: Optional[float], shared_key: Optional[Hashable] = None,
) -> FunctionRun:
    """Run `call` on `world_size` ranks of `mode` (`timeout`: seconds, else the harness's
    default; `deadline`: a runner's own limit, time.monotonic(); `shared_key`: the set of
    shared ranks that runs it)."""
    program = rank_program.MODE_PROGRAMS[mode]
    job = Job(
        test_id=call.test_id, module=program.__module__, qualname=program.__qualname__,
        method=rank_program.METHOD, world_size=world_size,
        timeout=_test_timeout(timeout, deadline), inputs=call, devices=call.devices,
        shared_key=shared_key, local_class=program,
    )
    launcher = _launcher(mode)
    try:
        launcher.start(job)
        records, timed_out_after = launcher.join(job)
    finally:
        launcher.close()
    report = decide(records, timed_out_after, test_id=call.test_id)
    if report.failed and shared_key is not None:
        # A test that failed on shared ranks may have left them in any state: the next test
        # gets new ones (crashes, hangs and leaks already retire a set).
        shared.OPEN_RANKS.stop(shared_key)
    return FunctionRun(report, list(records))


def _launcher(mode: str) -> Launcher:
    if mode == "threads":
        return ThreadRanks()
    return process_launcher(SharedProcesses() if mode == "shared" else FreshProcesses())


def _test_timeout(declared: Optional[float], deadline: Optional[float]) -> float:
    """The test's limit: the marker's, else the harness's default; a week under
    `--debug-rank`; early enough before a runner's `deadline` for the harness's report."""
    if settings.debug_rank() is not None:
        return settings.DEBUG_TIMEOUT_S
    timeout = float(declared) if declared is not None else settings.default_timeout()
    if deadline is not None:
        timeout = min(timeout, timeout_before(deadline - time.monotonic()))
    return timeout
