"""Supervising rank processes from the parent: start, wait, stop, clean up.

`RankGroup` owns everything its ranks leave behind: their processes, the pipes they
report on, and the private dir (rendezvous file, each rank's captured output, temp
files). Fresh ranks run one test and exit; shared ranks (`start(..., shared=True)`, see
harness/process/shared.py) run one test per round, each round with fresh records and its own
output files.

It collects what the ranks report until they have all exited (shared ranks: until each
reported "done" for the round), stops the others once one failed or skipped (the fail-fast
policy of every mode, harness/launch/fail_fast.py), and at the timeout; before stopping a
rank it has the rank dump its Python stack into its output, so the report can show where it
was. Deciding the outcome is
harness/outcome/merge.py's job; harness/process/launchers.py puts the two together.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Dict, List, Set

from harness import settings
from harness.launch.fail_fast import FailFast
from harness.launch.job import Job
from harness.outcome import collective_trace, stacks
from harness.outcome.rank_record import RankRecord, fails_rank
from harness.process import assert_rewrite, forkserver, mp_forkserver
from harness.process.rank import (
    COLLECTIVES_SIGNAL,
    STACK_SIGNAL,
    RankSpec,
    Task,
    collectives_path,
    without_lifeline,
)
from harness.process.rank import main as rank_main
from harness.process.rank import serve as rank_serve
from harness.upstream import network

STACK_DUMP_WAIT_S = 1.0  # how long a rank gets to write its stack before it is killed
COLLECTIVES_DUMP_WAIT_S = 1.0  # ... and the collectives it entered
STREAM_INTERVAL_S = 0.1
# How long reaping a rank that is exiting may take. A spawned rank's sentinel (a pipe) reads
# as closed while the process is still exiting, before it can be reaped: not waiting then
# left its exit code unknown, and a rank that never ran its test counted as passed.
EXIT_REAP_WAIT_S = 5.0


class RankGroup:
    """The rank processes of one test, from start to cleanup, and what they reported."""

    def __init__(self, world_size: int) -> None:
        forkserver.check_not_bootstrapping()  # before anything is created that exit would leave
        # Mode 0700, private to this user; inside multiprocessing's own temp dir, which the
        # forkserver removes when the runner is killed, so not even a SIGKILL leaves it behind.
        self.work_dir = tempfile.mkdtemp(prefix="harness-", dir=mp_forkserver.temp_dir())
        self.file_name = os.path.join(self.work_dir, "rendezvous")
        os.close(os.open(self.file_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        self.temp_dir = os.path.join(self.work_dir, "tmp")
        os.mkdir(self.temp_dir, 0o700)
        self.records = [RankRecord(rank) for rank in range(world_size)]
        self.master_port = network.find_free_port()  # the ranks' MASTER_PORT (env://)
        self.processes: List[Any] = []
        self._readers: Dict[int, Connection] = {}
        self._alive: Set[int] = set()  # ranks whose exit the supervisor has not seen yet
        self._stack_from: Dict[int, int] = {}  # rank -> output offset where its stack dump starts
        self._streamed = [0] * world_size
        self._closed = False
        self._stopped = False  # the processes are gone (`stop`); the private dir may stay
        self._tasks: Dict[int, Connection] = {}  # shared ranks: the pipe each gets its tests on
        self.round = 0  # shared ranks: how many tests they were sent before the current one
        self._began = time.monotonic()  # when the current test was started or sent
        self._round_begun = False
        self._ready_for: Dict[int, int] = {}  # shared rank -> the test it last met the others for
        self._module = ""  # the module of the job whose ranks these are (set by start)

    def output_path(self, rank: int) -> str:
        """This rank's output file for the current test (the first one also has its start)."""
        suffix = f".t{self.round}" if self.round else ""
        return os.path.join(self.work_dir, f"rank{rank}{suffix}.out")

    def collectives_file(self, rank: int) -> str:
        return collectives_path(os.path.join(self.work_dir, f"rank{rank}.out"))

    def test_file(self) -> str:
        """The current test's own rendezvous path (its grid synchronisation lives beside it)."""
        return os.path.join(self.work_dir, f"test{self.round}")

    def start(self, job: Job, shared: bool = False) -> None:
        """Start the ranks of `job`: fresh ones run it; shared ones wait for `send_test`."""
        context = forkserver.context(job.module)
        self._module = job.module
        self._began = time.monotonic()
        sent = job.for_processes()
        for record in self.records:
            reader, writer = context.Pipe(duplex=False)
            args: tuple = (self._spec(sent, record.rank), writer)
            task_reader = None
            if shared:
                task_reader, self._tasks[record.rank] = context.Pipe(duplex=False)
                args += (task_reader,)
            process = context.Process(
                target=rank_serve if shared else rank_main, args=args, name=f"rank{record.rank}"
            )
            self._readers[record.rank] = reader
            try:
                process.start()
            except (EOFError, OSError) as error:
                self._exit_if_missing_guard(forkserver.stopped_for_missing_guard())
                if settings.start_method() != "forkserver":
                    raise  # a spawned rank's start: no forkserver, no log of one
                raise forkserver.forkserver_error(error) from error
            finally:
                writer.close()  # the rank holds the only write end: EOF once it exits
                if task_reader is not None:
                    task_reader.close()
            self.processes.append(process)
            record.pid = process.pid
            self._alive.add(record.rank)

    def _exit_if_missing_guard(self, missing: bool) -> None:
        """A forkserver or rank stopped itself while importing the test code: end the run."""
        if missing:
            self.close()
            forkserver.exit_for_missing_guard(self._module)

    def _spec(self, job: Job, rank: int) -> RankSpec:
        world_size = len(self.records)
        return RankSpec(
            job=job,
            rank=rank,
            world_size=world_size,
            file_name=self.file_name,
            work_dir=self.work_dir,
            output_path=self.output_path(rank),
            temp_dir=self.temp_dir,
            threads=settings.intra_op_threads(world_size),
            env={**os.environ, **assert_rewrite.settings()},
            master_port=self.master_port,
        )

    def send_test(self, job: Job) -> bool:
        """Shared ranks: begin a round (fresh records and output files) and send every rank
        `job`'s test; False if a rank can no longer be reached."""
        previous = self._forget_round() if self._round_begun else []
        self._round_begun = True
        task_file = self.test_file()
        self._began = time.monotonic()
        try:
            for rank, pipe in self._tasks.items():
                pipe.send(Task(job.method, self.output_path(rank), task_file, job.inputs))
        except OSError:
            return False
        finally:
            for path in previous:  # once the ranks are busy: they need not wait for this
                _remove(path)
        return True

    def _forget_round(self) -> List[str]:
        """Move to the next round; the files of the one before, to remove."""
        previous = [self.output_path(rank) for rank in range(len(self.records))]
        previous.append(f"{self.test_file()}.grid")  # the grid synchronisation's store
        self.round += 1
        self.records = [RankRecord(r.rank, pid=r.pid) for r in self.records]
        self._stack_from = {}
        self._streamed = [0] * len(self.records)
        return previous

    def wait_ready(self, timeout: float) -> bool:
        """Shared ranks: whether every rank got past its pre-test barrier within `timeout`."""
        deadline = time.monotonic() + timeout
        while not all(self._ready(record) for record in self.records):
            now = time.monotonic()
            if now >= deadline or len(self._alive) < len(self.records):
                return False
            self._wait_once(deadline - now)
        return True

    def intact(self) -> bool:
        """Shared ranks: whether all of them are alive, finished the test and can take another."""
        return all(
            r.rank in self._alive and r.rank in self._readers and r.finished for r in self.records
        )

    def supervise(self, timeout: float) -> bool:
        """Collect reports until every rank exited; True if the timeout stopped them."""
        deadline = time.monotonic() + timeout
        fail_fast = FailFast()
        stream = settings.show_output()
        while self._reporting():
            stop_at = min(deadline, fail_fast.stop_at(self.records))
            now = time.monotonic()
            if now >= stop_at:
                break
            wait_s = stop_at - now
            if stream:
                wait_s = min(wait_s, STREAM_INTERVAL_S)
            self._wait_once(wait_s)
            if stream:
                self._stream()
        still_running = self._running()
        self._stop(still_running)
        for rank in list(self._readers):  # what the stopped ranks sent before they were stopped
            self._receive(rank, block=False)
        self._collect_output()
        if stream:
            self._stream()
        return bool(still_running) and not fail_fast.triggered

    def wait_until(self, reached: Callable[[List[RankRecord]], bool], timeout: float) -> None:
        """Take in what the ranks report until `reached(records)` holds, every rank ended, or
        `timeout` seconds passed; stops nothing (`supervise` does, later)."""
        deadline = time.monotonic() + timeout
        stream = settings.show_output()
        while not reached(self.records) and self._reporting():
            now = time.monotonic()
            if now >= deadline:
                return
            self._wait_once(min(deadline - now, STREAM_INTERVAL_S) if stream else deadline - now)
            if stream:
                self._stream()

    def _ready(self, record: RankRecord) -> bool:
        return self._ready_for.get(record.rank, -1) >= self.round or record.finished

    def _reporting(self) -> bool:
        """Whether a rank may still report: it runs the test, or its pipe still holds what
        it sent before it exited."""
        return bool(self._running()) or any(rank not in self._alive for rank in self._readers)

    def _running(self) -> List[int]:
        """Ranks still running the test: alive and (shared ranks) not done with it."""
        return sorted(r for r in self._alive if not (self._tasks and self.records[r].finished))

    def _wait_once(self, wait_s: float) -> None:
        """Take in whatever the ranks reported, or their exits, within `wait_s` seconds."""
        readers = list(self._readers.values())
        sentinels = {self.processes[rank].sentinel: rank for rank in self._alive}
        for item in wait(readers + list(sentinels), wait_s):
            if item in sentinels:
                self._exited(sentinels[item])
            else:
                rank = next((r for r, c in self._readers.items() if c is item), None)
                if rank is not None:  # not closed meanwhile by _exited
                    self._receive(rank)

    def _receive(self, rank: int, block: bool = True) -> None:
        reader = self._readers[rank]
        try:
            while block or reader.poll(0):
                message = reader.recv()
                for event in message if isinstance(message, list) else [message]:
                    if event.kind == "ready":  # a shared rank met the others for a test
                        self._ready_for[rank] = event.count
                        continue
                    self.records[rank].events.append(event)
                    if event.kind == "done":
                        self.records[rank].duration = time.monotonic() - self._began
                    if fails_rank(event):
                        self._note_problem(rank)
                block = False
        except (EOFError, OSError):
            reader.close()
            del self._readers[rank]

    def _exited(self, rank: int) -> None:
        process = self.processes[rank]
        process.join(EXIT_REAP_WAIT_S)
        self._alive.discard(rank)
        record = self.records[rank]
        record.exitcode = process.exitcode
        if rank in self._readers:  # everything it wrote is in the pipe by now
            self._receive(rank, block=False)
            if rank in self._readers and not self._readers[rank].poll(0):
                self._readers.pop(rank).close()
        self._exit_if_missing_guard(
            record.exitcode == forkserver.MISSING_GUARD_EXIT and not record.events
        )
        if record.failed:
            self._note_problem(rank)

    def _note_problem(self, rank: int) -> None:
        record = self.records[rank]
        record.problem_at = min(record.problem_at, time.monotonic())

    def _stop(self, ranks: List[int]) -> None:
        """Have each rank still running dump its collectives and Python stack, then kill it."""
        if not ranks:
            return
        self._read_collectives(ranks)
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
            self.processes[rank].join(EXIT_REAP_WAIT_S)
            self._alive.discard(rank)
            self.records[rank].stopped = True
            self.records[rank].exitcode = self.processes[rank].exitcode
            self._stack_from[rank] = sizes[rank]

    def _read_collectives(self, ranks: List[int]) -> None:
        """Ask the ranks for their flight-recorder logs; a rank that does not answer is unknown."""
        paths = {rank: self.collectives_file(rank) for rank in ranks}
        for rank in ranks:
            self._signal(rank, COLLECTIVES_SIGNAL)
        until = time.monotonic() + COLLECTIVES_DUMP_WAIT_S
        while time.monotonic() < until and not all(map(os.path.exists, paths.values())):
            time.sleep(0.02)
        for rank, path in paths.items():
            try:
                with open(path) as f:
                    self.records[rank].collectives = collective_trace.from_flight_recorder(f.read())
            except (OSError, ValueError):
                pass

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
        """Each rank's output and stack: the dump it wrote when stopped, or the one
        faulthandler wrote when it crashed (taken out of its output), in the report's format."""
        for record in self.records:
            data = self._read(record.rank)
            cut = self._stack_from.get(record.rank, len(data))
            record.output = data[:cut].decode(errors="replace")
            dump = without_lifeline(data[cut:].decode(errors="replace"))
            record.set_stack(stacks.faulthandler_frames(dump), dump.strip())
            if record.exitcode is not None and record.exitcode < 0 and not record.stopped:
                record.output, dump = stacks.split_fatal_error(record.output)
                if dump:
                    record.set_stack(stacks.faulthandler_frames(dump, crashed=True), dump.strip())

    def _stream(self) -> None:
        """Print new complete lines of every rank's output, prefixed by its rank."""
        for rank in range(len(self.records)):
            try:
                with open(self.output_path(rank), "rb") as f:
                    f.seek(self._streamed[rank])
                    data = f.read()
            except OSError:
                continue
            end = len(data) if rank not in self._alive else data.rfind(b"\n") + 1
            for line in data[:end].decode(errors="replace").splitlines():
                print(f"[rank {rank}] {line}", file=sys.stdout, flush=True)
            self._streamed[rank] += end

    def close(self, grace_s: float = 0.0) -> None:
        """Kill what still runs and remove the private dir (rendezvous file, outputs, temp).

        `grace_s`: shared ranks first see their task pipe close and get that long to end
        their set themselves (harness/process/rank.py `serve`: the set's teardown)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.stop(grace_s)
        finally:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def stop(self, grace_s: float = 0.0) -> None:
        """Kill what still runs and close the pipes; the private dir stays (until `close`)."""
        if self._stopped:
            return
        self._stopped = True
        if grace_s and self._tasks:
            for pipe in self._tasks.values():
                pipe.close()
            self._tasks.clear()
            until = time.monotonic() + grace_s
            for process in self.processes:
                process.join(max(0.0, until - time.monotonic()))
        for process in self.processes:
            if process.exitcode is None:
                process.kill()
        for process in self.processes:
            process.join(EXIT_REAP_WAIT_S)
            if process.exitcode is not None:
                process.close()
        for pipe in [*self._readers.values(), *self._tasks.values()]:
            pipe.close()
        self._readers.clear()
        self._tasks.clear()


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
