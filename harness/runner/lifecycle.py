"""A run's lifetime: the signals that stop it, and nothing it started left behind.

`run_all.py` and `run_tests()` run inside `run_scope()`. In it SIGTERM and SIGHUP (what CI
systems send on a timeout or a cancelled job, and a closed terminal) stop the run the way
Ctrl-C does: `Interrupted`, a KeyboardInterrupt, is raised in the main thread, so the code
that already unwinds cleanly from Ctrl-C (ranks stopped, what finished still reported)
handles all three. When the scope ends, however it ends, the processes the run started are
stopped and reaped (rank processes still alive, the forkserver, multiprocessing's resource
tracker), and the signal handlers that were there before are restored: run_tests() may be
called from a user's program.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
from contextlib import contextmanager
from typing import Dict, Iterator, Optional, Set

from harness.process import forkserver
from harness.process import shared as shared_ranks

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
CHILD_EXIT_WAIT_S = 5.0


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal (SIGINT, SIGTERM or SIGHUP)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signal_of(stop: KeyboardInterrupt) -> int:
    """The signal behind an interruption: a plain KeyboardInterrupt is Ctrl-C (SIGINT)."""
    return getattr(stop, "signum", signal.SIGINT)


def exit_code(signum: int) -> int:
    """The shell's convention for a run stopped by a signal: 128 + its number (130, 143, 129)."""
    return 128 + signum


def describe(signum: int) -> str:
    return "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name


class _Scope:
    """What one run_scope() saw: the first stop signal, and whether it is being deferred."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self.deferring = 0
        self.pending = False
        self.closing = False

    def handle(self, signum: int, frame: object) -> None:
        if self.signum is not None or self.closing:
            return  # already stopping: let the cleanup finish
        self.signum = signum
        if self.deferring:
            self.pending = True
            return
        raise Interrupted(signum)


_active: Optional[_Scope] = None


@contextmanager
def run_scope() -> Iterator[None]:
    """SIGTERM/SIGHUP (and Ctrl-C, unless the program handles SIGINT itself) raise Interrupted
    while the block runs; on leaving it, the processes the run started are stopped and reaped
    and the previous handlers restored. Nested scopes leave it all to the outermost one."""
    global _active
    if _active is not None:
        yield
        return
    scope = _active = _Scope()
    saved: Dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            previous = signal.getsignal(signum)
            if signum == signal.SIGINT and previous is not signal.default_int_handler:
                continue  # the program has its own Ctrl-C handling: keep it
            saved[signum] = previous
            signal.signal(signum, scope.handle)
    children_before = {child.pid for child in multiprocessing.active_children()}
    helpers_before = forkserver.helper_pids()
    try:
        yield
    finally:
        scope.closing = True
        try:
            # a class's ranks and private dir, when stopped between its tests
            shared_ranks.OPEN_RANKS.stop_all()
            _stop_children(children_before)
            forkserver.stop_helpers(helpers_before)
        finally:
            for signum, previous in saved.items():
                signal.signal(signum, previous)  # type: ignore[arg-type]
            _active = None


@contextmanager
def deferred_signals() -> Iterator[None]:
    """A stop signal arriving inside the block is raised when it ends, so that bookkeeping
    (one test's record and XML, the final report) is never cut in half."""
    scope = _active
    if scope is None:
        yield
        return
    scope.deferring += 1
    try:
        yield
    finally:
        scope.deferring -= 1
    if scope.pending and not scope.deferring and scope.signum is not None:
        scope.pending = False
        raise Interrupted(scope.signum)


def _stop_children(before: Set[Optional[int]]) -> None:
    """Kill and reap rank processes the run started that are still alive (say, of a test
    interrupted while they started, or shared by a class whose teardown never ran)."""
    started = [c for c in multiprocessing.active_children() if c.pid not in before]
    for child in started:
        child.kill()
    for child in started:
        child.join(CHILD_EXIT_WAIT_S)
