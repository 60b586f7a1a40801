"""MultiThreadedTestCase: each test method runs in `world_size` threads of this process.

Threads make a multi-rank test cost milliseconds instead of process start-ups. The case
the test runner holds supervises: `setUp` calls `_spawn_threads()`, which starts one
thread per rank; each thread builds its own instance of the test case, initialises its
default process group with the `threaded` backend (harness/threads/backend.py), and runs the
case with `case.run(result)` so setUp, subTest grids and skips work as in a single
process. The supervisor then turns every rank's events into one outcome with the same
rules as for processes (harness/launch/verdict.py): a failure names the rank and its traceback,
skips keep their reason, and a timeout says `timed out` with every running rank's stack.
"""

from __future__ import annotations

import ctypes
import datetime
import sys
import threading
import time
import traceback
from contextlib import ExitStack
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist

from harness import devices
from harness.compat import c10d_world
from harness.launch.report import Event, RankRecord, RecordSink, ReportingResult, format_error
from harness.launch.verdict import apply_verdict, decide
from harness.skips import check_case_requirements
from harness.testcase import TestCase, route_test_method
from harness.threads import backend as threaded_pg
from harness.threads import world as thread_world
from harness.threads.warning_filters import per_thread_warnings

MAIN_THREAD_RANK = -1
FAIL_FAST_GRACE_S = 10.0  # after a rank fails, how long the others get to notice and finish
STOP_GRACE_S = 2.0  # how long a rank thread gets to unwind once told to stop


class RankThreadStopped(BaseException):
    """Raised inside a rank thread that the supervisor stops (timeout or fail-fast)."""


class _RankThreads:
    """The rank threads of one test, the world they share, and their supervision."""

    def __init__(self, world_size: int, timeout: float) -> None:
        # Collectives wait longer than the test, so a hang is reported as the test timing
        # out (with stacks) rather than as a collective timing out.
        self.world = thread_world.ThreadedWorld(world_size, timeout + FAIL_FAST_GRACE_S)
        self.records = [RankRecord(rank) for rank in range(world_size)]
        self.sinks = [RecordSink(record) for record in self.records]
        self.threads: List[threading.Thread] = []

    def start(self, target: Callable[[int], None]) -> None:
        for rank in range(len(self.records)):
            thread = threading.Thread(
                target=target, args=(rank,), name=f"harness-rank-{rank}", daemon=True
            )
            self.threads.append(thread)
            thread.start()

    def supervise(self, timeout: float) -> bool:
        """Wait for every rank; True if the test timed out. Stops ranks left behind."""
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            while thread.is_alive():
                limit = deadline
                failed_at = min(r.problem_at for r in self.records)
                if failed_at != float("inf"):
                    limit = min(deadline, failed_at + FAIL_FAST_GRACE_S)
                now = time.monotonic()
                if now >= limit:
                    self._stop()
                    return limit == deadline
                thread.join(min(0.5, limit - now))
        return False

    def stop_if_running(self) -> None:
        """Stop ranks still running when the test ends without joining them (setUp failed)."""
        if any(thread.is_alive() for thread in self.threads):
            self._stop()

    def _stop(self) -> None:
        """Record the stacks of the ranks still running, release and stop them."""
        frames = sys._current_frames()  # CPython's documented stack snapshot of every thread
        running = [(rank, t) for rank, t in enumerate(self.threads) if t.is_alive()]
        for rank, thread in running:
            record = self.records[rank]
            record.stopped = True
            frame = frames.get(thread.ident) if thread.ident is not None else None
            record.stack = "".join(traceback.format_stack(frame)) if frame else ""
        self.world.abort("the test was stopped (timed out, or another rank failed)")
        for _, thread in running:
            _raise_in_thread(thread, RankThreadStopped)
        deadline = time.monotonic() + STOP_GRACE_S
        for _, thread in running:
            thread.join(max(0.0, deadline - time.monotonic()))


