"""`spawn_threads_and_init_comms`: upstream's decorator that runs one test method in rank threads.

Upstream files decorate methods of a plain TestCase with it: the method runs once in each of
`world_size` threads, each with its own default process group, and the test fails if a thread
failed. Here the threads use the harness's threaded backend and world (harness/threads/), so a
failing thread releases the others instead of leaving them in a collective.

Outcome, as upstream's: a thread that raises fails the test with every failing thread's
traceback (`Thread <rank> exited with exception:`); a thread that skips skips it, unless
another failed; past the timeout the test fails naming the thread. Beyond upstream, a thread's
AssertionError is a failure (upstream turns every thread's exception into an error), as for
the harness's other multi-rank bases.
"""

from __future__ import annotations

import datetime
import functools
import sys
import threading
import time
import traceback
import unittest
from types import TracebackType
from typing import Any, Callable, List, Optional, Tuple, Type

import torch
import torch.distributed as dist

from harness import settings
from harness.compat import c10d_world
from harness.requirements.decorators import TEST_SKIPS
from harness.threads import backend as threaded_pg
from harness.threads import world as thread_world

DEFAULT_WORLD_SIZE = settings.DEFAULT_WORLD_SIZE  # upstream's for this decorator without GPUs
STOP_GRACE_S = 2.0  # how long threads get to leave once the run is aborted

ExcInfo = Tuple[Type[BaseException], BaseException, Optional[TracebackType]]


class _Outcomes:
    """What each rank thread ended with, in the order the failures happened."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.raised: List[Tuple[int, ExcInfo]] = []

    def add(self, rank: int, exc_info: Any) -> None:
        with self._lock:
            self.raised.append((rank, exc_info))


def _rank_thread(
    world: thread_world.ThreadedWorld, rank: int, body: Callable[[], Any], outcomes: _Outcomes
) -> None:
    thread_world.bind_thread(world, rank)
    torch.autograd.set_multithreading_enabled(False)  # thread-local: hooks run on this thread
    try:
        dist.init_process_group(
            threaded_pg.BACKEND_NAME, rank=rank, world_size=world.world_size,
            store=world.store, timeout=datetime.timedelta(seconds=world.timeout),
        )
        body()
    except BaseException:
        outcomes.add(rank, sys.exc_info())
        world.abort(f"rank {rank} failed")
    finally:
        world.rank_exited(rank, "finished the test")
        if dist.is_initialized():
            dist.destroy_process_group()
        thread_world.unbind_thread()


def run_in_rank_threads(world_size: int, timeout: float, body: Callable[[], Any]) -> None:
    """Run `body()` in `world_size` threads, each a rank with an initialised default group;
    raise the test's outcome (see the module's docstring) once every thread ended."""
    if world_size < 1:
        raise ValueError(f"spawn_threads_and_init_comms: world_size must be >= 1, got {world_size}")
    threaded_pg.register()
    world = thread_world.ThreadedWorld(world_size, timeout)
    outcomes = _Outcomes()
    timed_out: List[int] = []
    with c10d_world.thread_local_c10d_world():
        threads = [
            threading.Thread(target=_rank_thread, args=(world, rank, body, outcomes),
                             name=f"harness-spawned-rank-{rank}", daemon=True)
            for rank in range(world_size)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        timed_out = [rank for rank, thread in enumerate(threads) if thread.is_alive()]
        if timed_out:
            world.abort(f"the test timed out after {timeout:g} seconds")
            for thread in threads:
                thread.join(STOP_GRACE_S)
    _raise_outcome(outcomes.raised, timed_out, timeout)


def _is_clean_exit(exc: BaseException) -> bool:
    return isinstance(exc, SystemExit) and exc.code in (0, None)


def _skip_reason(exc: BaseException) -> Optional[str]:
    if isinstance(exc, unittest.SkipTest):
        return str(exc)
    if isinstance(exc, SystemExit):
        for skip in TEST_SKIPS.values():
            if exc.code == skip.exit_code:
                return skip.message
    return None


def _raise_outcome(raised: List[Tuple[int, ExcInfo]], timed_out: List[int], timeout: float) -> None:
    if timed_out:
        ranks = ", ".join(map(str, timed_out))
        raise RuntimeError(f"Thread {ranks} terminated or timed out after {timeout} seconds")
    failed = [(rank, info) for rank, info in raised
              if not _is_clean_exit(info[1]) and _skip_reason(info[1]) is None]
    if failed:
        report = "".join(
            f"Thread {rank} exited with exception:\n{''.join(traceback.format_exception(*info))}\n"
            for rank, info in failed
        )
        first = failed[0][1][1]  # the others may only have been released by it
        raise (AssertionError if isinstance(first, AssertionError) else RuntimeError)(report)
    reasons = [_skip_reason(info[1]) for _, info in raised]
    skipped = [reason for reason in reasons if reason is not None]
    if skipped:
        raise unittest.SkipTest(skipped[0])


def spawn_threads_and_init_comms(
    func: Optional[Callable] = None, timeout: Optional[float] = None,
    world_size: int = DEFAULT_WORLD_SIZE,
) -> Callable:
    """Upstream's decorator: the test method runs in `world_size` rank threads, each with its
    own default process group. Usable bare or as `@spawn_threads_and_init_comms(world_size=2)`;
    `timeout` defaults to the harness's per-test timeout."""
    if func is None:
        return functools.partial(spawn_threads_and_init_comms, timeout=timeout,
                                 world_size=world_size)

    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        limit = settings.default_timeout() if timeout is None else timeout
        run_in_rank_threads(world_size, limit, lambda: func(self, *args, **kwargs))

    return wrapper
