"""FSDP test bases: a default process group per test, on the rank's own device.

`FSDPTest` gives each rank process what FSDP tests expect before the body runs: the
default group initialised through the test's private rendezvous file with the backend
for this machine (nccl on GPUs, gloo on CPU), the rank's device selected, and a barrier
so no rank starts early; after the body, a barrier (unless this rank failed) and the
group's destruction.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist

from harness import devices
from harness.multiprocess import MAIN_PROCESS_RANK, MultiProcessTestCase
from harness.multithread import MultiThreadedTestCase
from harness.thread_world import RankReleased


class _RankDevice:
    """`device`, `device_type` and `process_group` of a rank, as overridable properties."""

    rank: int

    @property
    def device_type(self) -> str:
        return devices.device_type()

    @property
    def device(self) -> torch.device:
        """This rank's device: its own GPU, or the CPU."""
        return devices.rank_device(max(self.rank, 0))

    @property
    def process_group(self) -> Any:
        """The default process group of this rank."""
        return dist.group.WORLD


class FSDPTest(_RankDevice, MultiProcessTestCase):
    """MultiProcessTestCase whose ranks run each test inside an initialised default group.

    `device`, `device_type` and `process_group` are properties, so suites may override them
    (upstream suites do, e.g. `process_group` returning the default group).
    """

    def setUp(self) -> None:
        super().setUp()
        if self.rank == MAIN_PROCESS_RANK:
            return
        device = self.device
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend=devices.backend_for(self.device_type),
            init_method=self.init_method,
            rank=self.rank,
            world_size=self.world_size,
        )
        dist.barrier()

    def tearDown(self) -> None:
        if self.rank != MAIN_PROCESS_RANK and dist.is_initialized():
            if not self._rank_failed():  # a failed rank's peers may be stuck elsewhere
                dist.barrier()
            dist.destroy_process_group()
        super().tearDown()


class FSDPTestMultiThread(_RankDevice, MultiThreadedTestCase):
    """FSDPTest for thread ranks (harness/multithread.py): same device, group and barriers.

    Each rank thread's default group (backend `threaded`) is initialised before setUp, the
    rank's device is selected and a barrier keeps the ranks together; after the case, a
    barrier (skipped when this rank failed) and the group's destruction. `device`,
    `device_type` and `process_group` are properties, as in FSDPTest.
    """

    def _init_rank_thread(self) -> None:
        super()._init_rank_thread()
        device = self.device
        if device.type == "cuda":
            torch.cuda.set_device(device)  # per thread, like the rank's process would
        dist.barrier()

    def _finish_rank_thread(self, passed: bool) -> None:
        if passed and dist.is_initialized():
            with contextlib.suppress(RankReleased):  # a peer failed: its failure is the report
                dist.barrier()
        super()._finish_rank_thread(passed)
