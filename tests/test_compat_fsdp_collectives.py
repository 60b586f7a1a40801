"""harness.compat.fsdp_collectives: the names it gives are collectives of this torch."""

import unittest

import torch.distributed as dist

from harness.compat import fsdp_collectives


class FSDPCollectivesTest(unittest.TestCase):
    def test_reduce_scatter_is_a_real_dist_function(self):
        name = fsdp_collectives.reduce_scatter_name()
        self.assertIn(name, ("reduce_scatter_single", "reduce_scatter_tensor"))
        self.assertTrue(callable(getattr(dist, name)))

    def test_all_gather_is_a_real_dist_function(self):
        name = fsdp_collectives.all_gather_name()
        self.assertIn(name, ("all_gather_single", "all_gather_into_tensor"))
        self.assertTrue(callable(getattr(dist, name)))


if __name__ == "__main__":
    unittest.main()
