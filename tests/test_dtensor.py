"""DTensorTestBase, with_comms and with_temp_dir."""

from __future__ import annotations

import os
import unittest

import torch
import torch.distributed as dist
from torch.distributed.tensor import Shard, distribute_tensor

from harness import devices
from harness.dtensor import DTensorTestBase, with_comms, with_temp_dir
from harness.multiprocess import MAIN_PROCESS_RANK


class TestDTensorBase(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    def test_no_group_without_with_comms(self) -> None:
        self.assertFalse(dist.is_initialized())

    @with_comms
    def test_with_comms_gives_a_group_and_a_mesh(self) -> None:
        self.assertTrue(dist.is_initialized())
        self.assertEqual(dist.get_world_size(), 2)
        mesh = self.build_device_mesh()
        self.assertEqual(mesh.device_type, devices.device_type())
        sharded = distribute_tensor(torch.arange(4.0), mesh, [Shard(0)])
        self.assertEqual(sharded.to_local(), torch.arange(4.0)[2 * self.rank: 2 * self.rank + 2])
        self.assertEqual(sharded.full_tensor(), torch.arange(4.0))

    @with_comms
    @with_temp_dir
    def test_with_temp_dir_is_shared(self) -> None:
        self.assertTrue(os.path.isdir(self.temp_dir))
        paths = [None, None]
        dist.all_gather_object(paths, self.temp_dir)
        self.assertEqual(paths[0], paths[1])
        with open(os.path.join(self.temp_dir, f"rank{self.rank}"), "w") as f:
            f.write("written")
        dist.barrier()
        self.assertEqual(sorted(os.listdir(self.temp_dir)), ["rank0", "rank1"])

    def tearDown(self) -> None:
        super().tearDown()
        if self.rank == MAIN_PROCESS_RANK:
            return
        self.assertFalse(dist.is_initialized(), "with_comms left the group behind")
        if self.rank == 0 and hasattr(self, "temp_dir"):
            self.assertFalse(os.path.exists(self.temp_dir), "with_temp_dir left its dir behind")


class TestDTensorDefaults(unittest.TestCase):
    def test_defaults(self) -> None:
        case = DTensorTestBase()
        self.assertEqual(case.world_size, 4)
        self.assertEqual(case.device_type, devices.device_type())
        expected = "cpu:gloo,cuda:nccl" if devices.device_type() == "cuda" else "cpu:gloo"
        self.assertEqual(case.backend, expected)

    def test_with_temp_dir_needs_comms(self) -> None:
        @with_temp_dir
        def test_x(self: object) -> None:
            raise AssertionError("must not run")

        with self.assertRaisesRegex(RuntimeError, "test_x needs a process group: put @with_comms"):
            test_x(object())


if __name__ == "__main__":
    unittest.main()
