"""The torchrun launcher: each process torchrun launched is one rank and runs its tests itself.

`TorchrunLauncher` is the Launcher (harness/launch/launcher.py) that process cases get when
torchrun started this process (harness/process/launchers.py chooses it): `join` runs a second
instance of the test here as this rank (harness/launch/in_process.py), then posts this rank's
RankRecord as JSON to torchrun's store and reads every rank's back, so each rank reaches the
same verdict through the same `decide` as every other mode (rank 0 to report it, the others to
stop together under `-x`). Plain unittest.TestCase tests are not multi-rank: each process runs
them on its own, with no exchange.

Two other things differ from the spawning harness, and both live here:

* Process groups. torchrun's agent keeps one TCPStore for the whole job, and `env://` always
  puts the default group's keys under the same prefix, so a second `init_process_group`
  (FSDPTest creates and destroys the group for every test) reads the first group's stale
  keys and fails to connect. `init_method()` returns a URL of our own scheme whose handler
  gives every initialisation a fresh namespace of that store, counted afresh for every test
  (`new_scope`); ranks agree on it because they run the same tests in the same order.
* The run. The runner asks this module whether this process reports (`reports_here`: rank 0),
  whether the ranks fell out of step (`out_of_step`: one did not report a test in time, so
  the run stops), and lets rank 0 wait for the others at the end (`finish_run`).

Works with torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True); for launchers that
only set RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (with HARNESS_LAUNCHED=1: those four alone
never mean "launched"), rank 0 hosts the store on MASTER_PORT.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import traceback
import unittest
from datetime import timedelta
from typing import Any, Dict, Iterator, List, Optional, Tuple
from urllib.parse import parse_qs, urlparse

from harness import devices
from harness.launch.in_process import run_rank_here
from harness.launch.launcher import Launcher
from harness.outcome import stacks
from harness.outcome.rank_record import RankRecord

SCHEME = "harness-torchrun"
DEFAULT_MASTER_PORT = 29500
STORE_TIMEOUT_S = 300.0
STACK_WAIT_S = 5.0  # how long rank 0 waits for the stacks of ranks that did not report

_store: Any = None
_registered = False
_scope = "run"
_inits = itertools.count()
_launches = itertools.count()  # multi-rank tests started here: the same count on every rank
_exchange: Optional[RankExchange] = None
_out_of_step = ""


class RanksOutOfStep(RuntimeError):
    """Some ranks did not report a test in time: the run cannot go on in step."""

    def __init__(self, missing: List[int], waited: float, reported: Dict[int, str]) -> None:
        self.missing, self.reported = missing, reported  # reported: the others' texts by rank
        names = ", ".join(str(rank) for rank in missing)
        super().__init__(
            f"rank(s) {names} did not finish within {waited:g}s; "
            "the ranks are out of step, so the run stops here"
        )


def launched() -> Optional[Tuple[int, int]]:
    """(rank, world_size) when torchrun (or, with HARNESS_LAUNCHED=1, a launcher setting RANK,
    WORLD_SIZE and MASTER_ADDR) started this process, else None; HarnessConfigError for
    malformed values (the rule: harness/devices.py `torchrun_env`)."""
    return devices.torchrun_env()


def reports_here() -> bool:
    """Whether this process reports the run: always, unless it is a torchrun rank other than 0."""
    found = launched()
    return found is None or found[0] == 0


def out_of_step() -> str:
    """Why the ranks fell out of step (a rank did not report a test in time), or "": once they
    have, the run cannot go on and stops."""
    return _out_of_step


def _rank_and_world() -> Tuple[int, int]:
    found = launched()
    if found is None:
        raise RuntimeError("not launched by torchrun (nor HARNESS_LAUNCHED=1)")
    return found


def launcher_store() -> Any:
    """The job-wide TCPStore: a client of torchrun's agent store, or hosted by rank 0."""
    global _store
    if _store is None:
        import torch.distributed as dist

        rank, world_size = _rank_and_world()
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        _store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ.get("MASTER_PORT", DEFAULT_MASTER_PORT)),
            world_size,
            is_master=rank == 0 and not agent_store,
            timeout=timedelta(seconds=STORE_TIMEOUT_S),
            wait_for_workers=False,
        )
    return _store


def _job_prefix() -> str:
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "job")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"harness/{run_id}/{restart}"


def _rendezvous(url: str, timeout: Optional[timedelta] = None, **_: Any) -> Iterator[Any]:
    """Rendezvous handler: a fresh prefix of the launcher's store for every group init."""
    import torch.distributed as dist

    query = parse_qs(urlparse(url).query)
    rank, world_size = _rank_and_world()
    rank = int(query.get("rank", [rank])[0])
    if int(query.get("world_size", ["-1"])[0]) > 0:
        world_size = int(query["world_size"][0])
    store = dist.PrefixStore(f"{_job_prefix()}/{_scope}/pg{next(_inits)}/", launcher_store())
    if timeout is not None:
        store.set_timeout(timeout)
    yield store, rank, world_size
    raise RuntimeError(f"{SCHEME}:// cannot re-rendezvous; initialise a new group instead")


def new_scope(name: str) -> None:
    """Start counting group inits afresh under `name` (the launcher calls it before each test),
    so a test whose ranks initialised a different number of groups cannot desynchronise the
    namespaces of the tests after it."""
    global _scope, _inits
    _scope, _inits = name, itertools.count()


