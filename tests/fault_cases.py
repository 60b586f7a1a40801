"""Multi-process test cases that pass, fail, crash, hang or skip on purpose.

tests/test_multiprocess.py runs them one by one and checks the outcome and message the
harness reports; tests/test_shared_ranks.py runs the `Shared*` classes (the same cases in
the shared-process mode, each followed in its class by `test_2_after`, which must pass).
The module name does not match `test*.py`, so neither unittest discovery nor pytest
collects these cases as tests of their own. Ranks that need to tell the checking test
something (their pid, a temp path) write it under HARNESS_FAULT_DIR.
"""

from __future__ import annotations

import ctypes
import os
import signal
import stat
import sys
import tempfile
import time
import unittest

import torch
import torch.distributed as dist

from harness import settings
from harness.kit.fsdp import FSDPTest
from harness.process.continuous import MultiProcContinuousTest
from harness.process.multiprocess_case import MultiProcessTestCase
from harness.requirements.decorators import TEST_SKIPS, skip_if_lt_x_gpu

FAULT_DIR_ENV = "HARNESS_FAULT_DIR"


def note(name: str, text: str) -> None:
    """Leave `text` for the checking test in HARNESS_FAULT_DIR/name."""
    with open(os.path.join(os.environ[FAULT_DIR_ENV], name), "w") as f:
        f.write(text)


def hang_forever() -> None:
    time.sleep(3600)


def sleep_a_long_time() -> None:
    time.sleep(600)


class _TwoRanks(MultiProcessTestCase):
    timeout = 60.0  # a broken harness fails these cases in a minute, not the default 300 s

    @property
    def world_size(self) -> int:
        return 2

    def init_gloo(self) -> None:
        dist.init_process_group(
            "gloo", init_method=self.init_method, rank=self.rank, world_size=self.world_size
        )


class Passing(_TwoRanks):
    def test_all_reduce(self) -> None:
        self.init_gloo()
        value = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(value)
        self.assertEqual(value, torch.tensor([3.0]))
        dist.destroy_process_group()

    def test_rank_environment(self) -> None:
        self.assertEqual(os.environ["GLOO_SOCKET_IFNAME"], "lo")
        self.assertEqual(torch.get_num_threads(), settings.intra_op_threads(self.world_size))
        self.assertEqual(stat.S_IMODE(os.stat(self.file_name).st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(os.stat(os.path.dirname(self.file_name)).st_mode), 0o700)
        self.assertEqual(self.init_method, f"file://{self.file_name}")
        note(f"tempdir.{self.rank}", tempfile.mkdtemp())

    def test_prints(self) -> None:
        print(f"hello from rank {self.rank}")


class OwnRun(_TwoRanks):
    """A suite's `_run` in the shape written before upstream added `fake_pg` (apex's)."""

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe):
        note(f"own_run.{rank}", test_name)
        super()._run(rank, test_name, file_name, pipe)

    def test_all_reduce(self) -> None:
        Passing.test_all_reduce(self)


class Failing(_TwoRanks):
    def test_raise_on_rank_1(self) -> None:
        if self.rank == 1:
            raise ValueError("boom from rank 1")

    def test_raise_on_all_ranks(self) -> None:
        raise ValueError(f"boom from rank {self.rank}")

    def test_exit_code(self) -> None:
        if self.rank == 1:
            os._exit(3)

    def test_sigsegv_on_rank_1(self) -> None:
        if self.rank == 1:
            ctypes.string_at(0)  # reads address 0: a real segmentation fault

    def test_sigkill_on_rank_1(self) -> None:
        if self.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)

    def test_fail_fast(self) -> None:
        if self.rank == 0:
            raise ValueError("rank 0 gives up early")
        sleep_a_long_time()

    def test_output(self) -> None:
        print(f"stdout line of rank {self.rank}")
        os.write(2, f"fd 2 line of rank {self.rank}\n".encode())
        if self.rank == 1:
            raise RuntimeError("rank 1 fails after printing")

    @unittest.expectedFailure
    def test_expected_failure(self) -> None:
        if self.rank == 1:
            raise ValueError("known bug on rank 1")


class Hanging(_TwoRanks):
    timeout = 3.0

    def test_hang(self) -> None:
        hang_forever()


class Skipping(_TwoRanks):
    def test_skip_on_rank_1(self) -> None:
        if self.rank == 1:
            raise unittest.SkipTest("rank 1 cannot run this")

    def test_skip_on_all_ranks(self) -> None:
        self.skipTest("no rank can run this")

    def test_skip_by_sys_exit(self) -> None:
        if self.rank == 1:
            sys.exit(TEST_SKIPS["multi-gpu-2"].exit_code)

    def test_skip_by_exit_code(self) -> None:
        if self.rank == 0:
            os._exit(TEST_SKIPS["small_worldsize"].exit_code)

    @skip_if_lt_x_gpu(64)
    def test_needs_many_gpus(self) -> None:
        note("started", "a rank started although the test is skipped")


