"""The torchrun launcher: each process torchrun launched is one rank and runs its tests itself.

`TorchrunLauncher` is the Launcher (harness/launch/launcher.py) that process cases get when
torchrun started this process (harness/process/launchers.py chooses it): `join` runs a second
instance of the test here as this rank (harness/launch/in_process.py), then posts this rank's
RankRecord as JSON to torchrun's store and reads every rank's back, so each rank reaches the
same verdict through the same `decide` as every other mode (rank 0 to report it, the others to
stop together under `-x`). While the test runs, a watch reads the records the other ranks
posted: once one of them ended the test, this rank is stopped by the fail-fast policy of every
mode (harness/launch/fail_fast.py). Plain unittest.TestCase tests are not multi-rank: each
process runs them on its own, with no exchange.

The run's state is one object, `TorchrunRun` (`this_run()`: the one of this process, None
when torchrun did not launch it), which the runner asks and the launcher uses:

* Process groups. torchrun's agent keeps one TCPStore for the whole job, and `env://` always
  puts the default group's keys under the same prefix, so a second `init_process_group`
  (FSDPTest creates and destroys the group for every test) reads the first group's stale
  keys and fails to connect. `init_method()` returns a URL of our own scheme whose handler
  gives every initialisation a fresh namespace of that store, counted afresh for every test
  (`TorchrunRun.new_test`); ranks agree on it because they run the same tests in the same
  order.
* The run. The runner asks it whether this process reports (`reports_here`: rank 0), whether
  the ranks fell out of step (`out_of_step`: one did not report a test in time, so the run
  stops), and lets rank 0 wait for the others at the end (`finish`).

Works with torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True); for launchers that
only set RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (with HARNESS_LAUNCHED=1: those four alone
never mean "launched"), rank 0 hosts the store on MASTER_PORT.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import threading
import time
import traceback
import unittest
from datetime import timedelta
from typing import Any, Dict, Iterator, List, Optional, Tuple
from urllib.parse import parse_qs, urlparse

from harness import settings
from harness.launch.fail_fast import FailFast
from harness.launch.in_process import run_rank_here
from harness.launch.job import Job
from harness.launch.launcher import Launcher, RankSetup
from harness.outcome import stacks
from harness.outcome.rank_record import RankRecord

SCHEME = "harness-torchrun"
DEFAULT_MASTER_PORT = 29500
STORE_TIMEOUT_S = 300.0
STACK_WAIT_S = 5.0  # how long rank 0 waits for the stacks of ranks that did not report
WATCH_INTERVAL_S = 0.2  # how often a running test's watch reads what the other ranks posted
STOP_SIGNAL = signal.SIGUSR1  # the watch stops this rank's test with it (fail-fast)


class RanksOutOfStep(RuntimeError):
    """Some ranks did not report a test in time: the run cannot go on in step."""

    def __init__(self, missing: List[int], waited: float, reported: Dict[int, str]) -> None:
        self.missing, self.reported = missing, reported  # reported: the others' texts by rank
        names = ", ".join(str(rank) for rank in missing)
        super().__init__(
            f"rank(s) {names} did not finish within {waited:g}s; "
            "the ranks are out of step, so the run stops here"
        )


class TorchrunRun:
    """This process's part in a run torchrun launched: the job's store, the namespaces of the
    groups its tests create, the exchange of the ranks' records, and whether the ranks fell out
    of step. The runner asks it (`reports_here`, `out_of_step`, `finish`); the launcher uses
    it for each test."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.out_of_step = ""  # why the ranks fell out of step ("" while they are in step)
        self._store: Any = None
        self._scope = "run"  # the namespace of the current test's groups
        self._inits = itertools.count()  # group initialisations in the current test
        self._tests = itertools.count()  # multi-rank tests started: the same count on every rank
        self._exchange: Optional[RankExchange] = None

    @property
    def reports_here(self) -> bool:
        """Whether this process reports the run: rank 0 does, the others only run."""
        return self.rank == 0

    def store(self) -> Any:
        """The job-wide TCPStore: a client of torchrun's agent store, or hosted by rank 0."""
        if self._store is None:
            import torch.distributed as dist

            agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
            self._store = dist.TCPStore(
                os.environ["MASTER_ADDR"],
                int(os.environ.get("MASTER_PORT", DEFAULT_MASTER_PORT)),
                self.world_size,
                is_master=self.rank == 0 and not agent_store,
                timeout=timedelta(seconds=STORE_TIMEOUT_S),
                wait_for_workers=False,
            )
        return self._store

    def new_test(self) -> None:
        """Count group inits afresh in a namespace of the next test's own (the launcher calls
        it before each test), so a test whose ranks initialised a different number of groups
        cannot desynchronise the namespaces of the tests after it."""
        self._scope, self._inits = f"test{next(self._tests)}", itertools.count()

    def group_store(self) -> Any:
        """A fresh namespace of the job's store for one group initialisation."""
        import torch.distributed as dist

        prefix = f"{_job_prefix()}/{self._scope}/pg{next(self._inits)}/"
        return dist.PrefixStore(prefix, self.store())

    def exchange(self) -> RankExchange:
        """The ranks' exchange of records, one round per multi-rank test."""
        if self._exchange is None:
            self._exchange = RankExchange(self)
        return self._exchange

    def finish(self, timeout: float) -> None:
        """At the end of the run: every rank says it is done with the store, and rank 0
        (which may be hosting it) waits up to `timeout` s for them. Not once the ranks fell
        out of step: a missing rank would never say it is done."""
        if self.world_size > 1 and not self.out_of_step:
            self.exchange().finish(timeout)


