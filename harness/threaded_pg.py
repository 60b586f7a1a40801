"""The `threaded` process-group backend: ranks are threads of one process.

Why it exists: gloo cannot serve ranks that are threads of one process (it waits on
its peers while holding the GIL, so two rank threads deadlock). Here every collective
is a rendezvous in process memory: each rank deposits its tensors into a slot keyed by
(group, call number); the last rank to arrive computes the result for everyone, and
waiters sleep on a `threading.Condition`, which releases the GIL.

A `ThreadedWorld` is the shared state of one multi-threaded run. Rank threads bind to
it (`bind_thread`) before calling `init_process_group("threaded", ...)`. The world
releases waiters when a rank leaves (finishes the test, or parks at the end of a grid
point) without joining a collective, or when the run is aborted, so a failing thread
never deadlocks the others.
"""

from __future__ import annotations

import datetime
import threading
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

BACKEND_NAME = "threaded"

Payload = Any
OpFn = Callable[[list], None]


class CollectiveError(RuntimeError):
    """A collective of the threaded backend could not complete."""


class RankReleased(CollectiveError):
    """Raised in a rank whose collective was abandoned because another rank left or failed."""


class _Collective:
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
        self._pending: dict[tuple, _Collective] = {}
        self._seq: dict[tuple, int] = {}
        self._epoch = 0
        self._left: dict[int, str] = {}  # rank -> why it will not join collectives now
        self._failure: Optional[str] = None
        self._sync_labels: dict[int, str] = {}
        self._sync_generation = 0
        self._sync_agreed: dict[int, bool] = {}  # generation -> every rank had the same label

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
    ) -> _Collective:
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
                coll = _Collective(name, signature, members, op)
                self._pending[slot] = coll
            elif (coll.name, coll.signature) != (name, signature) and coll.error is None:
                first = coll.members[coll.arrived.index(True)]
                coll.error = (
                    f"collective mismatch on group {group_key[0]!r} (call #{seq}): rank {first} "
                    f"called {coll.describe()}, rank {global_rank} called "
                    f"{name}({', '.join(str(s) for s in signature)})"
                )
                self._cond.notify_all()
            coll.payloads[group_rank] = payload
            coll.arrived[group_rank] = True
            last = all(coll.arrived)
            if last:
                del self._pending[slot]
        if last:
            self._complete(coll)
        return coll

    def _complete(self, coll: _Collective) -> None:
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
            callbacks, coll.callbacks = coll.callbacks, []
            self._cond.notify_all()
        for callback in callbacks:
            callback()

    def on_done(self, coll: _Collective, callback: Callable[[], None]) -> None:
        """Run `callback` once `coll` is done (at once if it already is)."""
        with self._cond:
            if not coll.done:
                coll.callbacks.append(callback)
                return
        callback()

    def wait(self, coll: _Collective, global_rank: int, timeout: Optional[float] = None) -> None:
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

    def _blocker(self, coll: _Collective) -> Optional[str]:
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


def _settle_streams(payload: Any) -> None:
    """Wait for this thread's current CUDA streams on the devices of `payload`'s tensors.

    Ranks are threads, so one rank's copies run on another thread's streams; synchronising
    at hand-over keeps what NCCL guarantees: inputs are read after they are written, and
    outputs are complete when the collective is.
    """
    if not torch.cuda.is_initialized():
        return
    stack, devices = [payload], set()
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            if item.is_cuda:
                devices.add(item.device)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
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


# --- the process group ----------------------------------------------------------------
def _unsupported(name: str) -> Callable[..., Any]:
    def method(self: ThreadedProcessGroup, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"the threaded backend does not implement {name}")

    method.__name__ = name
    return method


class ThreadedWork(dist.Work):
    """Handle of one rank's part of a collective; `wait()` blocks until it completes."""

    def __init__(self, pg: ThreadedProcessGroup, coll: _Collective, outputs: list) -> None:
        super().__init__()
        self._pg, self._coll, self._outputs = pg, coll, outputs
        self._future: Optional[torch.futures.Future] = None

    def wait(self, timeout: Optional[datetime.timedelta] = None) -> bool:
        seconds = timeout.total_seconds() if timeout is not None else None
        self._pg.world.wait(self._coll, self._pg.global_rank, seconds)
        return True

    def is_completed(self) -> bool:
        return self._coll.done or self._coll.error is not None

    def is_success(self) -> bool:
        return self._coll.done and self._coll.error is None

    def exception(self) -> Optional[BaseException]:
        return None if self._coll.error is None else CollectiveError(self._coll.error)

    def result(self) -> list:
        self.wait()
        return self._outputs

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> torch.futures.Future:
        if self._future is None:
            future = self._future = torch.futures.Future()

            def resolve() -> None:
                if self._coll.error is None:
                    future.set_result(self._outputs)
                else:
                    future.set_exception(CollectiveError(self._coll.error))

            self._pg.world.on_done(self._coll, resolve)
        return self._future


