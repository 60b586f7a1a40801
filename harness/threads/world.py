"""The rendezvous of rank threads: where every collective of the threaded backend meets.

Why it exists: gloo cannot serve ranks that are threads of one process (it waits on
its peers while holding the GIL, so two rank threads deadlock). Here every collective
is a rendezvous in process memory: each rank deposits its payload into a slot keyed by
(group, call number); the last rank to arrive runs the collective's arithmetic for
everyone, and waiters sleep on a `threading.Condition`, which releases the GIL.

A `ThreadedWorld` is the shared state of one multi-threaded run. Rank threads bind to it
(`bind_thread`) before calling `init_process_group` on the harness's threaded backend. The
world releases waiters when a rank leaves (finishes the test, or parks at the end of a grid
point) without joining a collective, or when the run is aborted, so a failing thread never
deadlocks the others. It knows nothing of c10d or of what a collective computes:
harness/threads/backend.py adapts it to a process group, and
harness/threads/collective_math.py computes.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable, Iterator, List, Optional, Sequence

import torch
import torch.distributed as dist

from harness.outcome.collective_trace import DEFAULT_GROUP, CollectiveCall, tensor_text

Payload = Any
DEFAULT_GROUP_NAME = "0"  # c10d names a thread's first group, its default group, "0"
ENTERED_KEPT = 64  # collectives remembered per rank for the hang report
OpFn = Callable[[list], None]


class CollectiveError(RuntimeError):
    """A collective of the threaded backend could not complete."""


class RankReleased(CollectiveError):
    """Raised in a rank whose collective was abandoned because another rank left or failed."""


class Collective:
    """One collective call shared by all ranks of a group: their payloads and the outcome."""

    def __init__(self, name: str, signature: tuple, members: Sequence[int], op: OpFn) -> None:
        self.name = name
        self.signature = signature
        self.members = tuple(members)  # global ranks, indexed by group rank
        self.op = op
        self.payloads: list = [None] * len(members)
        self.arrived = [False] * len(members)
        self.done = False
        self.error: Optional[str] = None
        self.callbacks: list[Callable[[], None]] = []

    def describe(self) -> str:
        args = ", ".join(str(s) for s in self.signature)
        return f"{self.name}({args})"


class ThreadedWorld:
    """Shared state of one run whose ranks are threads: collective slots, exits, grid sync."""

    def __init__(self, world_size: int, timeout: float) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.timeout = float(timeout)
        self.store = dist.HashStore()
        self._cond = threading.Condition()
        self._pending: dict[tuple, Collective] = {}
        self._seq: dict[tuple, int] = {}
        self._epoch = 0
        self._left: dict[int, str] = {}  # rank -> why it will not join collectives now
        self._failure: Optional[str] = None
        self._sync_labels: dict[int, str] = {}
        self._sync_generation = 0
        self._sync_agreed: dict[int, bool] = {}  # generation -> every rank had the same label
        # rank -> its latest collectives (call, name, group name, number on the group, its place
        # in the group), so a hang report can say where each rank is; bounded. A completed
        # call drops its payloads (below), so the log holds no tensor once a call is done.
        self._entered: dict[int, deque] = {r: deque(maxlen=ENTERED_KEPT) for r in range(world_size)}

    # --- aborting and leaving -------------------------------------------------------
    def abort(self, reason: str) -> None:
        """Release every rank waiting in this world; later collectives fail at once."""
        with self._cond:
            if self._failure is None:
                self._failure = reason
            self._cond.notify_all()

    def rank_exited(self, rank: int, why: str) -> None:
        """Record that `rank` finished; ranks waiting for it in a collective are released."""
        with self._cond:
            self._left[rank] = why
            self._cond.notify_all()

    # --- collectives ----------------------------------------------------------------
    def start(
        self,
        group_key: tuple,
        members: Sequence[int],
        global_rank: int,
        name: str,
        signature: tuple,
        payload: Payload,
        op: OpFn,
    ) -> Collective:
        """Deposit this rank's payload for its next call on the group; the last rank computes."""
        group_rank = members.index(global_rank)
        _settle_streams(payload)  # this rank's inputs are ready before another thread reads them
        with self._cond:
            if self._failure is not None:
                raise RankReleased(f"{name} on rank {global_rank}: run aborted: {self._failure}")
            counter = (global_rank, group_key)
            seq = self._seq.get(counter, 0)
            self._seq[counter] = seq + 1
            slot = (self._epoch, group_key, seq)
            coll = self._pending.get(slot)
            if coll is None:
                coll = Collective(name, signature, members, op)
                self._pending[slot] = coll
            elif (coll.name, coll.signature) != (name, signature) and coll.error is None:
                first = coll.members[coll.arrived.index(True)]
                coll.error = (
                    f"collective mismatch on group {group_key[0]!r} (call #{seq}): rank {first} "
                    f"called {coll.describe()}, rank {global_rank} called "
                    f"{name}({', '.join(str(s) for s in signature)})"
                )
                self._cond.notify_all()
            self._entered[global_rank].append((coll, name, group_key[0], seq + 1, group_rank))
            coll.payloads[group_rank] = payload
            coll.arrived[group_rank] = True
            last = all(coll.arrived)
            if last:
                del self._pending[slot]
        if last:
            self._complete(coll)
        return coll

    def _complete(self, coll: Collective) -> None:
        error = coll.error
        if error is None:
            try:
                with torch.no_grad():
                    coll.op(coll.payloads)
                _settle_streams(coll.payloads)  # outputs are ready before any rank goes on
            except Exception as exc:  # reported to every rank of the collective
                error = f"{coll.name} failed: {type(exc).__name__}: {exc}"
        with self._cond:
            coll.error = error
            coll.done = True
            if error is None:  # a failed call keeps them: its report shows what each rank sent
                coll.payloads = [None] * len(coll.payloads)
            callbacks, coll.callbacks = coll.callbacks, []
            self._cond.notify_all()
        for callback in callbacks:
            callback()

    def on_done(self, coll: Collective, callback: Callable[[], None]) -> None:
        """Run `callback` once `coll` is done (at once if it already is)."""
        with self._cond:
            if not coll.done:
                coll.callbacks.append(callback)
                return
        callback()

    def wait(self, coll: Collective, global_rank: int, timeout: Optional[float] = None) -> None:
        """Block (GIL released) until `coll` completes; raise if it cannot."""
        limit = self.timeout if not timeout else timeout
        with self._cond:
            self._cond.wait_for(
                lambda: coll.done or coll.error is not None or self._blocker(coll) is not None,
                timeout=limit,
            )
            if coll.error is not None:
                raise CollectiveError(f"{coll.error} (seen on rank {global_rank})")
            if coll.done:
                return
            blocker = self._blocker(coll)
            missing = [m for m, a in zip(coll.members, coll.arrived) if not a]
        if blocker is not None:
            raise RankReleased(f"{coll.describe()} on rank {global_rank} abandoned: {blocker}")
        raise CollectiveError(
            f"{coll.describe()} on rank {global_rank} timed out after {limit:g}s "
            f"waiting for ranks {missing}"
        )

    def entered(self, rank: int) -> List[CollectiveCall]:
        """The latest collectives `rank` entered, oldest first, and whether each completed."""
        with self._cond:
            entries = list(self._entered[rank])
        return [
            CollectiveCall(
                op=name,
                group=DEFAULT_GROUP if group == DEFAULT_GROUP_NAME else f"group {group}",
                seq=seq,
                inputs=tuple(
                    tensor_text(str(t.dtype).replace("torch.", ""), t.shape)
                    for t in _tensors_in(coll.payloads[group_rank])
                ),
                completed=coll.done and coll.error is None,
            )
            for coll, name, group, seq, group_rank in entries
        ]

    def _blocker(self, coll: Collective) -> Optional[str]:
        if self._failure is not None:
            return f"run aborted: {self._failure}"
        for member, arrived in zip(coll.members, coll.arrived):
            if not arrived and member in self._left:
                return f"rank {member} {self._left[member]} without joining it"
        return None

    # --- keeping ranks in step between grid points ------------------------------------
    def sync_point(self, rank: int, label: str) -> bool:
        """Wait until every rank reaches the same point; False if they cannot stay in step.

        Once all ranks are here, collectives left half-joined are dropped and call
        numbering restarts, so the next grid point starts aligned even when the previous
        one failed on some ranks part-way.
        """
        with self._cond:
            generation = self._sync_generation
            self._sync_labels[rank] = label
            self._left[rank] = f"finished grid point {label}"
            if len(self._sync_labels) == self.world_size:
                agreed = len(set(self._sync_labels.values())) == 1
                self._sync_agreed[generation] = agreed
                self._reset_epoch()
                self._sync_generation += 1
                self._cond.notify_all()
                return agreed
            self._cond.notify_all()
            passed = self._cond.wait_for(
                lambda: self._sync_generation != generation
                or self._failure is not None
                or any(r not in self._sync_labels for r in self._left),
                timeout=self.timeout,
            )
            if passed and self._sync_generation != generation:
                return self._sync_agreed[generation]
            self._sync_labels.pop(rank, None)
            self._left[rank] = f"gave up waiting at grid point {label}"
            self._cond.notify_all()
            return False

    def _reset_epoch(self) -> None:
        for coll in self._pending.values():
            coll.error = coll.error or f"{coll.describe()} abandoned at the end of a grid point"
        self._pending.clear()
        self._seq.clear()
        self._epoch += 1
        for rank in self._sync_labels:
            self._left.pop(rank, None)
        self._sync_labels.clear()


def _tensors_in(payload: Any) -> Iterator[torch.Tensor]:
    stack = [payload]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            yield item
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed(item))


def _settle_streams(payload: Any) -> None:
    """Wait for this thread's current CUDA streams on the devices of `payload`'s tensors.

    Ranks are threads, so one rank's copies run on another thread's streams; synchronising
    at hand-over keeps what NCCL guarantees: inputs are read after they are written, and
    outputs are complete when the collective is.
    """
    if not torch.cuda.is_initialized():
        return
    devices = {t.device for t in _tensors_in(payload) if t.is_cuda}
    for device in devices:
        torch.cuda.current_stream(device).synchronize()


# --- binding rank threads to a world ---------------------------------------------------
_local = threading.local()


def bind_thread(world: ThreadedWorld, rank: int) -> None:
    """Make the calling thread rank `rank` of `world` (read by the backend's creator)."""
    if not 0 <= rank < world.world_size:
        raise ValueError(f"rank {rank} is outside world of size {world.world_size}")
    _local.world, _local.rank = world, rank


def unbind_thread() -> None:
    _local.__dict__.clear()


def current_world() -> Optional[ThreadedWorld]:
    return getattr(_local, "world", None)
