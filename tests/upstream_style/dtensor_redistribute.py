"""Upstream-style redistribute tests (in the manner of upstream's test_redistribute.py).

Written against `harness`; tests/test_dtensor.py also runs this file with its
`from harness import ...` lines pointed back at torch.testing._internal.
"""

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from harness import (
    DTensorTestBase,
    create_local_tensor_test_class,
    instantiate_device_type_tests,
    instantiate_parametrized_tests,
    map_local_tensor_for_rank,
    parametrize,
    run_tests,
    with_comms,
)


class RedistributeTest(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    def test_shard_to_replicate_forward_backward(self):
        device_mesh = self.build_device_mesh()
        expected = torch.randn(self.world_size * 3, 3, requires_grad=True)
        sharded = distribute_tensor(expected, device_mesh, [Shard(0)])
        replicated = sharded.redistribute(device_mesh, [Replicate()])
        self.assertEqual(replicated.to_local(), expected)
        replicated.to_local().sum().backward()
        self.assertEqual(sharded.grad.placements, (Shard(0),))
        self.assertEqual(sharded.grad.full_tensor(), torch.ones_like(expected))

    @with_comms
    def test_replicate_to_shard_local_chunk(self):
        device_mesh = self.build_device_mesh()
        full = torch.arange(self.world_size * 2 * 3, dtype=torch.float32).reshape(-1, 3)
        replicated = distribute_tensor(full, device_mesh, [Replicate()])
        sharded = replicated.redistribute(device_mesh, [Shard(0)])
        expected = map_local_tensor_for_rank(full, self.rank, lambda t, r: t[2 * r : 2 * r + 2])
        self.assertEqual(sharded.to_local(), expected)

    @with_comms(backend="gloo")
    def test_partial_to_replicate(self):
        device_mesh = self.build_device_mesh()
        partial = DTensor.from_local(torch.ones(3, 3), device_mesh, [Partial()])
        replicated = partial.redistribute(device_mesh, [Replicate()])
        self.assertEqual(replicated.to_local(), torch.full((3, 3), float(self.world_size)))

    @with_comms
    def test_shard_to_shard_other_dim(self):
        device_mesh = self.build_device_mesh()
        full = torch.randn(self.world_size * 2, self.world_size * 2)
        on_dim0 = distribute_tensor(full, device_mesh, [Shard(0)])
        on_dim1 = on_dim0.redistribute(device_mesh, [Shard(1)])
        self.assertEqual(on_dim1.placements, (Shard(1),))
        self.assertEqual(on_dim1.full_tensor(), full)


    @with_comms
    def test_manual_seed_for_rank_differs(self):
        self.init_manual_seed_for_rank()
        device_mesh = self.build_device_mesh()
        local = torch.rand(1, 4)
        gathered = DTensor.from_local(local, device_mesh, [Shard(0)]).full_tensor()
        if self.is_local_tensor_enabled:
            self.assertEqual(gathered[0], gathered[1])
        else:
            self.assertNotEqual(gathered[0], gathered[1])


    @with_comms(eager_init=True)
    @parametrize("shard_dim", [0, 1])
    def test_shard_dim_round_trip(self, shard_dim):
        device_mesh = self.build_device_mesh()
        full = torch.arange(16.0).reshape(4, 4)
        sharded = distribute_tensor(full, device_mesh, [Shard(shard_dim)])
        self.assertEqual(sharded.to_local().shape[shard_dim], 4 // self.world_size)
        self.assertEqual(sharded.redistribute(device_mesh, [Replicate()]).to_local(), full)


instantiate_parametrized_tests(RedistributeTest)
RedistributeTestWithLocalTensor = create_local_tensor_test_class(RedistributeTest)


class RedistributeDeviceTest(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    def test_replicate_on_device(self, device):
        device_mesh = init_device_mesh(device, (self.world_size,))
        full = torch.ones(4, 2, device=device)
        sharded = distribute_tensor(full, device_mesh, [Shard(0)])
        self.assertEqual(sharded.redistribute(device_mesh, [Replicate()]).to_local(), full)


instantiate_device_type_tests(RedistributeDeviceTest, globals(), only_for="cpu")


if __name__ == "__main__":
    run_tests()
