"""MultiThreadedTestCase: outcomes of thread ranks, and FSDP training on them.

The fault-injection cases are built inside factory functions so that test loaders do
not collect them; each is run here with `case.run(result)` and its result inspected.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import unittest
from typing import Any, Callable, Dict, Iterator, List, Tuple
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from harness import settings
from harness.kit.fsdp import FSDPTestMultiThread
from harness.requirements.decorators import skip_if_lt_x_gpu, skip_if_no_gpu
from harness.requirements.platform import requires_nccl
from harness.single_process.testcase import TestCase
from harness.threads.launcher import ThreadRanks
from harness.threads.multithreaded_case import MultiThreadedTestCase


def run_case(cls: type, method: str) -> Tuple[unittest.TestResult, MultiThreadedTestCase]:
    result = unittest.TestResult()
    case = cls(method)
    case.run(result)
    return result, case


def thread_case(world_size: int, timeout: float = 60.0, **methods: Callable) -> type:
    """A MultiThreadedTestCase class with the given test methods (not collected by loaders)."""
    attrs: Dict[str, Any] = dict(methods)
    attrs["world_size"] = property(lambda self: world_size)
    attrs["timeout"] = timeout
    return type("ThreadCase", (MultiThreadedTestCase,), attrs)


@contextlib.contextmanager
def no_rank_started() -> Iterator[None]:
    """Fails the test if the code inside starts rank threads."""
    with mock.patch.object(ThreadRanks, "start") as start:
        yield
    start.assert_not_called()


def messages(result: unittest.TestResult) -> List[str]:
    return [text for _, text in result.failures + result.errors]


class TestOutcomes(TestCase):
    def test_pass_runs_body_once_per_rank_thread(self) -> None:
        seen: List[Tuple[int, int, str, bool, float]] = []
        lock = threading.Lock()

        def test_body(self: MultiThreadedTestCase) -> None:
            t = torch.tensor([self.rank + 1.0])
            dist.all_reduce(t)
            with lock:
                seen.append((self.rank, dist.get_rank(), threading.current_thread().name,
                             dist.get_world_size() == self.world_size, t.item()))

        result, _ = run_case(thread_case(3, test_body=test_body), "test_body")
        self.assertEqual(messages(result), [])
        self.assertEqual(result.testsRun, 1)
        self.assertEqual(sorted(seen), [
            (0, 0, "harness-rank-0", True, 6.0),
            (1, 1, "harness-rank-1", True, 6.0),
            (2, 2, "harness-rank-2", True, 6.0),
        ])

    def test_failure_names_the_rank_and_releases_the_others(self) -> None:
        def test_body(self: MultiThreadedTestCase) -> None:
            if self.rank == 1:
                raise ValueError("boom-42")
            dist.all_reduce(torch.ones(2))  # would wait for rank 1 forever

        result, _ = run_case(thread_case(3, test_body=test_body), "test_body")
        self.assertEqual(len(result.errors), 1)  # a ValueError: an error, as unittest's
        text = messages(result)[0]
        self.assertIn("rank 1 raised", text)
        self.assertIn("ValueError: boom-42", text)
        self.assertIn('in test_body\n    raise ValueError("boom-42")', text)
        self.assertLess(text.index("rank 1 raised"), text.index("rank 0 raised"))
        self.assertIn("rank 1 failed its test", text)  # why ranks 0 and 2 were released
        self.assertNotIn("timed out", text)

    def test_requirement_skip_starts_no_thread(self) -> None:
        @skip_if_lt_x_gpu(64)
        def test_body(self: MultiThreadedTestCase) -> None:
            raise AssertionError("must not run")

        with no_rank_started():
            result, _ = run_case(thread_case(2, test_body=test_body), "test_body")
        self.assertEqual(messages(result), [])
        self.assertEqual(len(result.skipped), 1)
        self.assertIn("Need at least 64 CUDA devices", result.skipped[0][1])

    def test_class_level_and_per_rank_requirements_start_no_thread(self) -> None:
        def test_body(self: MultiThreadedTestCase) -> None:
            raise AssertionError("must not run")

        cls = requires_nccl()(thread_case(2, test_body=test_body))
        with mock.patch.object(dist, "is_nccl_available", return_value=False), no_rank_started():
            result, _ = run_case(cls, "test_body")
        self.assertEqual(messages(result), [])
        self.assertEqual(result.skipped[0][1], "c10d was not compiled with the NCCL backend")

        per_rank = thread_case(2, test_body=skip_if_no_gpu(test_body))
        with mock.patch.object(settings, "accelerator_count", return_value=1), no_rank_started():
            result, _ = run_case(per_rank, "test_body")
        self.assertEqual(result.skipped[0][1], "Need at least 2 CUDA devices, found 1")

    def test_world_size_zero_is_a_skip_not_a_pass(self) -> None:
        def test_body(self: MultiThreadedTestCase) -> None:
            raise AssertionError("must not run")

        with no_rank_started():
            result, _ = run_case(thread_case(0, test_body=test_body), "test_body")
        self.assertEqual(messages(result), [])
        self.assertEqual(result.testsRun, 1)
        self.assertEqual(len(result.skipped), 1)
        self.assertEqual(
            result.skipped[0][1],
            "ThreadCase.world_size is 0: no ranks to start "
            f"({settings.accelerator_count()} accelerators found)",
        )

    def test_negative_world_size_is_a_one_line_error(self) -> None:
        result, _ = run_case(thread_case(-2, test_body=lambda self: None), "test_body")
        self.assertEqual(len(result.errors), 1)
        self.assertIn(
            "HarnessConfigError: ThreadCase.world_size must be a positive int, got -2",
            result.errors[0][1],
        )

    def test_upstream_rank_helpers(self) -> None:
        seen: List[Tuple[str, int, Any]] = []
        lock = threading.Lock()

        def note(*item: Any) -> None:
            with lock:
                seen.append(item)

        def per_thread_set_up(self: MultiThreadedTestCase) -> None:
            note("setup", self.rank, threading.current_thread().name)

        def per_thread_tear_down(self: MultiThreadedTestCase) -> None:
            note("teardown", self.rank, None)

        def test_body(self: MultiThreadedTestCase) -> None:
            note("master", self.rank, self.is_master)
            self.assertEqualOnRank(self.rank, 0)  # only rank 0 compares
            self.assertNotEqualOnRank(self.rank, 0, rank=1)
            with self.assertRaises(AssertionError):
                self.assertEqualOnRank(self.rank, 5, rank=self.rank)

        cls = thread_case(
            2, test_body=test_body, perThreadSetUp=per_thread_set_up,
            perThreadTearDown=per_thread_tear_down,
        )
        result, case = run_case(cls, "test_body")
        self.assertEqual(messages(result), [])
        self.assertEqual(sorted(seen), [
            ("master", 0, True), ("master", 1, False),
            ("setup", 0, "harness-rank-0"), ("setup", 1, "harness-rank-1"),
            ("teardown", 0, None), ("teardown", 1, None),
        ])
        self.assertFalse(case.is_master)  # the supervisor is no rank
        case.rank = 1  # upstream's rank is a plain attribute
        self.assertEqual((case.rank, case.is_master), (1, False))

    def test_skip_in_ranks_keeps_its_reason(self) -> None:
        def test_body(self: MultiThreadedTestCase) -> None:
            raise unittest.SkipTest(f"not today (rank {self.rank})")

        result, _ = run_case(thread_case(2, test_body=test_body), "test_body")
        self.assertEqual(messages(result), [])
        self.assertEqual(len(result.skipped), 1)
        self.assertRegex(result.skipped[0][1], r"^not today \(rank \d\)$")

    @pytest.mark.timeout(60)  # a limit of its own: a harness that never times out fails here
    def test_timeout_reports_stacks_of_running_ranks(self) -> None:
        def spin_forever() -> None:
            while True:
                time.sleep(0.01)

        def test_body(self: MultiThreadedTestCase) -> None:
            if self.rank == 0:
                spin_forever()
            dist.barrier()

        result, _ = run_case(thread_case(2, timeout=1.0, test_body=test_body), "test_body")
        self.assertEqual((len(result.failures), len(result.errors)), (0, 1))  # an error
        text = messages(result)[0]
        self.assertIn("timed out after 1 s with rank 0, rank 1 still running", text)
        self.assertIn("--- stack of rank 0 ---", text)
        self.assertIn("in spin_forever", text)
        self.assertIn("--- stack of rank 1 ---", text)
        # The stopped thread really ended: nothing of this test keeps running.
        alive = [t.name for t in threading.enumerate() if t.name.startswith("harness-rank-")]
        self.assertEqual(alive, [])

    def test_world_size_1(self) -> None:
        def test_body(self: MultiThreadedTestCase) -> None:
            t = torch.arange(3.0)
            dist.all_reduce(t)
            out = torch.zeros(3)
            dist.all_gather_single(out, t)
            self.assertEqual((self.rank, self.world_size, dist.get_world_size()), (0, 1, 1))
            self.assertEqual(out, torch.arange(3.0))

        result, _ = run_case(thread_case(1, test_body=test_body), "test_body")
        self.assertEqual(messages(result), [])

    def test_grid_with_failing_middle_point(self) -> None:
        ran: List[Tuple[int, int]] = []
        lock = threading.Lock()

        def test_body(self: MultiThreadedTestCase) -> None:
            def point(x: int) -> None:
                with lock:
                    ran.append((self.rank, x))
                if x == 2 and self.rank == 1:
                    raise AssertionError("middle point breaks on rank 1")
                t = torch.ones(1)
                dist.all_reduce(t)  # rank 0 waits here for rank 1 at x == 2
                self.assertEqual(t.item(), 2.0)

            self.run_subtests({"x": [1, 2, 3]}, point)

        result, _ = run_case(thread_case(2, test_body=test_body), "test_body")
        self.assertEqual(result.errors, [])
        self.assertEqual([dict(sub.params) for sub, _ in result.failures], [{"x": 2}])
        self.assertIn("middle point breaks on rank 1", result.failures[0][1])
        self.assertEqual(sorted(ran), [(r, x) for r in (0, 1) for x in (1, 2, 3)])

    def test_grid_stops_when_a_rank_leaves_it(self) -> None:
        def test_body(self: MultiThreadedTestCase) -> None:
            if self.rank == 1:
                return  # never enters the grid: rank 0 cannot stay in step with it
            self.run_subtests({"x": [1, 2]}, lambda x: None)

        result, _ = run_case(thread_case(2, test_body=test_body), "test_body")
        self.assertEqual(len(result.failures), 1)
        self.assertIn("rank 0 raised", result.failures[0][1])
        self.assertIn("ranks could not stay in step after grid point (x=1)", result.failures[0][1])

    def test_process_state_is_restored(self) -> None:
        hook = sys.excepthook

        def test_body(self: MultiThreadedTestCase) -> None:
            assert not torch.autograd.is_multithreading_enabled()
            dist.new_group([0])

        result, _ = run_case(thread_case(2, test_body=test_body), "test_body")
        self.assertEqual(messages(result), [])
        self.assertFalse(dist.is_initialized())
        self.assertTrue(torch.autograd.is_multithreading_enabled())
        self.assertIs(sys.excepthook, hook)


# --- FSDP training on thread ranks ------------------------------------------------------
STEPS, LR, IN, HIDDEN, OUT = 3, 0.1, 8, 16, 4


def make_model(device: torch.device) -> nn.Module:
    """Identical on every rank: built from a private generator (threads share the global one)."""
    model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return model.to(device)


def batch(rank: int, step: int, device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, IN, generator=generator).to(device)


def loss_of(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    return (model(inputs) ** 2).mean()


def reference_params(world_size: int, device: torch.device) -> List[torch.Tensor]:
    """The same training on one process: the mean of every rank's loss, plain SGD."""
    model = make_model(device)
    optim = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        losses = [loss_of(model, batch(r, step, device)) for r in range(world_size)]
        (sum(losses) / world_size).backward()
        optim.step()
        optim.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