class ThreadedProcessGroup(dist.ProcessGroup):
    """A process group whose peers are threads bound to the same `ThreadedWorld`."""

    def __init__(
        self, world: ThreadedWorld, rank: int, size: int, name: str, global_ranks: list[int]
    ) -> None:
        super().__init__(rank, size)
        self.world = world
        self._name = name
        self.members = tuple(global_ranks) if global_ranks else tuple(range(size))
        self.global_rank = self.members[rank]
        self._key = (name, self.members)

    @property
    def group_name(self) -> str:
        return self._name

    def getBackendName(self) -> str:  # noqa: N802 (name fixed by c10d)
        return BACKEND_NAME

    def __repr__(self) -> str:
        return f"ThreadedProcessGroup({self._name!r}, rank={self.rank()}, ranks={self.members})"

    def _run(self, name: str, signature: tuple, payload: Payload, outputs: list, op: OpFn):
        coll = self.world.start(
            self._key, self.members, self.global_rank, name, signature, payload, op
        )
        return ThreadedWork(self, coll, outputs)

    # c10d calls these by name (from Python, and from C++ through the pybind trampoline).
    def barrier(self, opts: Any = None) -> ThreadedWork:
        return self._run("barrier", (), None, [], _noop)

    def broadcast(self, tensors: list, opts: Any) -> ThreadedWork:
        _one("broadcast", tensors)
        return self._run("broadcast", (opts.rootRank,), tensors[0], tensors,
                         lambda p: _broadcast(p, opts.rootRank))

    def allreduce(self, tensors: list, opts: Any) -> ThreadedWork:
        _one("all_reduce", tensors)
        op = _op_name(opts.reduceOp)
        return self._run("all_reduce", (op,), tensors, tensors, lambda p: _all_reduce(p, op))

    def allreduce_coalesced(self, tensors: list, opts: Any) -> ThreadedWork:
        op = _op_name(opts.reduceOp)
        return self._run("all_reduce_coalesced", (op, len(tensors)), tensors, tensors,
                         lambda p: _all_reduce(p, op))

    def reduce(self, tensors: list, opts: Any) -> ThreadedWork:
        _one("reduce", tensors)
        op, root = _op_name(opts.reduceOp), opts.rootRank
        return self._run("reduce", (op, root), tensors[0], tensors, lambda p: _reduce(p, op, root))

    def allgather(self, output_lists: list, inputs: list, opts: Any = None) -> ThreadedWork:
        _one("all_gather", inputs)
        _one("all_gather", output_lists)
        return self._run("all_gather", (), (output_lists[0], inputs), output_lists,
                         _all_gather_coalesced)

    def allgather_coalesced(self, output_lists: list, inputs: list, opts: Any = None):
        return self._run("all_gather_coalesced", (len(inputs),), (output_lists, inputs),
                         output_lists, _all_gather_coalesced_lists)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None):
        return self._run("all_gather_single", (), ([output], [input]), [output],
                         _all_gather_single)

    def all_gather_single_coalesced(self, outputs: list, inputs: list, opts: Any = None):
        return self._run("all_gather_single_coalesced", (len(inputs),), (outputs, inputs),
                         outputs, _all_gather_single)

    def reduce_scatter(self, outputs: list, input_lists: list, opts: Any) -> ThreadedWork:
        _one("reduce_scatter", outputs)
        _one("reduce_scatter", input_lists)
        op = _op_name(opts.reduceOp)
        return self._run("reduce_scatter", (op,), (outputs[0], input_lists[0]), outputs,
                         lambda p: _reduce_scatter(p, op))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any):
        op = _op_name(opts.reduceOp)
        return self._run("reduce_scatter_single", (op,), ([output], [input]), [output],
                         lambda p: _reduce_scatter_single(p, op))

    def reduce_scatter_single_coalesced(self, outputs: list, inputs: list, opts: Any):
        op = _op_name(opts.reduceOp)
        return self._run("reduce_scatter_single_coalesced", (op, len(inputs)),
                         (outputs, inputs), outputs, lambda p: _reduce_scatter_single(p, op))

    def alltoall(self, outputs: list, inputs: list, opts: Any = None) -> ThreadedWork:
        return self._run("all_to_all", (), (outputs, inputs), outputs, _all_to_all)

    def all_to_all_single(self, output, input, output_splits, input_splits, opts: Any = None):
        payload = (output, input, list(output_splits or []), list(input_splits or []))
        return self._run("all_to_all_single", (), payload, [output], _all_to_all_single)

    def gather(self, output_lists: list, inputs: list, opts: Any) -> ThreadedWork:
        _one("gather", inputs)
        root = opts.rootRank
        outs = output_lists[0] if output_lists else []
        return self._run("gather", (root,), (outs, inputs[0]), output_lists,
                         lambda p: _gather(p, root))

    def scatter(self, outputs: list, input_lists: list, opts: Any) -> ThreadedWork:
        _one("scatter", outputs)
        root = opts.rootRank
        ins = input_lists[0] if input_lists else []
        return self._run("scatter", (root,), (outputs[0], ins), outputs,
                         lambda p: _scatter(p, root))

    # Legacy names some callers still use.
    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    _reduce_scatter_base = reduce_scatter_single
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced
    alltoall_base = all_to_all_single

    # c10d's _coalescing_manager(device=...) brackets eager collectives with these.
    def _start_coalescing(self, device: torch.device) -> None:
        return None

    def _end_coalescing(self, device: torch.device) -> ThreadedWork:
        return self.barrier()

    def shutdown(self) -> None:
        return None

    send = _unsupported("send")
    recv = _unsupported("recv")
    recv_anysource = _unsupported("recv_anysource")
    monitored_barrier = _unsupported("monitored_barrier")
    split_group = _unsupported("split_group")
    merge_remote_group = _unsupported("merge_remote_group")


