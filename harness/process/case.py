"""MultiProcessTestCase: every test runs once in each of `world_size` fresh rank processes.

The supervising instance only supervises (harness/launch/case.py): its launcher
(harness/process/launchers.py) starts the ranks as forks of a forkserver that already has
torch and the test module imported (harness/process/forkserver.py), so a rank starts in
milliseconds instead of seconds; each rank (harness/process/rank.py) re-creates the test,
which `attach_rank` makes that rank, and runs it. Nothing a test started outlives it.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from harness import devices
from harness.launch.case import SUPERVISOR_RANK, RankedTestCase
from harness.launch.context import RankContext
from harness.launch.launcher import Launcher
from harness.process.launchers import FreshProcesses, process_launcher
from harness.world_size import BaseWorldSize, world_size_of

MAIN_PROCESS_RANK = SUPERVISOR_RANK


class MultiProcessTestCase(RankedTestCase):
    """Each test method runs in `world_size` fresh processes, one per rank; the parent supervises.

    In the parent `self.rank == MAIN_PROCESS_RANK`; in a rank, `self.rank`, `self.world_size`,
    `self.file_name` (private rendezvous file) and `self.init_method` (`file://` + it) describe
    the run. Launched by torchrun, nothing is spawned: this process is the rank.
    """

    MAIN_PROCESS_RANK = MAIN_PROCESS_RANK
    # Upstream's 4; under torchrun, the processes it launched (harness/world_size.py).
    world_size: int = BaseWorldSize(launched=True)  # type: ignore[assignment]
    grid_sync_timeout: float = 30.0  # seconds a rank waits for the others after a grid point

    def __init__(
        self, method_name: str = "runTest", methodName: str = "runTest"  # noqa: N803 - unittest's
    ) -> None:
        super().__init__(method_name, methodName)
        self.file_name: Optional[str] = None
        self.init_method = ""
        self.processes: List[Any] = []  # multiprocessing.Process per rank while the test runs

    def make_launcher(self) -> Launcher:
        return process_launcher(FreshProcesses())

    @property
    def destroy_pg_upon_exit(self) -> bool:
        """Whether a rank destroys the default group its test left initialised (upstream: True).

        Subclasses that destroy it themselves may return False, as upstream's FSDPTest does.
        """
        return True

    def doCleanups(self) -> Any:  # noqa: N802 - unittest's naming
        """After tearDown and the test's cleanups, a rank destroys the group it left behind.

        As upstream, only when the test did not fail in this rank: a failed rank's peers may
        still be inside a collective with it.
        """
        outcome = super().doCleanups()
        if (
            self.rank_context is not None and self.destroy_pg_upon_exit
            and not self._rank_failed() and dist.is_initialized()
        ):
            dist.destroy_process_group()
        return outcome

    def _spawn_processes(self) -> None:
        """Upstream's name for starting the ranks (setUp already does; then a no-op)."""
        self._start_ranks()

    def attach_rank(self, context: RankContext) -> None:
        """In a rank: its number, and the test's rendezvous (`file_name`, `init_method`)."""
        super().attach_rank(context)
        self.file_name = context.file_name or None
        self.init_method = context.init_method


class DistributedTestBase(MultiProcessTestCase):
    """Upstream's base for device-generic multi-rank tests: a test makes its own group.

    A test (typically instantiated per device type, so it receives `device`) calls
    `self.create_pg(device)`; the backend follows the device (`backend(device)`), and the
    group is destroyed after the test. The world size is exported as WORLD_SIZE, as
    upstream does, for tests and decorators that read it from the environment.
    """

    def setUp(self) -> None:
        previous = os.environ.get("WORLD_SIZE")
        os.environ["WORLD_SIZE"] = str(world_size_of(self))
        self.addCleanup(_restore_env, "WORLD_SIZE", previous)
        super().setUp()

    def tearDown(self) -> None:
        if self.rank != MAIN_PROCESS_RANK and dist.is_initialized():
            dist.destroy_process_group()
        super().tearDown()

    def backend(self, device: str) -> str:
        """The collective backend for a device string: nccl, hccl, xccl, else gloo."""
        return devices.backend_for(device)

    def create_pg(self, device: str, world_size: Optional[int] = None) -> dist.ProcessGroup:
        """Initialise the default group for `device` through this test's rendezvous; return it.

        With an accelerator backend the rank's accelerator becomes the current and default
        device, as upstream.
        """
        backend = self.backend(device)
        dist.init_process_group(
            backend=backend,
            init_method=self.init_method,
            world_size=self.world_size if world_size is None else world_size,
            rank=self.rank,
        )
        if backend in ("nccl", "xccl"):
            accelerator = torch.accelerator.current_accelerator()
            if accelerator is None:
                raise RuntimeError(
                    f"create_pg({device!r}): the {backend} backend needs an accelerator and "
                    "none was found"
                )
            torch.accelerator.set_device_index(self.rank)
            torch.set_default_device(torch.device(accelerator.type, self.rank))
        return dist.group.WORLD

    def rank_to_device(self, device: str) -> Dict[int, List[int]]:
        """Each rank's device indices (upstream's DDP `device_ids` map): rank mod device count."""
        count = torch.get_device_module(device).device_count()
        return {rank: [rank % count] for rank in range(self.world_size)}


def _restore_env(name: str, value: Optional[str]) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
