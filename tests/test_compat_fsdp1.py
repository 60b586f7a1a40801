"""harness.compat.fsdp1: every FSDP1 internal the kit and suites read resolves in this torch."""

import unittest

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy

from harness.compat import fsdp1

CPU = torch.device("cpu")


class FSDP1FactsTest(unittest.TestCase):
    def test_facts(self):
        self.assertEqual(
            fsdp1.homogeneous_attr_names(),
            ("_use_orig_params", "limit_all_gathers", "_use_full_prec_in_eval"),
        )
        self.assertEqual(fsdp1.unsafe_setattr_env(), "FSDP_USE_UNSAFE_SETATTR")
        self.assertEqual(fsdp1.full_prec_in_eval_env(), "FSDP_USE_FULL_PREC_IN_EVAL")
        self.assertIsInstance(fsdp1.hybrid_shard_zero2(), ShardingStrategy)

    def test_no_reshard_after_forward_strategies(self):
        strategies = fsdp1.no_reshard_after_forward_strategies()
        self.assertIn(ShardingStrategy.SHARD_GRAD_OP, strategies)
        self.assertNotIn(ShardingStrategy.FULL_SHARD, strategies)


class FSDP1OneRankTest(unittest.TestCase):
    """Lookups that need a live FSDP1 instance, on a one-rank gloo group."""

    def setUp(self):
        if dist.is_initialized():
            self.skipTest("a default process group already exists in this process")
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        self.addCleanup(dist.destroy_process_group)

    def test_assert_idle(self):
        errors = []

        class CheckDuringForward(torch.nn.Module):
            def forward(self, x):
                try:
                    fsdp1.assert_idle(model)
                except ValueError as error:
                    errors.append(error)
                return x

        model = FSDP(
            torch.nn.Sequential(torch.nn.Linear(2, 2), CheckDuringForward()),
            device_id=CPU,
        )
        model(torch.ones(1, 2)).sum().backward()
        fsdp1.assert_idle(model)
        self.assertEqual(1, len(errors), "a root in its forward passed as idle")

    def test_handles_and_flat_params(self):
        inner = FSDP(torch.nn.Linear(2, 2), device_id=CPU)
        model = FSDP(torch.nn.Sequential(inner, torch.nn.Linear(2, 2)), device_id=CPU)
        handles = fsdp1.handles(model)
        self.assertEqual(2, len(handles))
        self.assertTrue(any(fsdp1.flat_param(inner) is handle.flat_param for handle in handles))
        self.assertIsNone(fsdp1.flat_param(FSDP(torch.nn.ReLU(), device_id=CPU)))

    def test_record_post_backward_reshards_and_restores(self):
        runtime = fsdp1.runtime_module()
        original = runtime._post_backward_reshard
        model = FSDP(torch.nn.Linear(2, 2), device_id=CPU)
        with fsdp1.record_post_backward_reshards() as reshards:
            model(torch.ones(1, 2)).sum().backward()
        self.assertEqual(fsdp1.handles(model), reshards)
        self.assertIs(original, runtime._post_backward_reshard)


if __name__ == "__main__":
    unittest.main()
