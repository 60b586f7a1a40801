"""FSDPTest: each rank runs the test inside an initialised default group on its own device."""

from __future__ import annotations

import unittest

import torch
import torch.distributed as dist

from harness import devices
from harness.fsdp import FSDPTest
from harness.multiprocess import MAIN_PROCESS_RANK
from harness.parametrize import instantiate_parametrized_tests, parametrize
from harness.skips import skip_if_lt_x_gpu


class TestFSDPTestBase(FSDPTest):
    @property
    def world_size(self) -> int:
        return 2

    def test_default_group_is_ready_on_the_rank_device(self) -> None:
        self.assertTrue(dist.is_initialized())
        self.assertEqual((dist.get_rank(), dist.get_world_size()), (self.rank, 2))
        self.assertEqual(dist.get_backend(), devices.backend_for(devices.device_type()))
        self.assertEqual(self.device, devices.rank_device(self.rank))
        self.assertEqual(self.device_type, devices.device_type())
        value = torch.tensor([float(self.rank)], device=self.device)
        dist.all_reduce(value, group=self.process_group)
        self.assertEqual(value.item(), 1.0)

    def test_process_group_is_the_default_group(self) -> None:
        self.assertEqual(dist.get_world_size(self.process_group), 2)
        self.assertEqual(dist.get_process_group_ranks(self.process_group), [0, 1])

    def tearDown(self) -> None:
        super().tearDown()
        if self.rank != MAIN_PROCESS_RANK:
            self.assertFalse(dist.is_initialized(), "the group outlived the test")


@instantiate_parametrized_tests
class TestFSDPTestParametrized(FSDPTest):
    """The suites' pattern: device-generic skip decorator over generated tests."""

    @property
    def world_size(self) -> int:
        return 2

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    @parametrize("scale", [1.0, 2.0])
    def test_generated(self, scale: float) -> None:
        value = torch.full((1,), scale, device=self.device)
        dist.all_reduce(value)
        self.assertEqual(value.item(), 2 * scale)


class TestFSDPTestOverrides(FSDPTest):
    """Upstream suites override these properties; the base must not fight that."""

    @property
    def world_size(self) -> int:
        return 2

    @property
    def process_group(self) -> str:
        return "overridden"

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def test_overridden_properties_are_used(self) -> None:
        self.assertEqual(self.process_group, "overridden")
        self.assertEqual(self.device, torch.device("cpu"))
        self.assertTrue(dist.is_initialized())


class TestFSDPTestInParent(unittest.TestCase):
    def test_parent_does_not_join_a_group(self) -> None:
        case = TestFSDPTestBase("test_process_group_is_the_default_group")
        self.assertEqual(case.rank, MAIN_PROCESS_RANK)
        self.assertFalse(dist.is_initialized())


if __name__ == "__main__":
    unittest.main()
