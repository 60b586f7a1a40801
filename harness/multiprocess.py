"""MultiProcessTestCase: every test runs once in each of `world_size` fresh rank processes.

The parent only supervises: `setUp` starts the ranks (forks of a forkserver that has torch
and the test module imported, so a rank starts in milliseconds instead of seconds), the
test method is replaced in the parent by a wrapper that waits for the ranks' reports
(harness/rank.py), stops the others once one rank fails or the timeout passes, and turns
the reports into one unittest outcome (harness/outcome.py). Nothing a test started
outlives it: processes are killed and the test's private temp dir is removed.
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.forkserver
import os
import shutil
import signal
import sys
import tempfile
import time
import unittest
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Dict, List, Optional, Set

from harness import devices
from harness.outcome import RankRecord, SubtestVerdict, decide
from harness.preload_main import MAIN_PATH_ENV
from harness.rank import STACK_SIGNAL, RankSpec, without_lifeline
from harness.rank import main as rank_main
from harness.skips import check_requirements
from harness.testcase import TestCase

# unittest hides frames of modules that define this, as it does for its own: a multi-rank
# failure then shows the rank's traceback, not the supervisor's.
__unittest = True

MAIN_PROCESS_RANK = -1
SHOW_OUTPUT_ENV = "HARNESS_SHOW_OUTPUT"
FAIL_FAST_GRACE_S = 3.0  # once a rank failed, how long the others may still report
STACK_DUMP_WAIT_S = 1.0  # how long a rank gets to write its stack before it is killed
STREAM_INTERVAL_S = 0.1

# What every rank would otherwise import itself, once per test: torch.distributed.tensor because
# torch.testing.assert_close (so every tensor assertEqual) imports it on first use, which costs a
# rank over a second; numpy because TestCase.setUp seeds it. Missing modules are skipped.
# harness.preload_main goes last: it imports the script run as __main__ (see that module).
_preload: List[str] = [
    "torch", "torch.distributed", "torch.distributed.tensor", "numpy", "harness.testcase",
    "harness.rank",
]


def preload(*modules: str) -> None:
    """Import these modules in the forkserver too, so ranks do not import them per test.

    Takes effect only before the first multi-process test of this process starts the
    forkserver (a runner calls it with every suite module it is about to run).
    """
    _preload.extend(m for m in modules if m not in _preload and m != "__main__")


def _context(test_module: str) -> Any:
    method = devices.start_method()
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        preload(test_module)
        context.set_forkserver_preload([*_preload, "harness.preload_main"])
        _ensure_forkserver()
    return context


def _main_script() -> Optional[str]:
    """The path multiprocessing re-imports in a child as `__main__`, if it is a script."""
    main = sys.modules["__main__"]
    path = getattr(main, "__file__", None)
    if getattr(getattr(main, "__spec__", None), "name", None) is not None or path is None:
        return None
    if not os.path.isabs(path) and multiprocessing.process.ORIGINAL_DIR is not None:
        path = os.path.join(multiprocessing.process.ORIGINAL_DIR, path)
    return os.path.normpath(path)


def _ensure_forkserver() -> None:
    """Start the forkserver if needed, telling harness.preload_main which script to load."""
    script = _main_script()
    saved = os.environ.get(MAIN_PATH_ENV)
    if script is not None:
        os.environ[MAIN_PATH_ENV] = script
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if saved is None:
            os.environ.pop(MAIN_PATH_ENV, None)
        else:
            os.environ[MAIN_PATH_ENV] = saved


def _show_output() -> bool:
    return os.environ.get(SHOW_OUTPUT_ENV, "").lower() in ("1", "true", "yes")


class _DefaultTimeout:
    """`timeout` when a class does not set one: HARNESS_TIMEOUT or 300 s, read at run time."""

    def __get__(self, obj: Any, owner: Any = None) -> float:
        return devices.default_timeout()


class RankGroup:
    """The rank processes of one test, from start to cleanup, and what they reported."""

    def __init__(self, world_size: int) -> None:
        self.work_dir = tempfile.mkdtemp(prefix="harness-")  # mode 0700: private to this user
        self.file_name = os.path.join(self.work_dir, "rendezvous")
        os.close(os.open(self.file_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        self.temp_dir = os.path.join(self.work_dir, "tmp")
        os.mkdir(self.temp_dir, 0o700)
        self.records = [RankRecord(rank) for rank in range(world_size)]
        self.processes: List[Any] = []
        self._readers: Dict[int, Connection] = {}
        self._alive: Set[int] = set()  # ranks whose exit the supervisor has not seen yet
        self._stack_from: Dict[int, int] = {}  # rank -> output offset where its stack dump starts
        self._streamed = [0] * world_size

    def output_path(self, rank: int) -> str:
        return os.path.join(self.work_dir, f"rank{rank}.out")

    def start(self, context: Any, spec_of: Callable[[int], RankSpec]) -> None:
        for record in self.records:
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(
                target=rank_main, args=(spec_of(record.rank), writer), name=f"rank{record.rank}"
            )
            self._readers[record.rank] = reader
            try:
                process.start()
            finally:
                writer.close()  # the rank holds the only write end: EOF once it exits
            self.processes.append(process)
            record.pid = process.pid
            self._alive.add(record.rank)

    def supervise(self, timeout: float) -> bool:
        """Collect reports until every rank exited; True if the timeout stopped them."""
        started = time.monotonic()
        deadline, stop_at = started + timeout, float("inf")
        stream = _show_output()
        while self._alive or self._readers:
            now = time.monotonic()
            if now >= min(deadline, stop_at):
                break
            wait_s = min(deadline, stop_at) - now
            readers = list(self._readers.values())
            sentinels = {self.processes[rank].sentinel: rank for rank in self._alive}
            ready = wait(readers + list(sentinels), STREAM_INTERVAL_S if stream else wait_s)
            for item in ready:
                if item in sentinels:
                    self._exited(sentinels[item])
                else:
                    self._receive(next(r for r, c in self._readers.items() if c is item))
            if stream:
                self._stream()
            if stop_at == float("inf") and self._any_rank_ended_test():
                stop_at = time.monotonic() + FAIL_FAST_GRACE_S
        still_running = sorted(self._alive)
        self._stop(still_running)
        self._collect_output()
        if stream:
            self._stream()
        return bool(still_running) and stop_at == float("inf")

    def _receive(self, rank: int, block: bool = True) -> None:
        reader = self._readers[rank]
        try:
            while block or reader.poll(0):
                event = reader.recv()
                self.records[rank].events.append(event)
                if event.kind in ("failure", "expected_failure"):
                    self._note_problem(rank)
                block = False
        except (EOFError, OSError):
            reader.close()
            del self._readers[rank]

    def _exited(self, rank: int) -> None:
        process = self.processes[rank]
        process.join(0)
        self._alive.discard(rank)
        record = self.records[rank]
        record.exitcode = process.exitcode
        if rank in self._readers:  # everything it wrote is in the pipe by now
            self._receive(rank, block=False)
            if rank in self._readers and not self._readers[rank].poll(0):
                self._readers.pop(rank).close()
        if record.failed:
            self._note_problem(rank)

    def _note_problem(self, rank: int) -> None:
        record = self.records[rank]
        record.problem_at = min(record.problem_at, time.monotonic())

    def _any_rank_ended_test(self) -> bool:
        """A rank failed or skipped the whole test: the others need not run to the end."""
        return any(r.failed or r.skip_reason() is not None for r in self.records)

    def _stop(self, ranks: List[int]) -> None:
        """Dump the Python stack of each rank still running into its output, then kill it."""
        if not ranks:
            return
        sizes = {rank: self._size(rank) for rank in ranks}
        for rank in ranks:
            self._signal(rank, STACK_SIGNAL)
        until, last = time.monotonic() + STACK_DUMP_WAIT_S, None
        while time.monotonic() < until:
            time.sleep(0.02)
            now = [self._size(rank) for rank in ranks]
            if now == last and all(n > sizes[r] for n, r in zip(now, ranks)):
                break
            last = now
        for rank in ranks:
            self._signal(rank, signal.SIGKILL)
        for rank in ranks:
            self.processes[rank].join(5)
            self._alive.discard(rank)
            self.records[rank].stopped = True
            self.records[rank].exitcode = self.processes[rank].exitcode
            self._stack_from[rank] = sizes[rank]

    def _signal(self, rank: int, signum: int) -> None:
        try:
            os.kill(self.processes[rank].pid, signum)
        except ProcessLookupError:
            pass

    def _size(self, rank: int) -> int:
        try:
            return os.path.getsize(self.output_path(rank))
        except OSError:
            return 0

    def _read(self, rank: int) -> bytes:
        try:
            with open(self.output_path(rank), "rb") as f:
                return f.read()
        except OSError:
            return b""

    def _collect_output(self) -> None:
        for record in self.records:
            data = self._read(record.rank)
            cut = self._stack_from.get(record.rank, len(data))
            record.output = data[:cut].decode(errors="replace")
            record.stack = without_lifeline(data[cut:].decode(errors="replace"))

    def _stream(self) -> None:
        """Print new complete lines of every rank's output, prefixed by its rank."""
        for rank in range(len(self.records)):
            data = self._read(rank)[self._streamed[rank]:]
            done = self.processes[rank].exitcode is not None
            end = len(data) if done else data.rfind(b"\n") + 1
            for line in data[:end].decode(errors="replace").splitlines():
                print(f"[rank {rank}] {line}", file=sys.stdout, flush=True)
            self._streamed[rank] += end

    def close(self) -> None:
        """Kill what still runs and remove the private dir (rendezvous file, outputs, temp)."""
        for process in self.processes:
            if process.exitcode is None:
                process.kill()
        for process in self.processes:
            process.join(5)
            if process.exitcode is not None:
                process.close()
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
        shutil.rmtree(self.work_dir, ignore_errors=True)