def _create(backend_opts: Any, pg_options: Any) -> ThreadedProcessGroup:
    world = current_world()
    if world is None:
        raise RuntimeError(
            "the threaded backend needs the calling thread bound to a ThreadedWorld "
            "(harness.threaded_pg.bind_thread) before init_process_group/new_group"
        )
    return ThreadedProcessGroup(
        world,
        backend_opts.group_rank,
        backend_opts.group_size,
        str(backend_opts.group_id),
        list(backend_opts.global_ranks_in_group),
    )


def register() -> None:
    """Register (again) the `threaded` backend with torch.distributed; idempotent.

    Called before each threaded run so that another library registering the same name
    (e.g. torch's own test utilities) cannot silently take over our runs.
    """
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])


# --- the arithmetic of each collective (runs once, in the last rank to arrive) ------------
_REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


def _op_name(op: Any) -> str:
    for name in _REDUCE_OPS:
        if op == getattr(dist.ReduceOp, name):
            return name
    raise NotImplementedError(f"the threaded backend does not implement reduce op {op}")


def _one(name: str, tensors: list) -> None:
    if len(tensors) != 1:
        raise ValueError(f"{name}: threaded backend takes 1 tensor per rank, not {len(tensors)}")


def _noop(payloads: list) -> None:
    return None


def _same_dtype(name: str, tensors: Sequence[torch.Tensor]) -> None:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise TypeError(f"{name}: ranks passed different dtypes {sorted(map(str, dtypes))}")