class TestFSDPOnThreads(FSDPTestMultiThread):
    """Both FSDP APIs train on thread ranks to the parameters of a single-process run."""

    @property
    def world_size(self) -> int:
        return 2

    def test_training_matches_single_process(self) -> None:
        self.run_subtests({"api": ["FullyShardedDataParallel", "fully_shard"]}, self._train)

    def test_rank_setup(self) -> None:
        self.assertIs(self.process_group, dist.group.WORLD)
        self.assertEqual(self.process_group.size(), 2)
        self.assertEqual(self.process_group.rank(), self.rank)
        self.assertEqual(self.device.type, self.device_type)

    def _train(self, api: str) -> None:
        device = self.device
        model = make_model(device)
        if api == "fully_shard":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            fully_shard(model[0], mesh=init_device_mesh(device.type, (self.world_size,)))
            fully_shard(model, mesh=init_device_mesh(device.type, (self.world_size,)))
        else:
            from torch.distributed.fsdp import FullyShardedDataParallel

            model = FullyShardedDataParallel(model, device_id=device, use_orig_params=True)
        optim = torch.optim.SGD(model.parameters(), lr=LR)
        for step in range(STEPS):
            loss_of(model, batch(self.rank, step, device)).backward()
            optim.step()
            optim.zero_grad()
        self.assertEqual(self._full_params(model, api), reference_params(self.world_size, device))

    def _full_params(self, model: nn.Module, api: str) -> List[torch.Tensor]:
        if api == "fully_shard":
            return [p.full_tensor().detach().clone() for p in model.parameters()]
        from torch.distributed.fsdp import FullyShardedDataParallel

        with FullyShardedDataParallel.summon_full_params(model):
            return [p.detach().clone() for p in model.parameters()]


if __name__ == "__main__":
    unittest.main()