def _destroy_group_of(world: thread_world.ThreadedWorld) -> None:
    """Destroy this thread's default group if it is still the one bound to `world`.

    A rank thread stopped late may finish after the process's own c10d world is back;
    it must not touch a default group that is not its own.
    """
    group = dist.group.WORLD
    if isinstance(group, threaded_pg.ThreadedProcessGroup) and group.world is world:
        dist.destroy_process_group()


def _raise_in_thread(thread: threading.Thread, exc_type: type) -> None:
    """Ask a thread to raise `exc_type` at its next Python instruction (CPython C API)."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type)
        )


class MultiThreadedTestCase(TestCase):
    """Each test method runs once per rank, in `world_size` threads of this process.

    The instance the test runner holds supervises (`self.rank == MAIN_THREAD_RANK`); every
    rank thread runs its own instance, whose `self.rank` is that thread's rank and whose
    default process group (backend `threaded`) is initialised before setUp and the body.
    Note that torch's default random generator is shared by the threads, unlike
    processes: ranks that need identical random values should build them from an explicit
    `torch.Generator` or broadcast them.
    """

    MAIN_THREAD_RANK = MAIN_THREAD_RANK
    timeout: float = devices.DefaultTimeout()  # type: ignore[assignment]  # seconds; classes may set

    def __init__(
        self, method_name: str = "runTest", methodName: str = "runTest"  # noqa: N803 - unittest's
    ) -> None:
        # Both spellings, as upstream: unittest's `methodName` wins when given.
        super().__init__(methodName if methodName != "runTest" else method_name)
        self._thread_rank = MAIN_THREAD_RANK
        self._threads: Optional[_RankThreads] = None
        self._world: Optional[thread_world.ThreadedWorld] = None
        self._grid_index = 0
        route_test_method(self, lambda: self._thread_rank == MAIN_THREAD_RANK, self._join_threads)

    @property
    def rank(self) -> int:
        """This thread's rank (each rank thread runs its own instance); -1 in the supervisor."""
        return self._thread_rank

    @rank.setter
    def rank(self, rank: int) -> None:
        # Upstream's rank is a plain attribute; which role an instance plays follows it.
        self._thread_rank = rank

    @property
    def world_size(self) -> int:
        return devices.default_world_size()

    @property
    def is_master(self) -> bool:
        """Whether this is rank 0 (False in the supervisor)."""
        return self.rank == 0

    def setUp(self) -> None:
        if self._thread_rank == MAIN_THREAD_RANK:
            super().setUp()  # seeds the random generators, once, before any rank starts
            self._spawn_threads()
        else:
            # Rank threads share the process's generators: reseeding them from every rank
            # thread would race with ranks already drawing numbers. Skip TestCase's seeding.
            super(TestCase, self).setUp()
            self.perThreadSetUp()

    def tearDown(self) -> None:
        if self._thread_rank != MAIN_THREAD_RANK:
            self.perThreadTearDown()
        super().tearDown()

    def perThreadSetUp(self) -> None:  # noqa: N802 - upstream's name
        """Upstream's hook: runs in every rank thread before the test body."""

    def perThreadTearDown(self) -> None:  # noqa: N802 - upstream's name
        """Upstream's hook: runs in every rank thread after the test body."""

    def assertEqualOnRank(  # noqa: N802 - upstream's name
        self, x: Any, y: Any, msg: Optional[str] = None, *, rank: int = 0
    ) -> None:
        """assertEqual only on `rank`: rank threads share one CPU generator (upstream's helper)."""
        if self.rank == rank:
            self.assertEqual(x, y, msg)

    def assertNotEqualOnRank(  # noqa: N802 - upstream's name
        self, x: Any, y: Any, msg: Optional[str] = None, *, rank: int = 0
    ) -> None:
        """assertNotEqual only on `rank`."""
        if self.rank == rank:
            self.assertNotEqual(x, y, msg)

    # --- supervisor ---------------------------------------------------------------------
    def _spawn_threads(self) -> None:
        """Start the rank threads (supervisor only; a no-op in a rank and when started)."""
        if self._thread_rank != MAIN_THREAD_RANK or self._threads is not None:
            return
        check_case_requirements(self)
        world_size, timeout = devices.checked_rank_settings(self)
        threaded_pg.register()
        self._threads = _RankThreads(world_size, timeout)
        # Process-wide state the ranks change, restored however the test ends.
        state = ExitStack()
        self.addCleanup(state.close)
        state.enter_context(c10d_world.thread_local_c10d_world())
        state.enter_context(per_thread_warnings())
        state.callback(self._threads.stop_if_running)  # LIFO: before the world is restored
        state.callback(setattr, sys, "excepthook", sys.excepthook)
        state.callback(torch.set_num_threads, torch.get_num_threads())
        self._threads.start(self._rank_thread_main)

    def _join_threads(self) -> None:
        """Wait for the rank threads and turn their events into this test's outcome."""
        threads = self._threads
        if threads is None:
            raise RuntimeError(
                f"{type(self).__name__}.setUp did not start the rank threads: "
                "call super().setUp()"
            )
        timeout = self.timeout
        timed_out = threads.supervise(timeout)
        for record in threads.records:
            record.collectives = threads.world.entered(record.rank)
        apply_verdict(self, decide(threads.records, timeout if timed_out else None))

    # --- rank threads ----------------------------------------------------------------------
    def _rank_thread_main(self, rank: int) -> None:
        threads = self._threads
        assert threads is not None
        world, sink = threads.world, threads.sinks[rank]
        thread_world.bind_thread(world, rank)
        case: Optional[MultiThreadedTestCase] = None
        try:
            # Thread-local: FSDP's backward hooks must run on the rank's own thread, not on
            # autograd's per-device worker threads.
            torch.autograd.set_multithreading_enabled(False)
            torch.set_num_threads(devices.intra_op_threads(world.world_size))
            case = type(self)(self._testMethodName)
            case._thread_rank, case._world = rank, world
            case._init_rank_thread()
        except BaseException:
            sink.send(Event("failure", format_error(sys.exc_info())))
        try:
            if case is not None and not sink.failed:
                case.run(ReportingResult(sink))
                case._finish_rank_thread(passed=not sink.failed)
        except BaseException:
            sink.send(Event("failure", format_error(sys.exc_info())))
        finally:
            failed = sink.failed
            grid_points = getattr(case, "_grid_points_run", 0)
            sink.send(Event("done", count=grid_points))
            world.rank_exited(rank, "failed its test" if failed else "finished its test")
            if failed:
                world.abort(f"rank {rank} failed its test")
            _destroy_group_of(world)
            thread_world.unbind_thread()

    def _init_rank_thread(self) -> None:
        """In a rank thread, before setUp: the default process group on the threaded backend."""
        assert self._world is not None
        dist.init_process_group(
            threaded_pg.BACKEND_NAME,
            rank=self.rank,
            world_size=self._world.world_size,
            store=self._world.store,
            timeout=datetime.timedelta(seconds=self._world.timeout),
        )

    def _finish_rank_thread(self, passed: bool) -> None:
        """In a rank thread, after the case ran (tearDown included); `passed` if it did not fail."""
        if dist.is_initialized():
            dist.destroy_process_group()

    def _grid_point_done(self, params: Dict[str, Any], passed: bool) -> bool:
        """Rank threads meet after every grid point, realigning their collectives.

        A rank stuck in a collective that a peer which moved on will never join is released
        at once (the world knows where each rank is), so this does not wait for a timeout.
        """
        if self._world is None:
            return True
        index, self._grid_index = self._grid_index, self._grid_index + 1
        return self._world.sync_point(self.rank, f"#{index} ({', '.join(sorted(params))})")
