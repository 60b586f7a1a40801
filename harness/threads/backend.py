"""The harness's threaded process-group backend (`harness_threaded`): ranks are threads of one
process.

Why it exists: c10d needs a registered backend to build process groups from; this one
turns each c10d call (tensors plus options) into a payload and the arithmetic that
serves it (harness/threads/collective_math.py), and hands both to the rank threads' rendezvous
(harness/threads/world.py). A rank thread must be bound to a `ThreadedWorld` before it
calls `init_process_group(BACKEND_NAME, ...)` or `new_group`.

Its name is its own: torch's test utilities register a backend named `threaded` (used by
upstream's `spawn_threads_and_init_comms` and MultiThreadedTestCase), which must keep working
beside this one, so this backend neither takes that name nor reports it.
"""

from __future__ import annotations

import datetime
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from harness.threads import collective_math
from harness.threads.world import (
    Collective,
    CollectiveError,
    OpFn,
    Payload,
    ThreadedWorld,
    current_world,
)

BACKEND_NAME = "harness_threaded"


def _unsupported(name: str) -> Callable[..., Any]:
    def method(self: ThreadedProcessGroup, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"the threaded backend does not implement {name}")

    method.__name__ = name
    return method


def _one(name: str, tensors: list) -> None:
    if len(tensors) != 1:
        raise ValueError(f"{name}: threaded backend takes 1 tensor per rank, not {len(tensors)}")


class ThreadedWork(dist.Work):
    """Handle of one rank's part of a collective; `wait()` blocks until it completes."""

    def __init__(self, pg: ThreadedProcessGroup, coll: Collective, outputs: list) -> None:
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
        return self._run("barrier", (), None, [], collective_math.noop)

    def broadcast(self, tensors: list, opts: Any) -> ThreadedWork:
        _one("broadcast", tensors)
        return self._run("broadcast", (opts.rootRank,), tensors[0], tensors,
                         lambda p: collective_math.broadcast(p, opts.rootRank))

    def allreduce(self, tensors: list, opts: Any) -> ThreadedWork:
        _one("all_reduce", tensors)
        op = collective_math.op_name(opts.reduceOp)
        return self._run("all_reduce", (op,), tensors, tensors,
                         lambda p: collective_math.all_reduce(p, op))

    def allreduce_coalesced(self, tensors: list, opts: Any) -> ThreadedWork:
        op = collective_math.op_name(opts.reduceOp)
        return self._run("all_reduce_coalesced", (op, len(tensors)), tensors, tensors,
                         lambda p: collective_math.all_reduce(p, op))

    def reduce(self, tensors: list, opts: Any) -> ThreadedWork:
        _one("reduce", tensors)
        op, root = collective_math.op_name(opts.reduceOp), opts.rootRank
        return self._run("reduce", (op, root), tensors[0], tensors,
                         lambda p: collective_math.reduce(p, op, root))

    def allgather(self, output_lists: list, inputs: list, opts: Any = None) -> ThreadedWork:
        _one("all_gather", inputs)
        _one("all_gather", output_lists)
        return self._run("all_gather", (), (output_lists[0], inputs), output_lists,
                         collective_math.all_gather_coalesced)

    def allgather_coalesced(self, output_lists: list, inputs: list, opts: Any = None):
        return self._run("all_gather_coalesced", (len(inputs),), (output_lists, inputs),
                         output_lists, collective_math.all_gather_coalesced_lists)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None):
        return self._run("all_gather_single", (), ([output], [input]), [output],
                         collective_math.all_gather_single)

    def all_gather_single_coalesced(self, outputs: list, inputs: list, opts: Any = None):
        return self._run("all_gather_single_coalesced", (len(inputs),), (outputs, inputs),
                         outputs, collective_math.all_gather_single)

    def reduce_scatter(self, outputs: list, input_lists: list, opts: Any) -> ThreadedWork:
        _one("reduce_scatter", outputs)
        _one("reduce_scatter", input_lists)
        op = collective_math.op_name(opts.reduceOp)
        return self._run("reduce_scatter", (op,), (outputs[0], input_lists[0]), outputs,
                         lambda p: collective_math.reduce_scatter(p, op))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any):
        op = collective_math.op_name(opts.reduceOp)
        return self._run("reduce_scatter_single", (op,), ([output], [input]), [output],
                         lambda p: collective_math.reduce_scatter_single(p, op))

    def reduce_scatter_single_coalesced(self, outputs: list, inputs: list, opts: Any):
        op = collective_math.op_name(opts.reduceOp)
        return self._run("reduce_scatter_single_coalesced", (op, len(inputs)),
                         (outputs, inputs), outputs,
                         lambda p: collective_math.reduce_scatter_single(p, op))

    def alltoall(self, outputs: list, inputs: list, opts: Any = None) -> ThreadedWork:
        return self._run("all_to_all", (), (outputs, inputs), outputs, collective_math.all_to_all)

    def all_to_all_single(self, output, input, output_splits, input_splits, opts: Any = None):
        payload = (output, input, list(output_splits or []), list(input_splits or []))
        return self._run("all_to_all_single", (), payload, [output],
                         collective_math.all_to_all_single)

    def gather(self, output_lists: list, inputs: list, opts: Any) -> ThreadedWork:
        _one("gather", inputs)
        root = opts.rootRank
        outs = output_lists[0] if output_lists else []
        return self._run("gather", (root,), (outs, inputs[0]), output_lists,
                         lambda p: collective_math.gather(p, root))

    def scatter(self, outputs: list, input_lists: list, opts: Any) -> ThreadedWork:
        _one("scatter", outputs)
        root = opts.rootRank
        ins = input_lists[0] if input_lists else []
        return self._run("scatter", (root,), (outputs[0], ins), outputs,
                         lambda p: collective_math.scatter(p, root))

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
            "(harness.threads.world.bind_thread) before init_process_group/new_group"
        )
    return ThreadedProcessGroup(
        world,
        backend_opts.group_rank,
        backend_opts.group_size,
        str(backend_opts.group_id),
        list(backend_opts.global_ranks_in_group),
    )


def register() -> None:
    """Register this backend with torch.distributed under its own name; idempotent.

    Called before each threaded run, so that the backend exists whichever module created the
    world; no other registration (torch's `threaded` included) is touched.
    """
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])


def init_default_group(rank: int) -> None:
    """In a rank thread: its default process group, on this backend, in the thread's world
    (a rank of a MultiThreadedTestCase, a marked function's thread rank alike)."""
    world = current_world()
    assert world is not None, "not in a rank thread"
    dist.init_process_group(
        BACKEND_NAME, rank=rank, world_size=world.world_size, store=world.store,
        timeout=datetime.timedelta(seconds=world.timeout),
    )