_this_run: Optional[TorchrunRun] = None


def this_run() -> Optional[TorchrunRun]:
    """This process's TorchrunRun when torchrun (or, with HARNESS_LAUNCHED=1, another
    launcher) started it as one rank, else None (the rule: harness/settings.py
    `torchrun_env`)."""
    global _this_run
    found = settings.torchrun_env()
    if found is None:
        return None
    if _this_run is None or (_this_run.rank, _this_run.world_size) != found:
        _this_run = TorchrunRun(*found)
    return _this_run


def _launched_run() -> TorchrunRun:
    run = this_run()
    if run is None:
        raise RuntimeError("not launched by torchrun (nor HARNESS_LAUNCHED=1)")
    return run


def _job_prefix() -> str:
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "job")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"harness/{run_id}/{restart}"


def _rendezvous(url: str, timeout: Optional[timedelta] = None, **_: Any) -> Iterator[Any]:
    """Rendezvous handler: a fresh prefix of the launcher's store for every group init."""
    run = _launched_run()
    query = parse_qs(urlparse(url).query)
    rank = int(query.get("rank", [run.rank])[0])
    world_size = run.world_size
    if int(query.get("world_size", ["-1"])[0]) > 0:
        world_size = int(query["world_size"][0])
    store = run.group_store()
    if timeout is not None:
        store.set_timeout(timeout)
    yield store, rank, world_size
    raise RuntimeError(f"{SCHEME}:// cannot re-rendezvous; initialise a new group instead")


def init_method() -> str:
    """The `init_method` for `init_process_group` under torchrun (use instead of env://).

    Every call of `init_process_group` with it gets its own namespace in the launcher's
    store, so groups can be created and destroyed once per test.
    """
    from torch.distributed.rendezvous import register_rendezvous_handler

    try:
        register_rendezvous_handler(SCHEME, _rendezvous)
    except RuntimeError:  # torch's registry has it already (once per process)
        pass
    return f"{SCHEME}://"


