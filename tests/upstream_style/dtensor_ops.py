"""Upstream-style DTensor op tests (in the manner of upstream's test_tensor_ops.py).

Threaded ranks (DTensorOpTestBase), `_test_op` over DTensorConverter's shardings, and
the LocalTensor variant of the threaded base. Written against `harness`;
tests/test_dtensor.py also runs it with its imports pointed at torch.testing._internal.
"""

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from harness import (
    DTensorConverter,
    DTensorOpTestBase,
    DTensorTestBase,
    LocalDTensorOpTestBase,
    create_local_tensor_test_class,
    run_tests,
    with_comms,
)


class DistTensorOpsTest(DTensorOpTestBase):
    @with_comms
    def test_clone(self):
        self.assertEqual(dist.get_world_size(), self.world_size)
        device_mesh = self.build_device_mesh()
        specs = [[Replicate()], [Shard(0)]]
        tensor_to_clone = torch.randn(12, 8, requires_grad=True)
        for spec in specs:
            mat = distribute_tensor(tensor_to_clone, device_mesh, spec)
            cloned_mat = mat.clone()
            self.assertFalse(cloned_mat is mat)
            self.assertEqual(cloned_mat.to_local(), mat.to_local())

    @with_comms
    def test_ones_like(self):
        device_mesh = self.build_device_mesh()
        input_tensor = torch.randn(4, 8)
        dist_tensor = DTensor.from_local(input_tensor, device_mesh, [Shard(0)])
        ones_like_dt = torch.ones_like(dist_tensor)
        self.assertEqual(ones_like_dt.to_local(), torch.ones_like(input_tensor))

    @with_comms
    def test_add_sharded_and_replicated(self):
        device_mesh = self.build_device_mesh()
        lhs = distribute_tensor(torch.ones(8, 4), device_mesh, [Shard(0)])
        rhs = distribute_tensor(torch.full((8, 4), 2.0), device_mesh, [Replicate()])
        self.assertEqual((lhs + rhs).full_tensor(), torch.full((8, 4), 3.0))

    @with_comms
    def test_converter_choices(self):
        device_mesh = self.build_device_mesh()
        args = (torch.randn(8, 3), torch.ones(2, dtype=torch.bool), 3)
        converter = DTensorConverter(device_mesh, args, {})
        combos = list(converter)
        self.assertEqual(len(combos), 2)  # the float tensor: Replicate or Shard(0)
        self.assertTrue(converter.successful())
        self.assertEqual(type(combos[0][0][0]), DTensor)
        self.assertEqual(combos[0][0][2], 3)


DistTensorOpsTestWithLocalTensor = create_local_tensor_test_class(
    DistTensorOpsTest,
    base_class=LocalDTensorOpTestBase,
)


class DTensorOpOnProcessesTest(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    def test_mm_over_all_shardings(self):
        device_mesh = self.build_device_mesh()
        torch.manual_seed(0)
        self._test_op(device_mesh, torch.mm, torch.randn(4, 8), torch.randn(8, 4))

    @with_comms
    def test_op_on_dtensor(self):
        device_mesh = self.build_device_mesh()
        dt = distribute_tensor(torch.arange(16.0).reshape(4, 4), device_mesh, [Shard(1)])
        self._test_op_on_dtensor(torch.sum, dt, dim=0)



DTensorOpOnProcessesTestWithLocalTensor = create_local_tensor_test_class(DTensorOpOnProcessesTest)


if __name__ == "__main__":
    run_tests()
