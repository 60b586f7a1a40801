"""MultiProcessTestCase: every test runs once in each of `world_size` fresh rank processes.

The parent only supervises: `setUp` starts the ranks (forks of a forkserver that already
has torch and the test module imported, harness/process/forkserver.py, so a rank starts in
milliseconds instead of seconds); in the parent the test method is replaced by a wrapper
that waits for the ranks' reports (harness/process/supervisor.py, with each rank run by
harness/process/rank.py) and turns them into one unittest outcome
(harness/launch/verdict.py), replaying each grid point as a subtest. Nothing a test
started outlives it.
"""

from __future__ import annotations

import os
import unittest
from datetime import timedelta
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from harness import devices
from harness.launch.report import RankRecord
from harness.launch.verdict import apply_verdict, decide
from harness.process import forkserver
from harness.process.rank import RankSpec
from harness.process.supervisor import RankGroup
from harness.skips import check_case_requirements
from harness.testcase import TestCase, route_test_method

# unittest hides frames of modules that define this, as it does for its own: a multi-rank
# failure then shows the rank's traceback, not the supervisor's.
__unittest = True

MAIN_PROCESS_RANK = -1


class MultiProcessTestCase(TestCase):
    """Each test method runs in `world_size` fresh processes, one per rank; the parent supervises.

    In the parent `self.rank == MAIN_PROCESS_RANK`; in a rank, `self.rank`, `self.world_size`,
    `self.file_name` (private rendezvous file) and `self.init_method` (`file://` + it) describe
    the run. Launched by torchrun, nothing is spawned: this process is the rank.
    """

    MAIN_PROCESS_RANK = MAIN_PROCESS_RANK
    timeout: float = devices.DefaultTimeout()  # type: ignore[assignment]  # seconds; classes may set
    grid_sync_timeout: float = 30.0  # seconds a rank waits for the others after a grid point

    def __init__(
        self, method_name: str = "runTest", methodName: str = "runTest"  # noqa: N803 - unittest's
    ) -> None:
        # Both spellings, as upstream: unittest's `methodName` wins when given.
        super().__init__(methodName if methodName != "runTest" else method_name)
        self.rank = MAIN_PROCESS_RANK
        self.file_name: Optional[str] = None
        self.init_method = ""
        self.processes: List[Any] = []  # multiprocessing.Process per rank while the test runs
        self.rank_records: List[RankRecord] = []  # after the test: each rank's pid, exit code, ...
        self._ranks: Optional[RankGroup] = None
        self._rank_result: Any = None  # in a rank: the ForwardingResult it runs with
        self._grid_store: Any = None
        self._grid_index = 0
        self._torchrun = devices.torchrun_env()
        if self._torchrun is not None:
            # Launched by torchrun, this process is the rank; harness/process/torchrun.py keeps
            # ranks in step and gathers results, and its init_method (unlike env://) lets every test
            # create and destroy its own group on the launcher's store.
            from harness.process import torchrun

            self.rank = self._torchrun[0]
            self.init_method = torchrun.init_method()
        route_test_method(self, lambda: self.rank == MAIN_PROCESS_RANK, self._join_processes)

    @property
    def world_size(self) -> int:
        launched = self._torchrun
        return launched[1] if launched is not None else devices.default_world_size()

    @property
    def destroy_pg_upon_exit(self) -> bool:
        """Whether a rank destroys the default group its test left initialised (upstream: True).

        Subclasses that destroy it themselves may return False, as upstream's FSDPTest does.
        """
        return True

    @property
    def is_master(self) -> bool:
        """Whether this is rank 0 (False in the supervising parent)."""
        return self.rank == 0

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def doCleanups(self) -> Any:  # noqa: N802 - unittest's naming
        """After tearDown and the test's cleanups, a rank destroys the group it left behind.

        As upstream, only when the test did not fail in this rank: a failed rank's peers may
        still be inside a collective with it.
        """
        outcome = super().doCleanups()
        if (
            self.rank != MAIN_PROCESS_RANK and self.destroy_pg_upon_exit
            and not self._rank_failed() and dist.is_initialized()
        ):
            dist.destroy_process_group()
        return outcome

    def _spawn_processes(self) -> None:
        """Start the ranks (parent only; a no-op in a rank and when already started)."""
        if self._torchrun is not None:
            self._check_torchrun_world_size()
            return
        if self.rank != MAIN_PROCESS_RANK or self._ranks is not None:
            return
        group = RankGroup(self._world_size_to_start())
        self._ranks = group
        self.file_name = group.file_name
        self.init_method = f"file://{group.file_name}"
        self.addCleanup(self._close_ranks)  # also when a subclass's setUp fails after this
        try:
            group.start(forkserver.context(type(self).__module__), self._rank_spec)
        except BaseException:
            self._close_ranks()
            raise
        self.processes = group.processes

    def _world_size_to_start(self) -> int:
        """The checks made in the parent before any rank starts; the number of ranks to start.

        Unmet requirements and a world size of 0 skip; a bad world size or timeout, or a class
        ranks cannot import, is a one-line config error.
        """
        check_case_requirements(self)
        world_size, _ = devices.checked_rank_settings(self)
        if "<locals>" in type(self).__qualname__:
            raise devices.HarnessConfigError(
                f"{type(self).__qualname__} is defined inside a function: ranks re-create the "
                "test by importing its class, so define it at module level"
            )
        return world_size

    def _close_ranks(self) -> None:
        if self._ranks is not None:
            self._ranks.close()
        self.processes = []

    def _rank_spec(self, rank: int) -> RankSpec:
        group = self._ranks
        assert group is not None
        return RankSpec(
            module=type(self).__module__,
            qualname=type(self).__qualname__,
            method=self._testMethodName,
            rank=rank,
            world_size=len(group.records),
            file_name=group.file_name,
            work_dir=group.work_dir,
            output_path=group.output_path(rank),
            temp_dir=group.temp_dir,
            threads=devices.intra_op_threads(len(group.records)),
            env=dict(os.environ),
        )

    def _attach_rank(self, rank: int, world_size: int, file_name: str) -> None:
        """Called in a rank process (harness/process/rank.py) on the freshly built case."""
        if self.world_size != world_size:
            raise RuntimeError(
                f"{type(self).__name__}.world_size is {self.world_size} in rank {rank} but "
                f"{world_size} in the parent: it must not depend on the process"
            )
        self.rank = rank
        self.file_name = file_name
        self.init_method = f"file://{file_name}"

    def _rank_failed(self) -> bool:
        """In a rank: whether this test already failed here, so peers may be out of step."""
        return bool(self._rank_result is not None and self._rank_result.failed)

    def _check_torchrun_world_size(self) -> None:
        assert self._torchrun is not None
        check_case_requirements(self)
        launched = self._torchrun[1]
        if self.world_size != launched:
            raise unittest.SkipTest(
                f"needs world size {self.world_size}, torchrun launched {launched} processes"
            )

    def _join_processes(self) -> None:
        """Wait for the ranks and turn their reports into this test's outcome."""
        group = self._ranks
        if group is None:
            raise RuntimeError(
                f"{type(self).__name__}.setUp did not start the ranks: call super().setUp()"
            )
        timeout = self.timeout
        try:
            timed_out = group.supervise(timeout)
        finally:  # on KeyboardInterrupt too: no rank outlives the test
            self._close_ranks()
        self.rank_records = group.records
        apply_verdict(self, decide(group.records, timeout if timed_out else None))

    def _grid_point_done(self, params: Dict[str, Any], passed: bool) -> bool:
        """Ranks meet after each grid point through a store beside the rendezvous file.

        A store, not a collective, so ranks still meet when a failed point left the process
        group unusable. The last rank to arrive writes the verdict "go"; a rank that waited
        `grid_sync_timeout` in vain (a peer is stuck, say in a collective with a rank that
        failed) writes "abandoned" instead. The first verdict written wins, so every rank
        takes the same decision: go on with the grid, or end it (return False).
        """
        if self.rank == MAIN_PROCESS_RANK or self._torchrun is not None or not self.file_name:
            return True
        if self._grid_store is None:
            self._grid_store = dist.FileStore(f"{self.file_name}.grid", self.world_size)
        store, point = self._grid_store, f"point{self._grid_index}"
        self._grid_index += 1
        if store.add(f"{point}/arrived", 1) == self.world_size:
            store.compare_set(f"{point}/verdict", "", "go")
        try:
            store.wait([f"{point}/verdict"], timedelta(seconds=self.grid_sync_timeout))
        except RuntimeError:
            pass
        return store.compare_set(f"{point}/verdict", "", "abandoned") == b"go"


class DistributedTestBase(MultiProcessTestCase):
    """Upstream's base for device-generic multi-rank tests: a test makes its own group.

    A test (typically instantiated per device type, so it receives `device`) calls
    `self.create_pg(device)`; the backend follows the device (`backend(device)`), and the
    group is destroyed after the test. The world size is exported as WORLD_SIZE, as
    upstream does, for tests and decorators that read it from the environment.
    """

    def setUp(self) -> None:
        previous = os.environ.get("WORLD_SIZE")
        os.environ["WORLD_SIZE"] = str(self.world_size)
        self.addCleanup(_restore_env, "WORLD_SIZE", previous)
        super().setUp()

    def tearDown(self) -> None:
        if self.rank != MAIN_PROCESS_RANK and dist.is_initialized():
            dist.destroy_process_group()
        super().tearDown()

    def backend(self, device: str) -> str:
        """The collective backend for a device string: nccl, hccl, xccl, else gloo."""
        for kind, backend in (("cuda", "nccl"), ("hpu", "hccl"), ("xpu", "xccl")):
            if kind in device:
                return backend
        return "gloo"

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
