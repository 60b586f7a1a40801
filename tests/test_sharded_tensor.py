"""harness.kit.sharded_tensor: the sharded-tensor base and with_comms behave as upstream's
on the same file; the spec and weight helpers give upstream's values."""

from __future__ import annotations

import unittest

import pytest
import torch

from harness import TestCase
from harness.kit import sharded_tensor as ours
from tests.differential import both

SHARDED = '''
import torch
import torch.distributed as dist
from torch.distributed._shard import sharded_tensor
from torch.distributed._shard.sharding_spec import ChunkShardingSpec
from torch.testing._internal.distributed._shard.sharded_tensor import (
    ShardedTensorTestBase,
    TEST_GPU_NUM,
    with_comms,
)


class ShardedThing(ShardedTensorTestBase):
    @with_comms(init_rpc=False, backend="gloo")
    def test_gloo_sharded_tensor(self):
        spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(TEST_GPU_NUM)])
        st = sharded_tensor.ones(spec, 8, 2)
        self.assertEqual(dist.get_world_size(), 4)
        self.assertEqual(st.local_shards()[0].tensor.shape, torch.Size([2, 2]))
        self.assertEqual(st.local_shards()[0].metadata.shard_offsets, [2 * self.rank, 0])

    @with_comms
    def test_nccl_needs_accelerators(self):
        pass
'''


@pytest.mark.slow
class DifferentialTest(unittest.TestCase):
    def test_outcomes_match_upstream(self) -> None:
        theirs, mine = both(SHARDED)
        self.assertEqual({k: v[0] for k, v in mine.items()}, {k: v[0] for k, v in theirs.items()})
        self.assertEqual(theirs["ShardedThing.test_gloo_sharded_tensor"][0], "pass")
        self.assertEqual(mine["ShardedThing.test_nccl_needs_accelerators"][1],
                         theirs["ShardedThing.test_nccl_needs_accelerators"][1])


@pytest.mark.slow  # imports upstream's testing modules
class HelpersTest(TestCase):
    def test_spec_helpers_give_upstreams_specs(self) -> None:
        from torch.testing._internal.distributed._shard.sharded_tensor import (
            _test_ops_common,
            _test_st_common,
        )

        self.assertEqual(ours.generate_chunk_sharding_specs_for_test(1),
                         _test_ops_common.generate_chunk_sharding_specs_for_test(1))
        self.assertEqual(ours.generate_enumerable_sharding_specs_for_test(),
                         _test_ops_common.generate_enumerable_sharding_specs_for_test())
        # both shuffle their placements in place: the same sequence of calls, the same specs
        for dims, seed in (([0, 1], 0), ([1], 3), ([0, 1, 0], 7)):
            self.assertEqual(ours._chunk_sharding_specs_list_for_test(dims, seed),
                             _test_st_common._chunk_sharding_specs_list_for_test(dims, seed))
        weight = torch.rand(17, 9)
        for spec in ours.generate_chunk_sharding_specs_for_test(0):
            for rank in range(4):
                self.assertEqual(
                    ours.generate_local_weight_sharding_params_for_test(weight, 0, 4, spec, rank),
                    _test_ops_common.generate_local_weight_sharding_params_for_test(
                        weight, 0, 4, spec, rank))
        for op, inplace in (("+", False), ("*", True), ("torch.sub", False)):
            lhs, rhs = torch.ones(2), torch.full((2,), 3.0)
            self.assertEqual(ours.gen_binary_op_func(op, inplace)(lhs.clone(), rhs),
                             _test_ops_common.gen_binary_op_func(op, inplace)(lhs.clone(), rhs))

    def test_models_have_upstreams_structure(self) -> None:
        from torch.testing._internal.distributed._shard import test_common
        from torch.testing._internal.distributed._shard.sharded_tensor import _test_st_common

        torch.manual_seed(0)
        theirs = test_common.SimpleMegatronLM([[17, 12], [12, 29]])
        torch.manual_seed(0)
        mine = ours.SimpleMegatronLM([[17, 12], [12, 29]])
        self.assertEqual(mine.state_dict(), theirs.state_dict())
        self.assertEqual(mine(torch.ones(3, 17)), theirs(torch.ones(3, 17)))
        self.assertEqual(mine.get_weights(), theirs.get_weights())
        self.assertEqual([n for n, _ in ours.MyShardedModel1().named_parameters()],
                         [n for n, _ in _test_st_common.MyShardedModel1().named_parameters()])


if __name__ == "__main__":
    unittest.main()
