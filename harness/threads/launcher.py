"""ThreadRanks: the launcher whose ranks are threads of this process.

Threads make a multi-rank test cost milliseconds instead of process start-ups. `start` sets
up what the ranks share (a ThreadedWorld, harness/threads/world.py, and the per-thread c10d
world and warning filters) and starts one thread per rank; each thread builds its own
instance of what the job names (a test class, or a pytest function's rank program), hands it
a RankContext, initialises its default group with the `threaded` backend (its
ThreadRankHooks, harness/launch/hooks.py: `start_rank_thread`, then `finish_rank_thread`
after the run) and runs it (`run(result)`), its events kept in the rank's RankRecord. `join`
waits, stopping the ranks still running once one failed or skipped (the fail-fast policy of
every mode, harness/launch/fail_fast.py) or at the timeout, with the stack of every rank
still running.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
import traceback
from contextlib import ExitStack
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from harness import settings
from harness.compat import c10d_world
from harness.compat import cpu_defaults as compat_cpu_defaults
from harness.launch import fail_fast
from harness.launch.context import GridSync, RankContext, running_as_rank
from harness.launch.job import Job
from harness.launch.launcher import Launcher, RankSetup
from harness.outcome import stacks
from harness.outcome.rank_record import (
    Event,
    RankRecord,
    RecordSink,
    ReportingResult,
    raised_event,
)
from harness.threads import backend as threaded_pg
from harness.threads import world as thread_world
from harness.threads.warning_filters import per_thread_warnings

STOP_GRACE_S = 2.0  # how long a rank thread gets to unwind once told to stop
WAIT_POLL_S = 0.0005  # how often `wait_until` looks at the records the rank threads fill


class RankThreadStopped(BaseException):
    """Raised inside a rank thread that the supervisor stops (timeout or fail-fast)."""


class ThreadRanks(Launcher):
    """The rank threads of one test, the world they share, and their supervision."""

    def __init__(self) -> None:
        self.world: Optional[thread_world.ThreadedWorld] = None
        self.records: List[RankRecord] = []
        self.sinks: List[RecordSink] = []
        self.threads: List[threading.Thread] = []
        self._state = ExitStack()

    def start(self, job: Job) -> RankSetup:
        world_size, timeout = job.world_size, job.timeout
        threaded_pg.register()
        # HARNESS_ALLOW_CPU's CPU analogs, for the ranks this process runs (once per process).
        compat_cpu_defaults.PROCESS_ADAPTATIONS.install()
        # Collectives wait longer than the test, so a hang is reported as the test timing
        # out (with stacks) rather than as a collective timing out.
        self.world = thread_world.ThreadedWorld(world_size, timeout + fail_fast.GRACE_S)
        self.records = [RankRecord(rank) for rank in range(world_size)]
        self.sinks = [RecordSink(record) for record in self.records]
        # Process-wide state the ranks change, restored however the test ends.
        state = self._state
        state.enter_context(c10d_world.thread_local_c10d_world())
        state.enter_context(per_thread_warnings(self._rank_warning))
        state.callback(self._stop_if_running)  # LIFO: before the world is restored
        state.callback(setattr, sys, "excepthook", sys.excepthook)
        state.callback(torch.set_num_threads, torch.get_num_threads())
        for rank in range(world_size):
            thread = threading.Thread(
                target=self._rank_main, args=(job, rank), name=f"harness-rank-{rank}",
                daemon=True,
            )
            self.threads.append(thread)
            thread.start()
        return RankSetup()  # no rendezvous file, no processes: threads of this one

    def _rank_warning(self, text: str) -> bool:
        """A warning a rank thread shows (torch's, say) goes into that rank's output, shown
        with a failure as a process rank's is, not onto the runner's stderr; live with
        HARNESS_SHOW_OUTPUT=1. False for other threads: their warnings are shown as usual."""
        current = threading.current_thread()
        rank = next((r for r, thread in enumerate(self.threads) if thread is current), None)
        if rank is None or settings.show_output():
            return False
        self.records[rank].output += text
        return True

    def wait_until(
        self, reached: Callable[[List[RankRecord]], bool], timeout: float
    ) -> Optional[List[RankRecord]]:
        deadline = time.monotonic() + timeout
        while not reached(self.records) and any(t.is_alive() for t in self.threads):
            if time.monotonic() >= deadline:
                break
            time.sleep(WAIT_POLL_S)
        return self.records

    def join(self, job: Job) -> Tuple[List[RankRecord], Optional[float]]:
        world = self.world
        assert world is not None, "join before start"
        timed_out = self._supervise(job.timeout)
        for record in self.records:
            record.collectives = world.entered(record.rank)
        return self.records, job.timeout if timed_out else None

    def close(self) -> None:
        """Stop ranks still running (the test ended without joining them: its setUp failed),
        then give the process its own c10d world, warning filters and settings back."""
        self._state.close()

    def _supervise(self, timeout: float) -> bool:
        """Wait for every rank; True if the test timed out. Stops ranks left behind."""
        deadline = time.monotonic() + timeout
        policy = fail_fast.FailFast()
        for thread in self.threads:
            while thread.is_alive():
                limit = min(deadline, policy.stop_at(self.records))
                now = time.monotonic()
                if now >= limit:
                    self._stop()
                    return not policy.triggered
                thread.join(min(0.5, limit - now))
        return False

    def _stop_if_running(self) -> None:
        """Stop the ranks if nothing did yet (a rank already told to stop is not waited for
        twice: a runner's deadline counts on one grace period)."""
        stopped = any(record.stopped for record in self.records)
        if not stopped and any(thread.is_alive() for thread in self.threads):
            self._stop()

    def _stop(self) -> None:
        """Record the stacks of the ranks still running, release and stop them."""
        assert self.world is not None
        frames = sys._current_frames()  # CPython's documented stack snapshot of every thread
        running = [(rank, t) for rank, t in enumerate(self.threads) if t.is_alive()]
        for rank, thread in running:
            record = self.records[rank]
            record.stopped = True
            frame = frames.get(thread.ident) if thread.ident is not None else None
            record.set_stack(_frames(frame) if frame else [])
        self.world.abort("the test was stopped (timed out, or another rank failed)")
        for _, thread in running:
            _raise_in_thread(thread, RankThreadStopped)
        deadline = time.monotonic() + STOP_GRACE_S
        for _, thread in running:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _rank_main(self, job: Job, rank: int) -> None:
        """One rank thread: its own instance of the test, its group, its events."""
        world, sink = self.world, self.sinks[rank]
        assert world is not None
        thread_world.bind_thread(world, rank)
        context = RankContext(
            rank, world.world_size, ReportingResult(sink), grid_sync=_grid_sync(world, rank),
            inputs=job.inputs,
        )
        rank_case: Any = None  # the job's instance for this rank (its ThreadRankHooks)
        started = time.monotonic()
        try:
            # Thread-local: FSDP's backward hooks must run on the rank's own thread, not on
            # autograd's per-device worker threads.
            torch.autograd.set_multithreading_enabled(False)
            torch.set_num_threads(settings.intra_op_threads(world.world_size))
            rank_case = job.program()(job.method)
            rank_case.attach_rank(context)
            rank_case.start_rank_thread()
        except BaseException:
            sink.send(raised_event(sys.exc_info()))
        try:
            if rank_case is not None and not sink.failed:
                with running_as_rank(rank_case):
                    rank_case.run(context.result)
                rank_case.finish_rank_thread(passed=not sink.failed)
        except BaseException:
            sink.send(raised_event(sys.exc_info()))
        finally:
            failed = sink.failed
            self.records[rank].duration = time.monotonic() - started
            sink.send(Event("done", count=context.grid_points))
            world.rank_exited(rank, "failed its test" if failed else "finished its test")
            if failed:
                world.abort(f"rank {rank} failed its test")
            _destroy_group_of(world)
            thread_world.unbind_thread()


def _grid_sync(world: thread_world.ThreadedWorld, rank: int) -> GridSync:
    """Rank threads meet after every grid point, realigning their collectives.

    A rank stuck in a collective that a peer which moved on will never join is released
    at once (the world knows where each rank is), so this does not wait for a timeout.
    """
    points = 0

    def grid_point_done(params: Dict[str, Any], passed: bool) -> bool:
        nonlocal points
        index, points = points, points + 1
        return world.sync_point(rank, f"#{index} ({', '.join(sorted(params))})")

    return grid_point_done


def _destroy_group_of(world: thread_world.ThreadedWorld) -> None:
    """Destroy this thread's default group if it is still the one bound to `world`.

    A rank thread stopped late may finish after the process's own c10d world is back;
    it must not touch a default group that is not its own.
    """
    group = dist.group.WORLD
    if isinstance(group, threaded_pg.ThreadedProcessGroup) and group.world is world:
        dist.destroy_process_group()


def _frames(frame: Any) -> List[stacks.Frame]:
    """A live thread's frames, oldest first."""
    return [
        stacks.Frame(f.filename, f.lineno or 0, f.name) for f in traceback.extract_stack(frame)
    ]


def _raise_in_thread(thread: threading.Thread, exc_type: type) -> None:
    """Ask a thread to raise `exc_type` at its next Python instruction (CPython C API)."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type)
        )