class MultiProcessTestCase(TestCase):
    """Each test method runs in `world_size` fresh processes, one per rank; the parent supervises.

    In the parent `self.rank == MAIN_PROCESS_RANK`; in a rank, `self.rank`, `self.world_size`,
    `self.file_name` (private rendezvous file) and `self.init_method` (`file://` + it) describe
    the run. Launched by torchrun, nothing is spawned: this process is the rank.
    """

    MAIN_PROCESS_RANK = MAIN_PROCESS_RANK
    timeout: float = _DefaultTimeout()  # type: ignore[assignment]  # seconds; classes may set
    grid_sync_timeout: float = 30.0  # seconds a rank waits for the others after a grid point

    def __init__(self, methodName: str = "runTest") -> None:  # noqa: N803 - unittest's naming
        super().__init__(methodName)
        self.rank = MAIN_PROCESS_RANK
        self.file_name: Optional[str] = None
        self.init_method = ""
        self.processes: List[Any] = []  # multiprocessing.Process per rank, closed after the test
        self.rank_records: List[RankRecord] = []  # what each rank reported (pid, exit code, ...)
        self._ranks: Optional[RankGroup] = None
        self._grid_store: Any = None
        self._grid_index = 0
        self._torchrun = devices.torchrun_env()
        if self._torchrun is not None:
            # Launched by torchrun, this process is the rank; harness/torchrun.py keeps ranks in
            # step and gathers results, and its init_method (unlike env://) lets every test
            # create and destroy its own group on the launcher's store.
            from harness import torchrun

            self.rank = self._torchrun[0]
            self.init_method = torchrun.init_method()
        method = getattr(self, methodName, None)
        if method is not None:
            setattr(self, methodName, self._join_or_run(method))

    @property
    def world_size(self) -> int:
        launched = self._torchrun
        return launched[1] if launched is not None else devices.default_world_size()

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def _join_or_run(self, method: Callable) -> Callable:
        @functools.wraps(method)
        def join_or_run(*args: Any, **kwargs: Any) -> Any:
            if self.rank == MAIN_PROCESS_RANK:
                return self._join_processes()
            return method(*args, **kwargs)

        return join_or_run

    def _spawn_processes(self) -> None:
        """Start the ranks (parent only; a no-op in a rank and when already started)."""
        if self._torchrun is not None:
            self._check_torchrun_world_size()
            return
        if self.rank != MAIN_PROCESS_RANK or self._ranks is not None:
            return
        check_requirements(getattr(self, self._testMethodName))
        world_size = self.world_size
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise devices.HarnessConfigError(
                f"{type(self).__name__}.world_size must be a positive int, got {world_size!r}"
            )
        timeout = self.timeout
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise devices.HarnessConfigError(
                f"{type(self).__name__}.timeout must be a positive number of seconds, "
                f"got {timeout!r}"
            )
        group = RankGroup(world_size)
        self._ranks = group
        self.file_name = group.file_name
        self.init_method = f"file://{group.file_name}"
        try:
            group.start(_context(type(self).__module__), self._rank_spec)
        except BaseException:
            group.close()
            raise
        self.processes = group.processes

    def _rank_spec(self, rank: int) -> RankSpec:
        group = self._ranks
        assert group is not None
        return RankSpec(
            module=type(self).__module__,
            qualname=type(self).__qualname__,
            method=self._testMethodName,
            rank=rank,
            world_size=len(group.records),
            file_name=group.file_name,
            output_path=group.output_path(rank),
            temp_dir=group.temp_dir,
            threads=devices.intra_op_threads(len(group.records)),
            env=dict(os.environ),
        )

    def _attach_rank(self, rank: int, world_size: int, file_name: str) -> None:
        """Called in a rank process (harness/rank.py) on the freshly built case."""
        if self.world_size != world_size:
            raise RuntimeError(
                f"{type(self).__name__}.world_size is {self.world_size} in rank {rank} but "
                f"{world_size} in the parent: it must not depend on the process"
            )
        self.rank = rank
        self.file_name = file_name
        self.init_method = f"file://{file_name}"

    def _check_torchrun_world_size(self) -> None:
        assert self._torchrun is not None
        check_requirements(getattr(self, self._testMethodName))
        launched = self._torchrun[1]
        if self.world_size != launched:
            raise unittest.SkipTest(
                f"needs world size {self.world_size}, torchrun launched {launched} processes"
            )

    def _join_processes(self) -> None:
        """Wait for the ranks and turn their reports into this test's outcome."""
        group = self._ranks
        if group is None:
            raise RuntimeError(
                f"{type(self).__name__}.setUp did not start the ranks: call super().setUp()"
            )
        timeout = self.timeout
        try:
            timed_out = group.supervise(timeout)
        finally:
            group.close()
        self.rank_records = group.records
        verdict = decide(group.records, timeout if timed_out else None)
        self._grid_points_run = verdict.grid_points
        for point in verdict.subtests:
            self._replay(point)
        if verdict.kind == "fail":
            raise self.failureException(verdict.message)
        if verdict.kind == "skip":
            raise unittest.SkipTest(verdict.message)

    def _replay(self, point: SubtestVerdict) -> None:
        """Report a grid point the ranks ran as this test's own subtest, with its params."""
        with self.subTest(**point.params):
            if point.status == "fail":
                raise self.failureException(point.text)
            if point.status == "skip":
                raise unittest.SkipTest(point.text)

    def _grid_point_done(self, params: Dict[str, Any], passed: bool) -> bool:
        """Ranks meet after each grid point through a store beside the rendezvous file.

        A store, not a collective, so ranks still meet when a failed point left the process
        group unusable. The last rank to arrive writes the verdict "go"; a rank that waited
        `grid_sync_timeout` in vain (a peer is stuck, say in a collective with a rank that
        failed) writes "abandoned" instead. The first verdict written wins, so every rank
        takes the same decision: go on with the grid, or end it (return False).
        """
        if self.rank == MAIN_PROCESS_RANK or self._torchrun is not None or not self.file_name:
            return True
        import torch.distributed as dist

        if self._grid_store is None:
            self._grid_store = dist.FileStore(f"{self.file_name}.grid", self.world_size)
        store, point = self._grid_store, f"point{self._grid_index}"
        self._grid_index += 1
        if store.add(f"{point}/arrived", 1) == self.world_size:
            store.compare_set(f"{point}/verdict", "", "go")
        try:
            store.wait([f"{point}/verdict"], timedelta(seconds=self.grid_sync_timeout))
        except RuntimeError:
            pass
        return store.compare_set(f"{point}/verdict", "", "abandoned") == b"go"
