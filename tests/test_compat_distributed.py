"""harness.compat.distributed: the private torch.distributed entry points resolve and work."""

import unittest

import torch
import torch.distributed as dist

from harness.compat import distributed


class DistributedTest(unittest.TestCase):
    def setUp(self):
        if dist.is_initialized():
            self.skipTest("a default process group already exists in this process")
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        self.addCleanup(dist.destroy_process_group)

    def test_default_process_group_is_world(self):
        self.assertIs(dist.group.WORLD, distributed.default_process_group())

    def test_composable_replicate_and_checkpoint_keep_the_module(self):
        module = torch.nn.Linear(2, 2)
        self.assertIs(module, distributed.composable_checkpoint(module))
        self.assertIs(module, distributed.composable_replicate(module))

    def test_cpu_barrier_meets_through_the_cpu_backend(self):
        self.assertIn("gloo", dist.get_backend_config(dist.group.WORLD))
        distributed.cpu_barrier(dist.group.WORLD)  # a 1-rank group: returns once met
        # (tests/test_shared_ranks.py: a group left out of step fails this meeting)

    def test_apply_optimizer_in_backward_steps_during_backward(self):
        module = torch.nn.Linear(2, 2)
        before = module.weight.detach().clone()
        distributed.apply_optimizer_in_backward(
            optimizer_class=torch.optim.SGD, params=module.parameters(),
            optimizer_kwargs={"lr": 1.0},
        )
        module(torch.ones(1, 2)).sum().backward()
        self.assertFalse(torch.equal(before, module.weight))


if __name__ == "__main__":
    unittest.main()
