"""DTensor test bases: `DTensorTestBase`, and the `with_comms` / `with_temp_dir` decorators.

Unlike FSDPTest, a DTensor test opts into its process group per test with `@with_comms`,
and tests that save checkpoints ask for a directory all ranks share with
`@with_temp_dir` (below `@with_comms`, which it needs to agree on the path).
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from harness import devices
from harness.multiprocess import MultiProcessTestCase

DEFAULT_WORLD_SIZE = 4


class DTensorTestBase(MultiProcessTestCase):
    """MultiProcessTestCase with 4 ranks by default and helpers to build a process group."""

    @property
    def world_size(self) -> int:
        return DEFAULT_WORLD_SIZE

    @property
    def device_type(self) -> str:
        return devices.device_type()

    @property
    def backend(self) -> str:
        """`init_process_group` backend: gloo for CPU tensors, plus nccl for CUDA ones."""
        if self.device_type == "cuda":
            return "cpu:gloo,cuda:nccl"
        return "cpu:gloo"

    def init_pg(self) -> None:
        """Initialise the default group through this test's rendezvous file."""
        if self.device_type == "cuda":
            torch.cuda.set_device(devices.rank_device(self.rank))
        dist.init_process_group(
            backend=self.backend,
            init_method=self.init_method,
            rank=self.rank,
            world_size=self.world_size,
        )

    def destroy_pg(self) -> None:
        """Wait for every rank, then destroy the default group."""
        dist.barrier()
        dist.destroy_process_group()

    def build_device_mesh(self) -> DeviceMesh:
        """A 1-D mesh over all ranks on this machine's device type."""
        return init_device_mesh(self.device_type, (self.world_size,))


def with_comms(func: Callable) -> Callable:
    """Run the test inside a default process group created for it and destroyed after it."""

    @functools.wraps(func)
    def wrapper(self: DTensorTestBase, *args: Any, **kwargs: Any) -> Any:
        self.init_pg()
        try:
            result = func(self, *args, **kwargs)
        except BaseException:
            dist.destroy_process_group()  # no barrier: the other ranks may never reach it
            raise
        self.destroy_pg()
        return result

    return wrapper


def with_temp_dir(func: Callable) -> Callable:
    """Give every rank the same fresh `self.temp_dir`: rank 0 creates it, all ranks learn it.

    Needs the default group (put `@with_comms` above it). The directory is removed once
    every rank is done with it.
    """

    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not dist.is_initialized():
            raise RuntimeError(
                f"with_temp_dir on {func.__name__} needs a process group: put @with_comms above it"
            )
        is_first = dist.get_rank() == 0
        shared = [tempfile.mkdtemp(prefix="harness-temp-dir-") if is_first else None]
        dist.broadcast_object_list(shared, src=0)
        self.temp_dir = shared[0]
        try:
            result = func(self, *args, **kwargs)
            dist.barrier()  # nobody still reads the directory when rank 0 removes it
        finally:
            if is_first:
                shutil.rmtree(self.temp_dir, ignore_errors=True)
        return result

    return wrapper
