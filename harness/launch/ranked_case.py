"""RankedTestCase: what every multi-rank case shares, whichever launcher runs its ranks.

A test of a multi-rank class exists twice, with upstream's lifecycle. The instance the test
runner holds supervises: its setUp, tearDown and cleanups run once, here; it builds its Job
(`job()`: the class and method each rank re-creates, harness/launch/job.py) and the class's
launcher (`make_launcher()`) starts the ranks when setUp calls upstream's `_spawn_processes()`
/ `_spawn_threads()` (or, if it does not, when the test method begins), so the ranks see the
environment setUp prepared; the test method joins them and turns their records into the
test's TestReport (harness/outcome/merge.py), handed to the runner's result and replayed into
unittest's API (`report_outcome`). Each rank runs its own instance, which the launcher hands
a RankContext (`attach_rank`) and runs (`run`, the RankHooks, harness/launch/hooks.py): there
only the test method runs, between the base's own rank set-up and tear-down (`rank_set_up`,
`rank_tear_down`: FSDPTest's group, a thread's `perThreadSetUp`), never the class's setUp or
tearDown. Modes differ only in their launcher and in what a rank needs attached, so a new
mode is a new Launcher.
"""

from __future__ import annotations

import inspect
import time
from typing import Any, FrozenSet, List, Optional, Tuple

from harness import settings
from harness.compat import unittest_internals
from harness.launch.context import RankContext
from harness.launch.job import Job, timeout_before
from harness.launch.launcher import Launcher, RankSetup
from harness.launch.routing import route_test_method
from harness.outcome.fold import hand_report
from harness.outcome.merge import decide
from harness.outcome.rank_record import RankRecord, exit_ends_rank
from harness.outcome.replay import replay
from harness.outcome.report import TestReport
from harness.requirements.decorators import check_case_requirements
from harness.requirements.world_size import (
    BaseWorldSize,
    fix_world_size,
    world_size_of,
    wrap_world_size,
)
from harness.single_process.testcase import TestCase, current_seed, seed_everything

# unittest and pytest hide frames of modules that define these, as unittest does for its
# own: a multi-rank failure then shows the rank's traceback, not the supervisor's.
__unittest = True
__tracebackhide__ = True

