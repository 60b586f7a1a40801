"""Upstream's `distributed.distributed_utils`: a mock default process group that answers
rank and world-size queries (and nothing else) in one process, without peers.
"""

from __future__ import annotations

import contextlib
import functools
from datetime import timedelta
from typing import Any, Callable, Iterator, Optional

import torch.distributed as dist
from torch.distributed import distributed_c10d

from harness.compat.fake_pg import backend_registered

__all__ = ["MockProcessGroup", "mock_init_dist", "with_dist", "with_fake_comms"]

MOCK_BACKEND = "mock_process_group"


class MockProcessGroup(dist.ProcessGroup):
    """A group with a rank and a size; any collective on it raises."""

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return MOCK_BACKEND


def _create_mock_pg(prefix_store: Any, rank: int, world_size: int,
                    timeout: timedelta) -> MockProcessGroup:
    return MockProcessGroup(rank, world_size)


def mock_init_dist(rank: int, world_size: int) -> None:
    """Make this process rank `rank` of `world_size` on a MockProcessGroup default group."""
    if dist.is_initialized():
        raise AssertionError("Expected dist to not be initialized")
    if not backend_registered(MOCK_BACKEND):
        dist.Backend.register_backend(MOCK_BACKEND, _create_mock_pg, devices=["cpu", "cuda"])
    store = dist.HashStore()
    # the other ranks never arrive: count them in at the store-based barrier of group 0
    store.add(f"{distributed_c10d.STORE_BASED_BARRIER_PREFIX}:0", world_size - 1)
    dist.init_process_group(backend=MOCK_BACKEND, rank=rank, world_size=world_size,
                            store=store, group_name="fake", timeout=timedelta(seconds=1))


@contextlib.contextmanager
def with_dist(rank: int = 0, world_size: int = 2) -> Iterator[None]:
    """The mock default group for the block, destroyed after it."""
    mock_init_dist(rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def with_fake_comms(func: Optional[Callable] = None, rank: int = 0, world_size: int = 2) -> Any:
    """Run the test method inside `with_dist(rank, world_size)` (bare or with arguments)."""
    if func is None:
        return functools.partial(with_fake_comms, rank=rank, world_size=world_size)

    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        with with_dist(rank, world_size):
            func(self, *args, **kwargs)

    return wrapper
