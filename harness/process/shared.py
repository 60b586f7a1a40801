"""Shared-process mode: one set of rank processes per test class, each test sent to it.

The parent side of MultiProcContinuousTest (harness/process/continuous.py). A class's
ranks start on its first test (forks of the preloaded forkserver,
harness/process/forkserver.py), create the default group once (the class's
`shared_rank_start`), then run each test they are sent
(harness/process/rank.py `serve`). Every test's events are supervised and reported exactly as in the
fresh-process mode (same RankGroup, RankRecord and outcome rules); what shared processes add
is deciding when the set can no longer be trusted:

- a rank that crashed, exited or was stopped (fail fast, timeout) fails that test with the
  fresh mode's report, and the class's next test starts a new set;
- before each test the ranks meet (barrier) and say "ready"; a reused set that does not
  within READY_TIMEOUT_S (a group a previous test left broken) is replaced, and the test
  runs on the new set: it is not the test's fault.

Nothing outlives the class: `OPEN_RANKS` (an `OpenRanks`) keeps each class's set between its
tests, and `stop(cls)` (tearDownClass) and `stop_all()` (the runner's scope, and at exit)
kill the ranks and remove their private dir; a test interrupted while it runs stops its
class's ranks itself.
"""

from __future__ import annotations

import atexit
from typing import Callable, Dict, Hashable, List, Optional, Tuple

from harness.launch.job import Job
from harness.launch.launcher import RankSetup
from harness.outcome.rank_record import RankRecord
from harness.process import leaks
from harness.process.supervisor import RankGroup

READY_TIMEOUT_S = 10.0  # how long a reused set may take to meet before a test
FINISH_GRACE_S = 5.0  # how long a set that is stopped may take to end itself (its teardown)


class SharedRanks:
    """One set of rank processes (a class's, a pytest module's), started lazily and replaced
    when broken; `program` is what its ranks run: the job's (module, class)."""

    def __init__(self, program: Tuple[str, str], world_size: int) -> None:
        self.program = program
        self.world_size = world_size
        self.group: Optional[RankGroup] = None
        self.starts = 0  # how many sets were started (a new one after each broken one)
        self._reused = False  # the current test went to ranks that ran an earlier one

    def send_test(self, job: Job) -> RankSetup:
        """Have the ranks start `job`'s test (starting them if there are none, or if they can
        no longer be reached); `finish_test` collects it. Sent from the parent's setUp, so the
        ranks begin while the parent finishes setting up. Returns the test's rendezvous file
        and the ranks' processes, as the fresh mode's launcher does."""
        group = self.group
        self._reused = group is not None and group.send_test(job)
        if not self._reused:
            self.close()
            group = self._start(job)
            group.send_test(job)  # a rank gone: supervise says so
        assert group is not None
        return RankSetup(group.test_file(), group.processes)

    def _meeting(self, job: Job) -> RankGroup:
        """The group running the test, once a reused set met for it (a set that cannot meet is
        replaced, and the test sent to the new one); asked once per test."""
        group = self.group
        if group is None:
            raise RuntimeError(f"{job.test_id}: the test was not sent to the ranks")
        if self._reused and not group.wait_ready(READY_TIMEOUT_S):
            self.close()  # a broken set: run the test on new ranks instead
            group = self._start(job)
            group.send_test(job)
        self._reused = False
        return group

    def wait_until(
        self, job: Job, reached: Callable[[List[RankRecord]], bool], timeout: float
    ) -> List[RankRecord]:
        """The test's records once `reached(records)` holds, every rank ended, or `timeout`
        seconds passed (RankGroup.wait_until); stops nothing."""
        group = self._meeting(job)
        try:
            group.wait_until(reached, timeout)
        except BaseException:  # KeyboardInterrupt, SIGTERM: no rank outlives the test
            self.close()
            raise
        return group.records

    def finish_test(self, job: Job) -> Tuple[List[RankRecord], bool]:
        """The test's records, and whether its timeout stopped the ranks."""
        group = self._meeting(job)
        try:
            timed_out = group.supervise(job.timeout)
        except BaseException:  # KeyboardInterrupt, SIGTERM: no rank outlives the test
            self.close()
            raise
        if not group.intact() or leaks.leaked(group.records):
            self.close()  # a leak: the next test must not meet what this one left
        return group.records, timed_out

    def _start(self, job: Job) -> RankGroup:
        group = RankGroup(self.world_size)
        self.group = group
        self.starts += 1
        try:
            group.start(job, shared=True)
        except BaseException:
            self.close()
            raise
        return group

    def close(self, grace_s: float = 0.0) -> None:
        """Stop the ranks and remove their private dir (a later test starts new ones);
        `grace_s`: how long ranks that finished their last test may take to end their set
        themselves (ranks inside a test, or gone, are killed at once)."""
        group, self.group = self.group, None
        if group is not None:
            group.close(grace_s if group.intact() else 0.0)


class OpenRanks:
    """Every set of shared ranks in this process, by key: a shared-process class's own class,
    a marked pytest function's (module, world size, device, ...) (harness/pytest_plugin/run.py).

    A set outlives each of its tests (each test is its own TestCase instance), so it is kept
    here, where its next test finds it. Three owners stop them: the class's tearDownClass or
    the pytest plugin when a module's tests are done (`stop`), the runner's scope when a run
    ends or is stopped between two tests (harness/runner/lifecycle.py: `stop_all`), and, for a
    runner that has neither (a plain `unittest.main`), this process's exit (`OPEN_RANKS` is
    registered with atexit).
    """

    def __init__(self) -> None:
        self._by_key: Dict[Hashable, SharedRanks] = {}

    def ranks_of(self, job: Job) -> SharedRanks:
        """The shared ranks of `job.shared_key` (none started until its first test runs)."""
        key, program = job.shared_key, (job.module, job.qualname)
        ranks = self._by_key.get(key)
        if ranks is None or ranks.world_size != job.world_size or ranks.program != program:
            self.stop(key)
            ranks = self._by_key[key] = SharedRanks(program, job.world_size)
        return ranks

    def stop(self, key: Hashable) -> None:
        """Stop the ranks of `key`, if it has any running (a class's tearDownClass)."""
        ranks = self._by_key.pop(key, None)
        if ranks is not None:
            ranks.close(FINISH_GRACE_S)

    def stop_where(self, wanted: Callable[[Hashable], bool]) -> None:
        """Stop every set whose key is `wanted` (the pytest plugin: a module's sets)."""
        for key in [key for key in self._by_key if wanted(key)]:
            self.stop(key)

    def stop_all(self) -> None:
        """Stop every set: a run ends, or stops between a class's tests (signals)."""
        self.stop_where(lambda key: True)


OPEN_RANKS = OpenRanks()  # this process's; the one registry every caller names
atexit.register(OPEN_RANKS.stop_all)