SUPERVISOR_RANK = -1
class RankedTestCase(unittest_internals.TestHooks, TestCase):
    """A test run once per rank by a launcher; the runner's instance supervises.

    `self.rank` is SUPERVISOR_RANK in the supervisor and the rank's number in a rank;
    `rank_records` holds every rank's record once the test joined them.
    """

    # In a rank, what its launcher told it (`attach_rank`); None in the supervisor.
    rank_context: Optional[RankContext] = None
    timeout: float = settings.DefaultTimeout()  # type: ignore[assignment]  # seconds; classes may set
    # A runner's own limit on this test (time.monotonic()), e.g. pytest-timeout's: the ranks are
    # stopped early enough for the harness's hang report to be what the user sees.
    deadline: Optional[float] = None
    timeout_cap: Optional[float] = None  # what meeting the deadline leaves (settings.test_timeout)
    # How many ranks run the test (classes override it, as an int or a property): the base's
    # default; once a run decided the number (harness/requirements/world_size.py), that number.
    world_size: int = BaseWorldSize()  # type: ignore[assignment]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        wrap_world_size(cls)  # `self.world_size` reads the number the ranks run with

    def __init__(
        self, method_name: str = "runTest", methodName: str = "runTest"  # noqa: N803 - unittest's
    ) -> None:
        # Both spellings, as upstream: unittest's `methodName` wins when given.
        super().__init__(methodName if methodName != "runTest" else method_name)
        assign(self, "rank", SUPERVISOR_RANK)
        self.rank_records: List[RankRecord] = []
        self.ranks_timed_out_after: Optional[float] = None  # with rank_records: the timeout hit
        self._launcher: Optional[Launcher] = None
        self._job: Optional[Job] = None  # what the launcher runs, once the ranks started
        self._result: Any = None  # the result this run reports to (see `run`)
        self._exited_early = False  # in a rank: its test method called sys.exit(0)
        self._settings_fixed = False  # the supervisor checked the settings, fixed the world size
        route_test_method(self, self._join_ranks)

    @property
    def is_master(self) -> bool:
        """Whether this is rank 0 (False in the supervisor)."""
        return self.rank == 0

    def make_launcher(self) -> Launcher:
        """The launcher that runs this class's ranks (each mode's base says which)."""
        raise NotImplementedError(f"{type(self).__name__} does not say how its ranks run")

    def run(self, result: Any = None) -> Any:
        """unittest's run, remembering the result it reports to: the supervisor hands that
        result the test's report (`report_outcome`)."""
        self._result = result
        try:
            return super().run(result)
        finally:
            self._result = None

    def setUp(self) -> None:
        super().setUp()  # TestCase's: the declared requirements, checked once per test
        # A test that cannot run here skips before the rest of the class's setUp.
        self._fix_rank_settings()

    def checked_rank_settings(self) -> Tuple[int, float]:
        """(world_size, timeout), checked before any rank starts: a world size of 0 skips, a
        bad world size or timeout is a one-line config error (bases add their own checks)."""
        return settings.checked_rank_settings(self, world_size_of(self))

    def _fix_rank_settings(self) -> None:
        fix_world_size(self, self.checked_rank_settings()[0])
        self._settings_fixed = True

    def start_ranks(self) -> None:
        """Start the ranks (supervisor only; a no-op in a rank and once started)."""
        if self.rank_context is not None or self._launcher is not None:
            return
        if not self._settings_fixed:  # a subclass's setUp that did not call ours
            check_case_requirements(self)
            self._fix_rank_settings()
        launcher = self.make_launcher()
        self._launcher = launcher
        # Also when a subclass's setUp fails after this; after the test's tearDown and the
        # cleanups it added later (they may still read `self.file_name`, as upstream's do).
        self.addCleanup(launcher.close)
        self._job = self.job()
        try:
            setup = launcher.start(self._job)
        except BaseException:
            launcher.close()
            raise
        self.describe_run(setup)

    def job(self) -> Job:
        """This test as its launcher runs it: the class, found in each rank by name, runs
        its test method there."""
        cls = type(self)
        return Job(
            test_id=self.id(), module=cls.__module__, qualname=cls.__qualname__,
            method=unittest_internals.method_name(self), world_size=self.world_size,
            timeout=settings.test_timeout(self),
            shared_key=self.shared_ranks_key(), fake_pg=bool(getattr(cls, "fake_pg", False)),
            local_class=cls,
        )

    def shared_ranks_key(self) -> Any:
        """Which set of shared ranks runs this test; None: ranks of its own."""
        return None

    def reported_name(self) -> str:
        """The test's name in what a rank reports about it (a leak): its method's."""
        return unittest_internals.method_name(self)

    def waived_leak_checks(self) -> FrozenSet[str]:
        """In a shared rank, after the test: the leak checks this one test waives (a class
        waives its own for every test: `skip_leak_checks`, harness/process/leaks.py)."""
        return frozenset()

    def describe_run(self, setup: RankSetup) -> None:
        """In the supervisor, once the ranks started: show what the launcher set up as the
        attributes upstream's bases have (process cases: `file_name`, `processes`)."""

    def _join_ranks(self) -> None:
        """The supervisor's test method: start the ranks unless setUp did, wait for them,
        report their verdict."""
        self.start_ranks()
        launcher, job = self._launcher, self._job
        assert launcher is not None and job is not None
        self._meet_deadline()
        try:
            records, timed_out_after = launcher.join(job.with_timeout(settings.test_timeout(self)))
        except BaseException:  # KeyboardInterrupt too: nothing a test started outlives it
            launcher.close()
            raise
        launcher.finish()  # the rest (the rendezvous file) goes after tearDown and cleanups
        self.rank_records = records
        self.ranks_timed_out_after = timed_out_after
        self._judge_ranks()

    def _judge_ranks(self) -> None:
        """Turn `rank_records` into the test's outcome (process cases add upstream's
        return-code API around it)."""
        self.report_outcome(decide(self.rank_records, self.ranks_timed_out_after,
                                   test_id=self.id()))

    def report_outcome(self, report: TestReport) -> None:
        """The supervisor's last step: hand the test's report to the run's result when it
        takes one (`add_report`: the harness's reporters read that), then replay it into
        unittest's API (what plain unittest runners and pytest see).

        A test expected to fail (`unittest.expectedFailure`, pytest's `xfail` mark under the
        harness's runners) is judged by unittest from the replay alone: the failure it expects
        is then no failure of the run."""
        if not self._expecting_failure():
            hand_report(self._result, self, report)
        replay(self, report)

    def _expecting_failure(self) -> bool:
        method = getattr(self, unittest_internals.method_name(self), None)
        return any(map(unittest_internals.expects_failure, (method, self)))

    def _meet_deadline(self) -> None:
        """Cap the timeout so that the ranks are stopped and reported before `deadline`."""
        if self.deadline is None:
            return
        self.timeout_cap = timeout_before(self.deadline - time.monotonic())

    def attach_rank(self, context: RankContext) -> None:
        """Make this instance the rank `context` describes (the launcher calls it before
        running the case); subclasses add what their ranks need."""
        self.rank_context = context
        assign(self, "rank", context.rank)
        fix_world_size(self, context.world_size)

    # --- in a rank: unittest's run, with the rank's own set-up instead of the class's --------
    def rank_set_up(self) -> None:
        """In a rank, in place of setUp: what upstream's ranks do before the test method
        (seed, as its `run_test`); bases add their group."""
        seed_everything(current_seed())

    def rank_tear_down(self) -> None:
        """In a rank, in place of tearDown: what the base undoes after the test method."""

    def call_set_up(self) -> None:
        if self.rank_context is None:
            super().call_set_up()
        else:
            self.rank_set_up()

    def call_test_method(self, method: Any) -> None:
        if self.rank_context is None:
            super().call_test_method(method)
            return
        try:
            super().call_test_method(method)
        except SystemExit as exit_:
            # Upstream's rank process just ends, with that exit code (0: a pass), without
            # the base's tear-down: so does this rank. A skip code is unittest's skip.
            if not exit_ends_rank(exit_.code):
                raise
            self._exited_early = True
            if exit_.code:
                self.rank_context.result.add_exit(exit_.code)

    def call_tear_down(self) -> None:
        if self.rank_context is None:
            super().call_tear_down()
        elif not self._exited_early:
            self.rank_tear_down()

    def rank_failed(self) -> bool:
        """In a rank: whether this test already failed here, so peers may be out of step."""
        return self.rank_context is not None and self.rank_context.failed


def assign(case: Any, name: str, value: Any) -> None:
    """Set `case.name`, unless its class defines `name` as a read-only property (upstream's
    own bases do for `init_method`, suites for `world_size` or `rank`): that one wins."""
    declared = inspect.getattr_static(type(case), name, None)
    if isinstance(declared, property) and declared.fset is None:
        return
    setattr(case, name, value)
