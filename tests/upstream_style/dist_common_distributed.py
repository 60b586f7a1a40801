"""Upstream-style tests of the common_distributed / common_utils / common_cuda surface.

Written as an upstream c10d test file would be, with its `torch.testing._internal`
imports changed to `from harness import ...`. tests/test_dist_utils.py runs it as a
script and checks every test id and outcome.
"""

import os
import sys
import unittest

import torch
import torch.distributed as dist

from harness import (
    IS_FBCODE,
    TEST_CUDA,
    TEST_MULTIGPU,
    TEST_WITH_ROCM,
    DistributedTestBase,
    MultiProcessTestCase,
    MultiThreadedTestCase,
    TestCase,
    at_least_x_gpu,
    captured_output,
    instantiate_device_type_tests,
    requires_accelerator_dist_backend,
    requires_gloo,
    requires_nccl,
    run_tests,
    skip_but_pass_in_sandcastle_if,
    skip_if_lt_x_gpu,
    skip_if_no_gpu,
    skip_if_rocm_multiprocess,
    skipIfHpu,
    skipIfRocm,
    with_dist_debug_levels,
)


class ShardedLike(torch.Tensor):
    """A tensor subclass, compared by class as upstream tests compare AsyncCollectiveTensor."""


class ProcessGroupGlooLikeTest(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _init(self):
        dist.init_process_group(
            "gloo", init_method=f"file://{self.file_name}", rank=self.rank,
            world_size=self.world_size,
        )

    @requires_gloo()
    def test_is_master_and_all_reduce(self):
        self._init()
        self.assertEqual(self.is_master, self.rank == 0)
        value = torch.tensor([self.rank + 1.0])
        dist.all_reduce(value)
        self.assertEqual(value, torch.tensor([3.0]))
        self.assertEqual(type(value.as_subclass(ShardedLike)), ShardedLike)
        self.assertTrue(self.destroy_pg_upon_exit)  # the group is left for the base to destroy

    @requires_gloo()
    @with_dist_debug_levels(levels=["OFF", "INFO", "DETAIL"])
    def test_runs_once_per_debug_level(self):
        if not dist.is_initialized():
            self._init()
        level = os.environ["TORCH_DISTRIBUTED_DEBUG"]
        self.assertEqual(dist.get_debug_level(), getattr(dist.DebugLevel, level))

    def test_debug_levels_in_order_and_restored(self):
        self._init()
        before = os.environ.get("TORCH_DISTRIBUTED_DEBUG")
        seen = []

        @with_dist_debug_levels(levels=["DETAIL", "OFF"])
        def body():
            seen.append((os.environ["TORCH_DISTRIBUTED_DEBUG"], dist.get_debug_level()))
            return len(seen)

        self.assertEqual(body(), 2)
        self.assertEqual(seen, [("DETAIL", dist.DebugLevel.DETAIL), ("OFF", dist.DebugLevel.OFF)])
        self.assertEqual(os.environ.get("TORCH_DISTRIBUTED_DEBUG"), before)
        dist.destroy_process_group()

    def test_captured_output(self):
        with captured_output() as (out, err):
            print(f"rank {self.rank} to stdout")
            print("to stderr", file=sys.stderr)
        self.assertEqual(out.getvalue(), f"rank {self.rank} to stdout\n")
        self.assertEqual(err.getvalue(), "to stderr\n")

    @skip_if_lt_x_gpu(2)
    def test_needs_two_gpus(self):
        self.assertGreaterEqual(torch.cuda.device_count(), 2)

    @skip_if_no_gpu
    def test_needs_a_gpu_per_rank(self):
        self.assertGreaterEqual(torch.cuda.device_count(), self.world_size)

    @requires_nccl()
    def test_needs_nccl(self):
        self.assertTrue(dist.is_nccl_available())

    @requires_accelerator_dist_backend(["nccl", "xccl"])
    def test_needs_an_accelerator_backend(self):
        self.assertTrue(dist.is_nccl_available() or dist.is_xccl_available())

    @unittest.skipIf(not at_least_x_gpu(2), "at_least_x_gpu(2) is False")
    def test_at_least_two_gpus(self):
        self.assertTrue(TEST_MULTIGPU)

    @skip_if_rocm_multiprocess
    @skipIfRocm
    @skipIfHpu
    def test_not_on_rocm_or_hpu(self):
        self.assertFalse(TEST_WITH_ROCM)

    @skip_but_pass_in_sandcastle_if(not IS_FBCODE, "only in fbcode")
    def test_fbcode_only(self):
        self.assertTrue(IS_FBCODE)


class SelfDestroyingTest(MultiProcessTestCase):
    """A base that destroys its own group, as upstream's FSDPTest does."""

    @property
    def world_size(self):
        return 2

    @property
    def destroy_pg_upon_exit(self):
        return False

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def tearDown(self):
        if self.rank != self.MAIN_PROCESS_RANK:
            self.assertTrue(dist.is_initialized())
            dist.destroy_process_group()
        super().tearDown()

    def test_group_left_for_tear_down(self):
        dist.init_process_group(
            "gloo", init_method=self.init_method, rank=self.rank, world_size=self.world_size
        )
        self.assertFalse(self.destroy_pg_upon_exit)
        dist.barrier()  # no rank tears its group down while a peer still connects to it


class GpuCountWorldSizeTest(MultiProcessTestCase):
    """Upstream sizes some classes by the GPU count: 0 ranks on a CPU machine."""

    @property
    def world_size(self):
        return torch.cuda.device_count()

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_per_gpu(self):
        self.assertTrue(TEST_CUDA)


class GpuCountThreadsTest(MultiThreadedTestCase):
    @property
    def world_size(self):
        return torch.cuda.device_count()

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_per_gpu(self):
        self.assertTrue(TEST_CUDA)


class ThreadedHelpersTest(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_rank_helpers(self):
        self.assertEqual(self.is_master, self.rank == 0)
        self.assertEqualOnRank(dist.get_rank(), 0)
        self.assertEqualOnRank(dist.get_rank(), 1, rank=1)


class DeviceGenericTest(DistributedTestBase):
    @property
    def world_size(self):
        return 2

    def test_create_pg(self, device):
        pg = self.create_pg(device)
        self.assertIs(pg, dist.group.WORLD)
        self.assertEqual(pg.size(), self.world_size)
        self.assertEqual(dist.get_backend(), self.backend(device))
        self.assertEqual(os.environ["WORLD_SIZE"], str(self.world_size))
        value = torch.ones(2, device=device) * (self.rank + 1)
        dist.all_reduce(value)
        self.assertEqual(value, [3.0, 3.0])
        count = torch.get_device_module(device).device_count()
        self.assertEqual(self.rank_to_device(device), {0: [0], 1: [1 % count]})


class PlainTest(TestCase):
    def test_assert_equal_forms(self):
        self.assertEqual(type(torch.ones(1).as_subclass(ShardedLike)), ShardedLike)
        self.assertEqual(torch.ones(2), torch.ones(2) + 1e-3, atol=1e-2, rtol=0)
        self.assertEqual(torch.ones(2), torch.ones(2, dtype=torch.float64), exact_dtype=False)
        self.assertEqual(1.0, 1.0 + 1e-7, msg="floats use upstream's tolerance")
        self.assertNotWarn(lambda: torch.ones(1) + 1)


instantiate_device_type_tests(DeviceGenericTest, globals(), only_for=("cpu",))

if __name__ == "__main__":
    run_tests()