def init_method() -> str:
    """The `init_method` for `init_process_group` under torchrun (use instead of env://).

    Every call of `init_process_group` with it gets its own namespace in the launcher's
    store, so groups can be created and destroyed once per test.
    """
    global _registered
    if not _registered:
        from torch.distributed.rendezvous import register_rendezvous_handler

        register_rendezvous_handler(SCHEME, _rendezvous)
        _registered = True
    return f"{SCHEME}://"


class RankExchange:
    """Each rank posts one text per test; everyone gets all ranks' texts back, in rank order."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.rank, self.world_size = _rank_and_world()
        self._store = dist.PrefixStore(f"{_job_prefix()}/runner/", launcher_store())
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

    def _get(self, key: str) -> str:
        return self._store.get(key).decode("utf-8")

    def post_stack(self, text: str) -> None:
        """This rank's stack while its part of the current round is overdue."""
        self._store.set(f"stack/{self.rounds}/{self.rank}", text)

    def stacks_of(self, ranks: List[int], wait: float) -> Dict[int, str]:
        """The stacks `ranks` posted in the last round, waiting up to `wait` s for them."""
        keys = {rank: f"stack/{self.rounds - 1}/{rank}" for rank in ranks}
        try:
            self._store.wait(list(keys.values()), timedelta(seconds=wait))
        except Exception:  # some never came: a rank stuck outside Python, or gone
            pass
        return {rank: self._get(key) for rank, key in keys.items() if self._store.check([key])}

    def finish(self, timeout: float) -> None:
        """Rank 0 waits until every rank is done with the store (rank 0 may be hosting it)."""
        self._store.set(f"end/{self.rank}", "1")
        if self.rank == 0:
            keys = [f"end/{rank}" for rank in range(self.world_size)]
            try:
                self._store.wait(keys, timedelta(seconds=timeout))
            except Exception:  # a rank that is gone cannot use the store any more anyway
                return


def _rank_exchange() -> RankExchange:
    global _exchange
    if _exchange is None:
        _exchange = RankExchange()
    return _exchange


def finish_run(timeout: float) -> None:
    """At the end of a run under torchrun: every rank says it is done with the store, and rank
    0 (which may be hosting it) waits up to `timeout` s for them. Not once the ranks fell out
    of step: a missing rank would never say it is done."""
    found = launched()
    if found is not None and found[1] > 1 and not _out_of_step:
        _rank_exchange().finish(timeout)


def _post_stack(exchange: RankExchange, thread_id: int) -> None:
    """The watch of a test that outlived its timeout here: where this rank is now, for the
    report of the rank that gives up waiting for it."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return
    entries = traceback.extract_stack(frame)
    here = run_rank_here.__code__.co_filename  # the frames above it are the runner's
    starts = [i for i, entry in enumerate(entries) if entry.filename == here]
    shown = entries[starts[-1] + 1:] if starts else entries
    # The report's one stack format (most recent call last, harness frames hidden).
    exchange.post_stack(stacks.format_stack(
        [stacks.Frame(e.filename, e.lineno or 0, e.name) for e in shown]
    ))


def _run_here(case: Any, rank: int, world_size: int) -> RankRecord:
    """Run `case`'s test here as `rank`; then destroy the default group it left initialised
    (a rank whose test failed keeps it, as its peers may still be in a collective): this
    process runs the next test too, where a rank process's exit would have taken it."""
    import torch.distributed as dist

    record = run_rank_here(case, rank, world_size, init_method=init_method())
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    return record


class TorchrunLauncher(Launcher):
    """This process is one of the ranks torchrun launched: the test runs here, as this rank,
    and the ranks' records are exchanged through torchrun's store.

    A world size other than the launched one skips the test (it cannot run on these ranks).
    A rank that does not report within the test's timeout after this one finished times the
    test out (with the stack it posted once its own timeout passed) and stops the run
    (`out_of_step`): the ranks can no longer meet test by test.
    """

    def start(self, case: Any) -> None:
        _, world_size = _rank_and_world()
        if case.world_size != world_size:
            raise unittest.SkipTest(
                f"needs world size {case.world_size}, torchrun launched {world_size} processes"
            )
        new_scope(f"test{next(_launches)}")

    def join(self, case: Any) -> Tuple[List[RankRecord], Optional[float]]:
        global _out_of_step
        rank, world_size = _rank_and_world()
        timeout = devices.test_timeout(case)
        if world_size == 1:
            return [_run_here(case, rank, world_size)], None
        exchange = _rank_exchange()
        watch = threading.Timer(timeout, _post_stack, (exchange, threading.get_ident()))
        watch.daemon = True
        watch.start()
        try:
            record = _run_here(case, rank, world_size)
        finally:
            watch.cancel()
            watch.join()
        try:
            texts = exchange.exchange(record.to_json(), timeout)
        except RanksOutOfStep as error:
            _out_of_step = str(error)
            stacks = exchange.stacks_of(error.missing, STACK_WAIT_S)
            records = [RankRecord.from_json(text) for text in error.reported.values()]
            records += [RankRecord(r, stopped=True, stack=stacks.get(r, "")) for r in error.missing]
            return sorted(records, key=lambda found: found.rank), timeout
        return [RankRecord.from_json(text) for text in texts], None

    def close(self) -> None:
        """Nothing outlives the test: it ran in this process, and the store is the job's."""
