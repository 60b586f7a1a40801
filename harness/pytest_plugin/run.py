"""A marked function's call run on its ranks, from the pytest process: a Job, a launcher, a
TestReport, across pytest's phases (`StartedRun`: started in set-up, joined in the call).

The plugin builds a Job (harness/launch/job.py) from the FunctionCall: each rank runs the
mode's rank program (harness/pytest_plugin/rank_program.py) with the call as its inputs. The
launcher of the mode (fresh processes, or torchrun's when torchrun started this process;
shared processes; threads) starts and joins the ranks; `decide` (harness/outcome/merge.py)
turns their records into the test's one TestReport, which the plugin hands to pytest
(functions.py raises `RanksFailed` with it, report.py lays it out). No unittest case is made
here: the pytest process only supervises.
"""

from __future__ import annotations

import contextlib
import time
import unittest
from dataclasses import dataclass
from typing import Hashable, List, Optional, Tuple

from harness import settings
from harness.launch.fail_fast import ended_test
from harness.launch.job import Job, timeout_before
from harness.launch.launcher import Launcher
from harness.outcome.merge import decide
from harness.outcome.rank_record import SET_UP, RankRecord
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
    """Run `call` on `world_size` ranks of `mode` at once (`timeout`: seconds, else the
    harness's default; `deadline`: a runner's own limit, time.monotonic(); `shared_key`: the
    set of shared ranks that runs it)."""
    return StartedRun(call, mode, world_size, timeout, deadline, shared_key).finish(deadline)


class StartedRun:
    """A marked function's ranks, started and not yet joined. pytest's set-up phase starts
    them and waits until each rank's own fixtures are set up (`wait_for_set_up`), so that a
    rank fixture's failure is reported in that phase; the call phase joins them (`finish`),
    as a test class starts its ranks in setUp and joins them in its test method. `resources`
    (the devices leased for the run) are released once the run is finished or closed."""

    def __init__(
        self, call: FunctionCall, mode: str, world_size: int, timeout: Optional[float],
        deadline: Optional[float], shared_key: Optional[Hashable] = None,
        resources: Optional[contextlib.ExitStack] = None,
    ) -> None:
        program = rank_program.MODE_PROGRAMS[mode]
        self.job = Job(
            test_id=call.test_id, module=program.__module__, qualname=program.__qualname__,
            method=rank_program.METHOD, world_size=world_size, timeout=_test_timeout(timeout),
            inputs=call, devices=call.devices, shared_key=shared_key, local_class=program,
        )
        self.result: Optional[FunctionRun] = None
        self._launcher = _launcher(mode)
        self._resources = resources or contextlib.ExitStack()
        self._state: Optional[ProcessState] = None
        if mode == "threads":  # the ranks share this process: seeded once, its state kept
            seed_everything(current_seed())
            self._state = ProcessState()
        # the time the ranks get, from their start: a runner's own limit leaves less
        self._limit = _capped(self.job.timeout, deadline)
        self._began = time.monotonic()
        try:
            self._launcher.start(self.job)
        except unittest.SkipTest as skip:  # the ranks cannot run here (torchrun's world size)
            reason = str(skip)
            self._close()
            self.result = FunctionRun(TestReport(call.test_id, status=SKIPPED, message=reason,
                                                 own=Outcome(SKIPPED, reason)), [])
        except BaseException:
            self._close()
            raise

    def wait_for_set_up(self) -> Optional[FunctionRun]:
        """Wait until every rank's own fixtures are set up or a rank ended the test; the
        finished run when that decided it (a rank fixture failed in set-up) or when the ranks
        run only inside the join (torchrun's rank, which runs the whole test here), else None:
        the call phase joins them."""
        if self.result is not None:
            return self.result
        try:
            records = self._launcher.wait_until(set_up_or_ended, self._left())
        except BaseException:
            self._close()
            raise
        if records is None or any(failed_setting_up(record) for record in records):
            return self.finish(None)
        return None

    def finish(self, deadline: Optional[float]) -> FunctionRun:
        """Join the ranks (what is left of their time; less where a runner's `deadline`
        leaves less), decide the test's report, release what the run held."""
        if self.result is not None:
            return self.result
        left, limit = self._left(), self._limit
        capped = _capped(left, deadline)
        if capped < left:  # the runner's deadline stops the ranks first: say so
            left = limit = capped
        try:
            records, timed_out = self._launcher.join(self.job.with_timeout(left))
        finally:
            leaked = self._close()
        report = decide(records, limit if timed_out is not None else None,
                        test_id=self.job.test_id)
        if report.failed and self.job.shared_key is not None:
            # A test that failed on shared ranks may have left them in any state: the next
            # test gets new ones (crashes, hangs and leaks already retire a set).
            shared.OPEN_RANKS.stop(self.job.shared_key)
        self.result = FunctionRun(report, list(records), leaked)
        return self.result

    def _left(self) -> float:
        """What is left of the ranks' time (from their start)."""
        return max(0.0, self._limit - (time.monotonic() - self._began))

    def close(self) -> None:
        """Stop whatever still runs and release what the run held (a run never joined: the
        test ended in its set-up); safe after `finish`."""
        if self.result is None:
            self._close()

    def _close(self) -> Optional[str]:
        """The launcher closed, this process's state given back (what the thread ranks
        leaked), the run's resources released."""
        try:
            self._launcher.close()
        finally:
            state, self._state = self._state, None
            leaked = state.restore() if state is not None else None
            self._resources.close()
        return leaked


def set_up_or_ended(records: List[RankRecord]) -> bool:
    """Whether a rank ended the test (failed, skipped, exited) or every rank's own fixtures
    are set up: what pytest's set-up phase waits for."""
    if any(record.finished or record.exitcode is not None or ended_test(record)
           for record in records):
        return True
    return all(any(event.kind == SET_UP for event in record.events) for record in records)


def failed_setting_up(record: RankRecord) -> bool:
    """Whether this rank's own fixtures failed to set up (pytest's "ERROR at setup")."""
    return any(event.failure is not None and event.failure.phase == "setup"
               for event in record.raised())


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