class RankExchange:
    """Each rank posts one text per test; everyone gets all ranks' texts back, in rank order."""

    def __init__(self, run: TorchrunRun) -> None:
        import torch.distributed as dist

        self.rank, self.world_size = run.rank, run.world_size
        self._store = dist.PrefixStore(f"{_job_prefix()}/runner/", run.store())
        self.rounds = 0

    def exchange(self, text: str, timeout: float) -> List[str]:
        """Post `text` for this round and wait up to `timeout` s for every rank's text."""
        round_, self.rounds = self.rounds, self.rounds + 1
        keys = [f"{round_}/{rank}" for rank in range(self.world_size)]
        self._store.set(keys[self.rank], text)
        try:
            self._store.wait(keys, timedelta(seconds=timeout))
        except Exception:  # DistStoreError/RuntimeError, depending on the torch version
            there = {rank: self._store.check([key]) for rank, key in enumerate(keys)}
            reported = {rank: self._get(keys[rank]) for rank, found in there.items() if found}
            missing = [rank for rank, found in there.items() if not found]
            raise RanksOutOfStep(missing, timeout, reported) from None
        return [self._get(key) for key in keys]

    def posted(self, known: Dict[int, RankRecord]) -> Dict[int, RankRecord]:
        """The records the other ranks already posted for the coming round (`known`: those
        read before, not read again), without waiting."""
        found = dict(known)
        for rank in range(self.world_size):
            key = f"{self.rounds}/{rank}"
            if rank != self.rank and rank not in found and self._store.check([key]):
                found[rank] = RankRecord.from_json(self._get(key))
        return found

    def _get(self, key: str) -> str:
        return self._store.get(key).decode("utf-8")

    def post_stack(self, frames: List[stacks.Frame]) -> None:
        """This rank's stack while its part of the current round is overdue (its frames, as
        JSON data)."""
        self._store.set(f"stack/{self.rounds}/{self.rank}", json.dumps([list(f) for f in frames]))

    def stacks_of(self, ranks: List[int], wait: float) -> Dict[int, List[stacks.Frame]]:
        """The stacks `ranks` posted in the last round, waiting up to `wait` s for them."""
        keys = {rank: f"stack/{self.rounds - 1}/{rank}" for rank in ranks}
        try:
            self._store.wait(list(keys.values()), timedelta(seconds=wait))
        except Exception:  # some never came: a rank stuck outside Python, or gone
            pass
        return {rank: [stacks.Frame(*f) for f in json.loads(self._get(key))]
                for rank, key in keys.items() if self._store.check([key])}

    def finish(self, timeout: float) -> None:
        """Rank 0 waits until every rank is done with the store (rank 0 may be hosting it)."""
        self._store.set(f"end/{self.rank}", "1")
        if self.rank == 0:
            keys = [f"end/{rank}" for rank in range(self.world_size)]
            try:
                self._store.wait(keys, timedelta(seconds=timeout))
            except Exception:  # a rank that is gone cannot use the store any more anyway
                return


class RankStopped(BaseException):
    """Raised in this rank's test when the watch stops it (fail-fast): unittest reports it as
    an error, which the stopped rank's record leaves out (harness/outcome RecordSink)."""