def _combine(tensors: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """Reduce in rank order, in the tensors' own dtype, so every rank gets identical bits."""
    _same_dtype("reduce", tensors)
    acc = tensors[0].clone()
    floating = acc.is_floating_point() or acc.is_complex()
    if op in ("BAND", "BOR", "BXOR") and floating:
        raise TypeError(f"ReduceOp.{op} needs integer or bool tensors, got {acc.dtype}")
    if op == "AVG" and not floating:
        raise TypeError(f"ReduceOp.AVG needs floating-point tensors, got {acc.dtype}")
    for t in tensors[1:]:
        t = t.to(acc.device)
        if op in ("SUM", "AVG"):
            acc.add_(t)
        elif op == "PRODUCT":
            acc.mul_(t)
        elif op == "MIN":
            torch.minimum(acc, t, out=acc)
        elif op == "MAX":
            torch.maximum(acc, t, out=acc)
        elif op == "BAND":
            acc.bitwise_and_(t)
        elif op == "BOR":
            acc.bitwise_or_(t)
        else:
            acc.bitwise_xor_(t)
    if op == "AVG":
        acc.div_(len(tensors))
    return acc


def _broadcast(payloads: list, root: int) -> None:
    src = payloads[root]
    for rank, dst in enumerate(payloads):
        if rank != root:
            _same_dtype("broadcast", (src, dst))
            dst.copy_(src)


def _all_reduce(payloads: list, op: str) -> None:
    for i in range(len(payloads[0])):
        result = _combine([tensors[i] for tensors in payloads], op)
        for tensors in payloads:
            tensors[i].copy_(result)


def _reduce(payloads: list, op: str, root: int) -> None:
    payloads[root].copy_(_combine(payloads, op))


def _all_gather_coalesced(payloads: list) -> None:
    inputs = [ins[0] for _, ins in payloads]
    _same_dtype("all_gather", inputs)
    for outs, _ in payloads:
        if len(outs) != len(inputs):
            raise ValueError(f"all_gather: {len(outs)} output tensors for {len(inputs)} ranks")
        for out, src in zip(outs, inputs):
            out.copy_(src)


def _all_gather_coalesced_lists(payloads: list) -> None:
    for outs_per_rank, _ in payloads:
        for src_rank, (_, ins) in enumerate(payloads):
            for out, src in zip(outs_per_rank[src_rank], ins):
                out.copy_(src)


def _all_gather_single(payloads: list) -> None:
    for i in range(len(payloads[0][1])):
        inputs = [ins[i] for _, ins in payloads]
        _same_dtype("all_gather_single", inputs)
        flat = torch.cat([t.reshape(-1).to(inputs[0].device) for t in inputs])
        for outs, _ in payloads:
            if outs[i].numel() != flat.numel():
                raise ValueError(
                    f"all_gather_single: output has {outs[i].numel()} elements, expected "
                    f"{len(inputs)} x {inputs[0].numel()}"
                )
            outs[i].copy_(flat.view(outs[i].shape))


def _reduce_scatter(payloads: list, op: str) -> None:
    for rank, (out, _) in enumerate(payloads):
        out.copy_(_combine([ins[rank] for _, ins in payloads], op))


def _reduce_scatter_single(payloads: list, op: str) -> None:
    size = len(payloads)
    for i in range(len(payloads[0][1])):
        inputs = [ins[i].reshape(-1) for _, ins in payloads]
        total = _combine(inputs, op)
        if total.numel() % size:
            raise ValueError(
                f"reduce_scatter_single: input of {total.numel()} elements does not split into "
                f"{size} equal parts"
            )
        for rank, chunk in enumerate(total.chunk(size)):
            out = payloads[rank][0][i]
            if out.numel() != chunk.numel():
                raise ValueError(
                    f"reduce_scatter_single: output has {out.numel()} elements, expected "
                    f"{chunk.numel()}"
                )
            out.copy_(chunk.view(out.shape))


def _all_to_all(payloads: list) -> None:
    for rank, (outs, _) in enumerate(payloads):
        for src_rank, (_, ins) in enumerate(payloads):
            outs[src_rank].copy_(ins[rank])


def _split(tensor: torch.Tensor, splits: list, size: int, what: str) -> list:
    if not splits:
        if tensor.shape[0] % size:
            raise ValueError(
                f"all_to_all_single: {what} dim 0 of {tensor.shape[0]} not divisible by {size}"
            )
        splits = [tensor.shape[0] // size] * size
    if len(splits) != size or sum(splits) != tensor.shape[0]:
        raise ValueError(
            f"all_to_all_single: {what} splits {splits} do not fit dim 0 of {tensor.shape[0]}"
        )
    return list(tensor.split(splits))


def _all_to_all_single(payloads: list) -> None:
    size = len(payloads)
    ins = [_split(p[1], p[3], size, "input") for p in payloads]
    for rank, (out, _, out_splits, _) in enumerate(payloads):
        for src_rank, dst in enumerate(_split(out, out_splits, size, "output")):
            dst.copy_(ins[src_rank][rank])


def _gather(payloads: list, root: int) -> None:
    outs = payloads[root][0]
    if len(outs) != len(payloads):
        raise ValueError(f"gather: root has {len(outs)} output tensors for {len(payloads)} ranks")
    for out, (_, src) in zip(outs, payloads):
        out.copy_(src)


def _scatter(payloads: list, root: int) -> None:
    ins = payloads[root][1]
    if len(ins) != len(payloads):
        raise ValueError(f"scatter: root has {len(ins)} input tensors for {len(payloads)} ranks")
    for (out, _), src in zip(payloads, ins):
        out.copy_(src)