class Grid(_TwoRanks):
    grid_sync_timeout = 2.0

    def test_grid(self) -> None:
        self.run_subtests({"x": [0, 1, 2, 3]}, self._point)

    def _point(self, x: int) -> None:
        note(f"point{x}.{self.rank}", "ran")
        if x == 1 and self.rank == 1:
            raise AssertionError("point 1 fails on rank 1")
        if x == 2:
            raise AssertionError(f"point 2 fails on rank {self.rank}")

    def test_grid_out_of_step(self) -> None:
        self.init_gloo()
        self.run_subtests({"x": [0, 1, 2]}, self._collective_point)

    def _collective_point(self, x: int) -> None:
        if x == 1 and self.rank == 0:
            raise AssertionError("rank 0 fails point 1 before its collective")
        dist.all_reduce(torch.ones(1))


class Orphans(_TwoRanks):
    def test_sleep_forever(self) -> None:
        note(f"dir.{self.rank}", os.path.dirname(self.file_name))
        note(f"pid.{self.rank}", f"{os.getpid()} {os.getppid()}")
        hang_forever()


class BadWorldSize(MultiProcessTestCase):
    @property
    def world_size(self) -> int:
        return 0

    def test_nothing(self) -> None:
        note("started", "a rank started with world size 0")


class InProcess(MultiProcessTestCase):
    """Used under a torchrun-like environment: the body runs in the calling process."""

    pids: list = []

    def test_records_pid(self) -> None:
        InProcess.pids.append((os.getpid(), self.rank, self.world_size, self.init_method))


class _Shared(MultiProcContinuousTest):
    """Two shared ranks; `test_2_after` runs after the class's case and must pass."""

    world_size = 2
    timeout = 60.0
    grid_sync_timeout = 2.0

    def test_2_after(self) -> None:
        note(f"after.{self.rank}", str(os.getpid()))
        value = torch.ones(1)
        dist.all_reduce(value, group=self.pg)
        self.assertEqual(value.item(), 2.0)


def _shared_all_reduce(self: MultiProcContinuousTest) -> None:
    note(f"case.{self.rank}", str(os.getpid()))
    value = torch.tensor([float(self.rank + 1)])
    dist.all_reduce(value, group=self.pg)
    self.assertEqual(value, torch.tensor([3.0]))


def _leave_a_collective_unmatched(self: MultiProcContinuousTest) -> None:
    note(f"case.{self.rank}", str(os.getpid()))
    if self.rank == 0:  # rank 1 never joins: the group is out of step afterwards
        dist.all_reduce(torch.ones(1), group=self.pg, async_op=True)


def _destroy_the_group(self: MultiProcContinuousTest) -> None:
    note(f"case.{self.rank}", str(os.getpid()))
    dist.destroy_process_group()


# Each shared case: its class name and the body of its `test_1_case`.
SHARED_CASES = {
    "SharedPass": _shared_all_reduce,
    "SharedRaiseOnRank1": Failing.test_raise_on_rank_1,
    "SharedRaiseOnAll": Failing.test_raise_on_all_ranks,
    "SharedExitCode": Failing.test_exit_code,
    "SharedSigsegvOnRank1": Failing.test_sigsegv_on_rank_1,
    "SharedFailFast": Failing.test_fail_fast,
    "SharedOutput": Failing.test_output,
    "SharedSkipOnRank1": Skipping.test_skip_on_rank_1,
    "SharedSkipOnAll": Skipping.test_skip_on_all_ranks,
    "SharedSkipBySysExit": Skipping.test_skip_by_sys_exit,
    "SharedSkipByExitCode": Skipping.test_skip_by_exit_code,
    "SharedGrid": Grid.test_grid,
    "SharedBrokenGroup": _leave_a_collective_unmatched,
    "SharedDestroyedGroup": _destroy_the_group,
}
for _name, _body in SHARED_CASES.items():
    globals()[_name] = type(
        _name, (_Shared,), {"__module__": __name__, "test_1_case": _body, "_point": Grid._point}
    )


class SharedHang(_Shared):
    timeout = 8.0  # long enough for test_2_after to start new ranks on a loaded machine

    def test_1_case(self) -> None:
        hang_forever()


class SharedParentSetUpFails(_Shared):
    """The parent's setUp fails after the test was sent to the ranks."""

    def setUp(self) -> None:
        super().setUp()
        self.start_ranks()  # sends the test, as upstream's setUp does
        if self._testMethodName == "test_1_case":
            raise RuntimeError("the parent's setUp fails after sending the test")

    def test_1_case(self) -> None:
        note(f"case.{self.rank}", str(os.getpid()))
        dist.all_reduce(torch.ones(1), group=self.pg)


class FakeGroup(FSDPTest):
    """Upstream's `fake_pg = True`: every rank's default group is on the fake backend."""

    fake_pg = True

    @property
    def world_size(self) -> int:
        return 2

    def test_backend(self) -> None:
        assert dist.get_backend() == "fake", dist.get_backend()
        dist.all_reduce(torch.ones(1))  # communicates nothing, returns at once
