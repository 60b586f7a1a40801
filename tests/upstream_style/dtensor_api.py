"""Upstream-style DTensor API tests (in the manner of upstream's test_dtensor.py).

Written against `harness`; tests/test_dtensor.py also runs this file with
its `from harness import ...` lines pointed back at torch.testing._internal.
"""

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from harness import (
    DTensorTestBase,
    MLPModule,
    create_local_tensor_test_class,
    map_local_tensor_for_rank,
    run_tests,
    skip_unless_torch_gpu,
    with_comms,
)
from harness.compat.local_tensor import AsyncCollectiveTensor


class DTensorTest(DTensorTestBase):
    @with_comms
    def test_dtensor_constructor(self):
        device_mesh = self.build_device_mesh()
        local_tensor = torch.randn(3, 3, requires_grad=True)
        dist_tensor = DTensor.from_local(local_tensor, device_mesh, [Shard(0)])
        self.assertEqual(dist_tensor.size(), torch.Size([3 * self.world_size, 3]))
        self.assertEqual(dist_tensor.placements, (Shard(0),))
        self.assertTrue(dist_tensor.requires_grad)


    @with_comms
    def test_full_tensor_of_sharded(self):
        device_mesh = self.build_device_mesh()
        full = torch.arange(4 * self.world_size, dtype=torch.float32).reshape(self.world_size, 4)
        sharded = distribute_tensor(full, device_mesh, [Shard(0)])
        expected_local = map_local_tensor_for_rank(full, self.rank, lambda t, r: t[r : r + 1])
        self.assertEqual(sharded.to_local(), expected_local)
        self.assertEqual(sharded.full_tensor(), full)


    @with_comms
    def test_async_redistribute_returns_async_collective_tensor(self):
        device_mesh = self.build_device_mesh()
        sharded = distribute_tensor(torch.ones(self.world_size * 2, 3), device_mesh, [Shard(0)])
        out = sharded.redistribute(device_mesh, [Replicate()], async_op=True).to_local()
        self.assertEqual(type(out), AsyncCollectiveTensor)
        self.assertEqual(out.wait(), torch.ones(self.world_size * 2, 3))

    @with_comms(eager_init=True)
    def test_eager_init_gives_group(self):
        self.assertTrue(dist.is_initialized())
        self.assertEqual(dist.get_world_size(), self.world_size)
        device_mesh = self.build_device_mesh()
        self.assertEqual(device_mesh.device_type, self.device_type)


    @with_comms
    def test_mlp_tensor_parallel_matches_local(self):
        device_mesh = self.build_device_mesh()
        model = MLPModule(self.device_type)
        reference = MLPModule(self.device_type)
        plan = {"net1": ColwiseParallel(), "net2": RowwiseParallel()}
        tp_model = parallelize_module(model, device_mesh, plan)
        torch.manual_seed(0)
        inp = torch.rand(5, 10, device=self.device_type)
        self.assertEqual(tp_model(inp), reference(inp))


    @skip_unless_torch_gpu
    @with_comms
    def test_needs_accelerators(self):
        device_mesh = self.build_device_mesh()
        self.assertEqual(device_mesh.device_type, "cuda")


DTensorTestWithLocalTensor = create_local_tensor_test_class(
    DTensorTest,
    skipped_tests=["test_async_redistribute_returns_async_collective_tensor"],
)


if __name__ == "__main__":
    run_tests()
