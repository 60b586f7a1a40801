"""In-process mode under torchrun: each launched process is one rank and runs the tests itself.

Two things differ from the spawning harness, and both live here:

* Process groups. torchrun's agent keeps one TCPStore for the whole job, and `env://` always
  puts the default group's keys under the same prefix, so a second `init_process_group`
  (FSDPTest creates and destroys the group for every test) reads the first group's stale
  keys and fails to connect. `init_method()` returns a URL of our own scheme whose handler
  gives every initialisation a fresh namespace of that store; ranks agree on it because they
  run the same tests in the same order and so initialise the same number of times.
* Results. `RankExchange` posts each rank's result of a test to the same store and waits for
  every rank's result, which both keeps the ranks in step and lets every rank (rank 0 to
  report, the others to stop together under `-x`) see the merged outcome.

Works with torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True); for launchers that
only set RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, rank 0 hosts the store on MASTER_PORT.
"""

from __future__ import annotations

import itertools
import os
from datetime import timedelta
from typing import Any, Iterator, List, Optional, Tuple
from urllib.parse import parse_qs, urlparse

from harness import devices

SCHEME = "harness-torchrun"
DEFAULT_MASTER_PORT = 29500
STORE_TIMEOUT_S = 300.0

_store: Any = None
_registered = False
_scope = "run"
_inits = itertools.count()


class RanksOutOfStep(RuntimeError):
    """Some ranks did not report a test in time: the run cannot go on in step."""

    def __init__(self, missing: List[int], waited: float) -> None:
        self.missing = missing
        names = ", ".join(str(rank) for rank in missing)
        super().__init__(
            f"rank(s) {names} did not finish within {waited:g}s; "
            "the ranks are out of step, so the run stops here"
        )


def _rank_and_world() -> Tuple[int, int]:
    launched = devices.torchrun_env()
    if launched is None:
        raise RuntimeError("not launched by torchrun: RANK, WORLD_SIZE and MASTER_ADDR are unset")
    return launched


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
    """Start counting group inits afresh under `name` (the runner calls it before each test),
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
            missing = [rank for rank, key in enumerate(keys) if not self._store.check([key])]
            raise RanksOutOfStep(missing, timeout) from None
        return [self._store.get(key).decode("utf-8") for key in keys]

    def finish(self, timeout: float) -> None:
        """Rank 0 waits until every rank is done with the store (rank 0 may be hosting it)."""
        self._store.set(f"end/{self.rank}", "1")
        if self.rank == 0:
            keys = [f"end/{rank}" for rank in range(self.world_size)]
            try:
                self._store.wait(keys, timedelta(seconds=timeout))
            except Exception:  # a rank that is gone cannot use the store any more anyway
                return
