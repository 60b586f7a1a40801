"""Running a test's rank in this very process: for ranks that need no process of their own.

Two modes use it: torchrun, where the launched process is itself one rank, and simulated
ranks (LocalTensor classes of harness/kit/dtensor.py), where one process plays every rank.
`run_rank_here` runs a second instance of the test as a rank, exactly as a rank process or
thread would (RankContext, ReportingResult), and keeps its events in a RankRecord, so the
verdict is the same as in every other mode.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, List, Optional, Tuple

from harness.launch.context import RankContext, running_as_rank
from harness.launch.job import Job
from harness.launch.launcher import Launcher, RankSetup
from harness.outcome.rank_record import (
    Event,
    RankRecord,
    RecordSink,
    ReportingResult,
    raised_event,
)


def run_rank_here(
    job: Job, rank: int, world_size: int, record: Optional[RankRecord] = None, **context: Any
) -> RankRecord:
    """Run `job` as rank `rank` of `world_size` in this process; its record (`record`, when
    the caller watches it while the test runs).

    `context` are further RankContext fields (init_method, grid_sync, ...).
    """
    if record is None:
        record = RankRecord(rank, pid=os.getpid())
    sink = RecordSink(record)
    context.setdefault("inputs", job.inputs)
    rank_context = RankContext(rank, world_size, ReportingResult(sink), **context)
    started = time.monotonic()
    try:
        rank_case = job.program()(job.method)
        rank_case.attach_rank(rank_context)
    except Exception:
        sink.send(raised_event(sys.exc_info()))
    else:
        with running_as_rank(rank_case):
            rank_case.run(rank_context.result)
    sink.send(Event("done", count=rank_context.grid_points))
    record.duration = time.monotonic() - started
    return record


class SimulatedRanks(Launcher):
    """All ranks simulated by one instance of the test in this process (LocalTensor): it runs
    once, here, when the supervising case joins; nothing starts before, nothing is left."""

    def start(self, job: Job) -> RankSetup:
        """Nothing to start: the ranks are simulated when the test runs."""
        return RankSetup()

    def join(self, job: Job) -> Tuple[List[RankRecord], Optional[float]]:
        return [run_rank_here(job, 0, job.world_size)], None

    def close(self) -> None:
        """Nothing outlives the test's own run."""