def _stack_of(thread_id: int) -> List[stacks.Frame]:
    """Where the thread running the test is now (oldest first), from the test's frames down."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return []
    entries = traceback.extract_stack(frame)
    here = run_rank_here.__code__.co_filename  # the frames above it are the runner's
    starts = [i for i, entry in enumerate(entries) if entry.filename == here]
    shown = entries[starts[-1] + 1:] if starts else entries
    return [stacks.Frame(e.filename, e.lineno or 0, e.name) for e in shown]


class _Watch:
    """A thread beside this rank's test: it stops the test once another rank ended it (the
    fail-fast policy), and posts where the test is once it outlived its timeout (for the
    report of the rank that gives up waiting for it).

    The test is stopped with STOP_SIGNAL, whose handler raises RankStopped in the main thread
    (it interrupts a sleep too; a rank blocked inside a collective is reached only when that
    returns, else the exchange's timeout applies): only where the test runs in the main
    thread, and only while the watch is armed, so a stop never lands after the test.
    """

    def __init__(self, exchange: RankExchange, record: RankRecord, timeout: float) -> None:
        self._exchange, self._record, self._timeout = exchange, record, timeout
        self._thread_id = threading.get_ident()
        self._lock = threading.Lock()
        self._armed = False
        self._done = threading.Event()
        self._can_stop = threading.current_thread() is threading.main_thread()
        self._previous: Any = None  # the signal's handler before the watch's
        self._handling = False  # the watch's handler is installed
        self._thread = threading.Thread(target=self._watch, name="harness-torchrun-watch",
                                        daemon=True)

    def start(self) -> None:
        if self._can_stop:
            self._previous = signal.signal(STOP_SIGNAL, self._stop_here)
            self._handling = True
        self._armed = True
        self._thread.start()

    def close(self) -> None:
        """Disarm, end the watch, give the signal its handler back. Idempotent: the stop's
        RankStopped (there is one at most) may interrupt it once, and it is called again."""
        with self._lock:
            self._armed = False
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._handling:
            signal.signal(STOP_SIGNAL, self._previous or signal.SIG_DFL)
            self._handling = False

    def _stop_here(self, signum: int, frame: Any) -> None:
        if self._armed:
            raise RankStopped("another rank ended the test")

    def _watch(self) -> None:
        deadline = time.monotonic() + self._timeout
        policy, stack_posted = FailFast(), False
        peers: Dict[int, RankRecord] = {}
        while not self._done.wait(WATCH_INTERVAL_S):
            now = time.monotonic()
            if now >= deadline and not stack_posted:
                self._exchange.post_stack(_stack_of(self._thread_id))
                stack_posted = True
            if not self._can_stop:
                continue
            peers = self._exchange.posted(peers)
            if now >= policy.stop_at(peers.values()):
                with self._lock:
                    if self._armed:
                        self._record.set_stack(_stack_of(self._thread_id))
                        self._record.stopped = True
                        signal.pthread_kill(self._thread_id, STOP_SIGNAL)
                return


def _run_here(job: Job, run: TorchrunRun, watch_timeout: Optional[float] = None) -> RankRecord:
    """Run `job` here as this rank (watched, when `watch_timeout` is given); then
    destroy the default group it left initialised: this process runs the next test too, where
    a rank process's exit would have taken it."""
    import torch.distributed as dist

    record = RankRecord(run.rank, pid=os.getpid())
    if watch_timeout is None:
        run_rank_here(job, run.rank, run.world_size, record, init_method=init_method())
    else:
        watch = _Watch(run.exchange(), record, watch_timeout)
        try:
            try:
                watch.start()
                run_rank_here(job, run.rank, run.world_size, record, init_method=init_method())
            finally:
                watch.close()
        except RankStopped:  # the stop landed outside the test's own parts: the record has it
            watch.close()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    return record


class TorchrunLauncher(Launcher):
    """This process is one of the ranks torchrun launched: the test runs here, as this rank,
    and the ranks' records are exchanged through torchrun's store.

    A world size other than the launched one skips the test (it cannot run on these ranks).
    Once another rank ended the test, this one is stopped after the fail-fast grace. A rank
    that does not report within the test's timeout after this one finished times the test out
    (with the stack it posted once its own timeout passed) and stops the run (`out_of_step`):
    the ranks can no longer meet test by test.
    """

    def __init__(self, run: TorchrunRun) -> None:
        self.run = run

    def start(self, job: Job) -> RankSetup:
        if job.world_size != self.run.world_size:
            raise unittest.SkipTest(
                f"needs world size {job.world_size}, torchrun launched "
                f"{self.run.world_size} processes"
            )
        self.run.new_test()
        return RankSetup()  # this process is the rank: no file, no processes of its own

    def join(self, job: Job) -> Tuple[List[RankRecord], Optional[float]]:
        run, timeout = self.run, job.timeout
        if run.world_size == 1:
            return [_run_here(job, run)], None
        exchange = run.exchange()
        record = _run_here(job, run, timeout)
        try:
            texts = exchange.exchange(record.to_json(), timeout)
        except RanksOutOfStep as error:
            run.out_of_step = str(error)
            posted = exchange.stacks_of(error.missing, STACK_WAIT_S)
            records = [RankRecord.from_json(text) for text in error.reported.values()]
            for rank in error.missing:
                record = RankRecord(rank, stopped=True)
                record.set_stack(posted.get(rank, []))
                records.append(record)
            return sorted(records, key=lambda found: found.rank), timeout
        return [RankRecord.from_json(text) for text in texts], None

    def close(self) -> None:
        """Nothing outlives the test: it ran in this process, and the store is the job's."""
