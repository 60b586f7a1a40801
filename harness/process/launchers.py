"""The launchers of process ranks: fresh processes per test, shared processes per class, and
the one choice of torchrun's launcher when torchrun started this process.

Each launcher is thin: RankGroup (harness/process/supervisor.py) starts and supervises rank
processes, SharedRanks (harness/process/shared.py) keeps a class's set between tests. What a
launcher adds is the Launcher interface (harness/launch/launcher.py), so the case does not
know which of them runs its ranks, and the description of the run `start` returns (a
RankSetup: `file_name`, `processes`), which the case exposes as upstream's MultiProcessTestCase
does.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

from harness import settings
from harness.launch.job import Job
from harness.launch.launcher import Launcher, RankSetup
from harness.outcome.rank_record import RankRecord
from harness.process import shared as shared_ranks
from harness.process import torchrun
from harness.process.supervisor import RankGroup


def _check_importable(job: Job) -> None:
    """Ranks re-create the test by importing its class: a local class is a config error."""
    if not job.importable:
        raise settings.HarnessConfigError(
            f"{job.qualname} is defined inside a function: ranks re-create the "
            "test by importing its class, so define it at module level"
        )


def _timed_out_after(timeout: float, timed_out: bool) -> Optional[float]:
    return timeout if timed_out else None


class FreshProcesses(Launcher):
    """Every test in `world_size` new rank processes (forks of the preloaded forkserver)."""

    def __init__(self) -> None:
        self._group: Optional[RankGroup] = None

    def start(self, job: Job) -> RankSetup:
        _check_importable(job)
        group = RankGroup(job.world_size)
        self._group = group
        group.start(job)
        return RankSetup(group.file_name, group.processes)

    def wait_until(
        self, reached: Callable[[List[RankRecord]], bool], timeout: float
    ) -> Optional[List[RankRecord]]:
        group = self._group
        assert group is not None, "wait before start"
        group.wait_until(reached, timeout)
        return group.records

    def join(self, job: Job) -> Tuple[List[RankRecord], Optional[float]]:
        group = self._group
        assert group is not None, "join before start"
        return group.records, _timed_out_after(job.timeout, group.supervise(job.timeout))

    def finish(self) -> None:
        if self._group is not None:
            self._group.stop()

    def close(self) -> None:
        if self._group is not None:
            self._group.close()


class SharedProcesses(Launcher):
    """The tests of a class in one set of rank processes (harness/process/shared.py): `start`
    sends the test to the class's ranks (starting them for its first test), `join` collects
    it; a set that broke is replaced by SharedRanks."""

    def __init__(self) -> None:
        self._sent_to: Optional[shared_ranks.SharedRanks] = None
        self._job: Optional[Job] = None

    def start(self, job: Job) -> RankSetup:
        _check_importable(job)
        ranks = shared_ranks.OPEN_RANKS.ranks_of(job)
        setup = ranks.send_test(job)
        self._sent_to, self._job = ranks, job
        return setup

    def wait_until(
        self, reached: Callable[[List[RankRecord]], bool], timeout: float
    ) -> Optional[List[RankRecord]]:
        ranks, job = self._sent_to, self._job
        assert ranks is not None and job is not None, "wait before start"
        return ranks.wait_until(job, reached, timeout)

    def join(self, job: Job) -> Tuple[List[RankRecord], Optional[float]]:
        ranks, self._sent_to = self._sent_to, None
        assert ranks is not None, "join before start"
        records, timed_out = ranks.finish_test(job)
        return records, _timed_out_after(job.timeout, timed_out)

    def close(self) -> None:
        """A test sent to the ranks but never joined (its setUp failed later) leaves them out
        of step: stop them. After a join the class's ranks stay for its next test."""
        if self._sent_to is not None and self._job is not None:
            shared_ranks.OPEN_RANKS.stop(self._job.shared_key)
            self._sent_to = None


def process_launcher(default: Launcher) -> Launcher:
    """`default`, unless torchrun launched this process: then torchrun's launcher, which runs
    this rank here and meets the other launched processes (harness/process/torchrun.py)."""
    run = torchrun.this_run()
    return default if run is None else torchrun.TorchrunLauncher(run)
