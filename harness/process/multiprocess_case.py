"""MultiProcessTestCase: every test runs once in each of `world_size` fresh rank processes.

The supervising instance only supervises (harness/launch/ranked_case.py): its launcher
(harness/process/launchers.py) starts the ranks as forks of a forkserver that already has
torch and the test module imported (harness/process/forkserver.py), so a rank starts in
milliseconds instead of seconds; each rank (harness/process/rank.py) re-creates the test
through the class's `_run` (upstream's entry point, which suites may override), and runs its
test method. After the ranks, upstream's return-code API decides (`_check_return_codes`,
`skip_return_code_checks`, `special_return_code_checks`). Nothing a test started outlives it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from harness import settings
from harness.compat import unittest_internals
from harness.launch.context import RankContext
from harness.launch.launcher import Launcher, RankSetup
from harness.launch.ranked_case import SUPERVISOR_RANK, RankedTestCase, assign
from harness.outcome.fold import with_own_problem
from harness.outcome.merge import decide
from harness.outcome.rank_record import RankRecord, raised_in_rank
from harness.outcome.report import FAILED, PASSED, Outcome
from harness.process import forkserver
from harness.process.launchers import FreshProcesses, process_launcher
from harness.process.rank import GRID_SYNC_TIMEOUT_S, destroy_default_group
from harness.requirements.skip_codes import TEST_SKIPS
from harness.requirements.world_size import BaseWorldSize, world_size_of

# unittest hides frames of modules that define this: a verdict's report starts at the ranks.
__unittest = True

MAIN_PROCESS_RANK = SUPERVISOR_RANK
TEST_ERROR_EXIT_CODE = 10  # upstream's exit code of a rank whose test raised


class MultiProcessTestCase(RankedTestCase):
    """Each test method runs in `world_size` fresh processes, one per rank; the parent supervises.

    In the parent `self.rank == MAIN_PROCESS_RANK`; in a rank, `self.rank`, `self.world_size`,
    `self.file_name` (private rendezvous file) and `self.init_method` (`file://` + it) describe
    the run. setUp, tearDown and cleanups run in the parent only, as upstream; a setUp that
    calls `self._spawn_processes()` starts the ranks there (else the test method does).
    Launched by torchrun, nothing is spawned: this process is the rank.
    """

    MAIN_PROCESS_RANK = MAIN_PROCESS_RANK
    TEST_ERROR_EXIT_CODE = TEST_ERROR_EXIT_CODE
    # Upstream's 4; under torchrun, the processes it launched (harness/requirements/world_size.py).
    world_size: int = BaseWorldSize(launched=True)  # type: ignore[assignment]
    grid_sync_timeout: float = GRID_SYNC_TIMEOUT_S  # a rank's wait for the others after a point
    _init_method: Optional[str] = None  # set only by a suite that assigns `init_method`

    def __init__(
        self, method_name: str = "runTest", methodName: str = "runTest"  # noqa: N803 - unittest's
    ) -> None:
        super().__init__(method_name, methodName)
        assign(self, "file_name", None)
        self.processes: List[Any] = []  # per rank while the test runs; its exits once joined
        self.special_return_code_checks: Dict[Any, int] = {}
        self.skip_return_code_checks: List[Any] = []

    def make_launcher(self) -> Launcher:
        return process_launcher(FreshProcesses())

    @property
    def init_method(self) -> str:
        """The ranks' rendezvous URL: the launcher's (torchrun's), else `file://` + file_name."""
        if self._init_method is not None:
            return self._init_method
        context = self.rank_context
        if context is not None and context.init_method:
            return context.init_method
        return f"file://{self.file_name}" if self.file_name else ""

    @init_method.setter
    def init_method(self, value: str) -> None:
        self._init_method = value

    @property
    def destroy_pg_upon_exit(self) -> bool:
        """Whether a rank destroys the default group its test left initialised (upstream: True).

        Subclasses that destroy it themselves may return False, as upstream's FSDPTest does.
        """
        return True

    def setUp(self) -> None:
        super().setUp()
        # Upstream's, reset for each test: suites fill them in their setUp.
        self.special_return_code_checks = {}
        self.skip_return_code_checks = []

    def tearDown(self) -> None:
        super().tearDown()
        self.processes = []  # as upstream: the joined ranks' exits are gone after the test

    def doCleanups(self) -> Any:  # noqa: N802 - unittest's naming
        """After the test's cleanups, a rank destroys the group it left behind.

        As upstream, only when the test did not fail in this rank (a failed rank's peers may
        still be inside a collective with it) and did not end its process with sys.exit(0).
        """
        outcome = super().doCleanups()
        if (
            self.rank_context is not None and self.destroy_pg_upon_exit
            and not self.rank_failed() and not self._exited_early and dist.is_initialized()
        ):
            destroy_default_group()
        return outcome

    def _spawn_processes(self) -> None:
        """Upstream's call in setUp: start the ranks now (they see what setUp set so far)."""
        self.start_ranks()

    def describe_run(self, setup: RankSetup) -> None:
        """The rendezvous file (`init_method` derives from it) and the rank processes."""
        assign(self, "file_name", setup.file_name)
        self.processes = list(setup.processes)

    @classmethod
    def _run(
        cls, rank: int, test_name: str, file_name: str, parent_pipe: Any, **kwargs: Any
    ) -> None:
        """Upstream's entry point of a rank process (suites may override it): build the
        instance, make it the rank, run the test through `run_test`."""
        self = cls(test_name)
        assign(self, "rank", rank)
        assign(self, "file_name", file_name)
        self.run_test(test_name, parent_pipe)

    def run_test(self, test_name: str, parent_pipe: Any) -> None:
        """Upstream's name for running the test in this rank; `parent_pipe` is what the rank
        process handed `_run` (harness/process/rank.py: it attaches the context and runs)."""
        parent_pipe.run(self)

    def attach_rank(self, context: RankContext) -> None:
        """In a rank: its number, and the test's rendezvous (`file_name`, `init_method`)."""
        super().attach_rank(context)
        assign(self, "file_name", context.file_name or None)

    # --- in the parent, once the ranks are joined: upstream's return-code API ---------------
    def _judge_ranks(self) -> None:
        self.processes = [RankExit.of(record) for record in self.rank_records]
        elapsed = max((r.duration for r in self.rank_records), default=0.0)
        self._check_return_codes(self._original_test_method(), elapsed)

    def _original_test_method(self) -> Any:
        """The bound test method before the harness routed it (upstream's `fn`, which suites
        list in `skip_return_code_checks` as `self.test_x.__wrapped__`)."""
        routed = getattr(self, unittest_internals.method_name(self))
        return getattr(routed, "__wrapped__", routed)

    def _check_return_codes(self, fn: Any, elapsed_time: float) -> None:
        """The verdict from every rank's record (suites may override it, as upstream's).

        A test in `skip_return_code_checks` accepts any exit code; one in
        `special_return_code_checks` expects that code (rank 0 must end with it, as upstream
        checks; another rank may too). Exceptions, skips and timeouts decide as always.
        """
        accept_any = _listed(fn, self.skip_return_code_checks)
        expected = _lookup(fn, self.special_return_code_checks)

        def exit_accepted(rank: int, exitcode: int) -> bool:
            return accept_any or (expected is not None and exitcode == expected)

        report = decide(self.rank_records, self.ranks_timed_out_after, exit_accepted, self.id())
        if expected is not None and report.own.status == PASSED and self.processes:
            first = self.processes[0]
            if first.exitcode != expected:
                message = (
                    f"Expected exit code {expected} but got {first.exitcode} for pid: {first.pid}"
                )
                report = with_own_problem(
                    report, Outcome(FAILED, message, message, "AssertionError")
                )
        self.report_outcome(report)


@dataclass(frozen=True)
class RankExit:
    """How a rank process ended, as upstream's `self.processes[i]` shows it once joined.

    `exitcode` is upstream's: the code the test gave sys.exit, TEST_ERROR_EXIT_CODE when it
    raised, the generic skip code when it skipped, else the process's own (negative: the
    signal).
    """

    rank: int
    pid: Optional[int]
    exitcode: Optional[int]

    @classmethod
    def of(cls, record: RankRecord) -> RankExit:
        code = record.exitcode
        if record.test_exit_code() is not None:
            code = record.test_exit_code()
        elif any(raised_in_rank(e) for e in record.events):
            code = TEST_ERROR_EXIT_CODE
        elif any(e.kind == "skip" for e in record.events):
            code = TEST_SKIPS["generic"].exit_code
        return cls(record.rank, record.pid, code)

    @property
    def name(self) -> str:
        return f"process {self.rank}"


def _listed(fn: Any, listed: Any) -> bool:
    try:
        return fn in listed
    except TypeError:
        return False


def _lookup(fn: Any, table: Any) -> Optional[int]:
    try:
        return table.get(fn)
    except (AttributeError, TypeError):
        return None


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
        self._spawn_processes()  # as upstream's: the rest of a subclass's setUp is the parent's

    def rank_tear_down(self) -> None:
        if dist.is_initialized():
            destroy_default_group()
        super().rank_tear_down()

    def backend(self, device: str) -> str:
        """The collective backend for a device string: nccl, hccl, xccl, else gloo."""
        return settings.backend_for(device)

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
        if backend in settings.ACCELERATOR_BACKENDS:
            rank_device = settings.rank_device(self.rank)
            if rank_device.index is None:
                raise RuntimeError(
                    f"create_pg({device!r}): the {backend} backend needs an accelerator and "
                    "none was found"
                )
            torch.accelerator.set_device_index(rank_device.index)
            torch.set_default_device(rank_device)
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


# `python -m unittest`: its forkserver, too, starts as a fork of the runner where it can.
forkserver.start_as_fork_under_unittest_main()
