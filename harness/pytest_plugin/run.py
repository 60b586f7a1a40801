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
import unittest
from dataclasses import dataclass
from typing import Hashable, List, Optional, Tuple

from harness import settings
from harness.launch.job import Job, timeout_before
from harness.launch.launcher import Launcher
from harness.outcome.merge import decide
from harness.outcome.rank_record import RankRecord
from harness.outcome.replay import RankError
from harness.outcome.report import ERROR, SKIPPED, Outcome, RankReport, TestReport
from harness.process import shared
from harness.process.launchers import FreshProcesses, SharedProcesses, process_launcher
from harness.pytest_plugin import rank_program
from harness.pytest_plugin.call import FunctionCall
from harness.single_process.testcase import ProcessState, current_seed, seed_everything
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


class RanksFailure(Exception):
    """The ranks failed a marked test (or a pool call): raised in the pytest process with the
    test's report, as one of two classes, which unittest's distinction decides and pytest's
    `xfail(raises=...)` matches: `RanksFailed`, an AssertionError, when the lead rank failed an
    assertion; `RanksErred`, a RuntimeError (RankError, as the classes' errors), when it
    raised anything else or the test timed out."""

    def __init__(self, report: TestReport) -> None:
        super().__init__(report.own.detail)
        self.report = report

    @property
    def lead(self) -> Optional[RankReport]:
        """The failure in parts: the rank that leads it, its message, frames and sections."""
        return self.report.own.lead


class RanksFailed(RanksFailure, AssertionError):
    """The lead rank failed an assertion."""


class RanksErred(RanksFailure, RankError):
    """The lead rank raised something other than an assertion, or the test timed out."""


def raised_for(report: TestReport) -> RanksFailure:
    """The exception that tells pytest the ranks failed `report`'s test."""
    return RanksErred(report) if report.own.status == ERROR else RanksFailed(report)


@dataclass
class FunctionRun:
    """What running a call on its ranks gave: the test's report; every rank's record (their
    output goes into pytest's report); for thread ranks, which share this process, the state
    they left behind that fails the test (ProcessState.restore), else None."""

    report: TestReport
    records: List[RankRecord]
    leaked: Optional[str] = None


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
        method=rank_program.METHOD, world_size=world_size, timeout=_test_timeout(timeout),
        inputs=call, devices=call.devices, shared_key=shared_key, local_class=program,
    )
    launcher = _launcher(mode)
    state: Optional[ProcessState] = None
    if mode == "threads":  # the ranks share this process: seeded once, its state kept
        seed_everything(current_seed())
        state = ProcessState()
    try:
        launcher.start(job)
        # what is left of a runner's time once the ranks started (a new set takes some)
        records, timed_out_after = launcher.join(job.with_timeout(_capped(job.timeout, deadline)))
    except unittest.SkipTest as skip:  # the ranks cannot run here (torchrun's other world size)
        reason = str(skip)
        return FunctionRun(TestReport(call.test_id, status=SKIPPED, message=reason,
                                      own=Outcome(SKIPPED, reason)), [])
    finally:
        launcher.close()
        leaked = state.restore() if state is not None else None
    report = decide(records, timed_out_after, test_id=call.test_id)
    if report.failed and shared_key is not None:
        # A test that failed on shared ranks may have left them in any state: the next test
        # gets new ones (crashes, hangs and leaks already retire a set).
        shared.OPEN_RANKS.stop(shared_key)
    return FunctionRun(report, list(records), leaked)


def _launcher(mode: str) -> Launcher:
    if mode == "threads":
        return ThreadRanks()
    return process_launcher(SharedProcesses() if mode == "shared" else FreshProcesses())


def _test_timeout(declared: Optional[float]) -> float:
    """The test's limit: the marker's, else the harness's default; a week under
    `--debug-rank`."""
    if settings.debug_rank() is not None:
        return settings.DEBUG_TIMEOUT_S
    return float(declared) if declared is not None else settings.default_timeout()


def _capped(timeout: float, deadline: Optional[float]) -> float:
    """`timeout`, early enough before a runner's `deadline` for the harness's report."""
    if deadline is None or settings.debug_rank() is not None:
        return timeout
    return min(timeout, timeout_before(deadline - time.monotonic()))
