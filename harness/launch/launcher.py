"""The one interface every way of running ranks implements.

A front end (a unittest class's supervising case, harness/launch/ranked_case.py; the pytest
plugin, harness/pytest_plugin/run.py) does not know how its ranks run: it hands its launcher
a Job (harness/launch/job.py), asks it to `start` the ranks, to `join` them, and to `close`
whatever is left. Each mode (fresh processes, shared processes, threads, torchrun, ranks
simulated in one process) is one Launcher; the verdict is the same for all of them, because
they all hand back one RankRecord per rank. A launcher never writes into its caller: `start`
returns what it set up (`RankSetup`), and a unittest case shows it as upstream's attributes.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

from harness.launch.job import Job
from harness.outcome.rank_record import RankRecord


@dataclass(frozen=True)
class RankSetup:
    """What a launcher's `start` set up, for a supervising case to describe its run by
    (`RankedTestCase.describe_run`: upstream's `file_name` and `processes`); the defaults where
    a mode has no rendezvous file or no processes of its own."""

    file_name: Optional[str] = None  # the test's rendezvous file (`init_method` derives from it)
    processes: Sequence[Any] = ()  # the rank processes, while they run


class Launcher(abc.ABC):
    """Runs one test's ranks and reports what each did."""

    @abc.abstractmethod
    def start(self, job: Job) -> RankSetup:
        """Start the ranks running `job` (a unittest class: from its setUp); what was set up."""

    @abc.abstractmethod
    def join(self, job: Job) -> Tuple[List[RankRecord], Optional[float]]:
        """Wait for the ranks, at most `job.timeout` seconds: every rank's record, and the
        timeout that stopped them (else None)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop whatever still runs and remove what the ranks wrote; safe to call twice."""

    def wait_until(
        self, reached: Callable[[List[RankRecord]], bool], timeout: float
    ) -> Optional[List[RankRecord]]:
        """After `start`: take in what the ranks report, stopping nothing, until
        `reached(records)` holds, every rank ended, or `timeout` seconds passed; the records so
        far. None where the ranks run only inside `join` (torchrun's rank, simulated ranks)."""
        return None

    def finish(self) -> None:
        """After `join`: stop whatever still runs, but keep what the test may still read (its
        rendezvous file, which upstream leaves to the test's tearDown) until `close`, which
        the supervising case calls after its tearDown and cleanups. Modes with nothing to
        keep close at once."""
        self.close()
