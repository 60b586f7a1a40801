# Owner(s): ["oncall: distributed"]
"""An upstream-style FSDP2/DTensor file written for GPUs, converted only by its imports.

Device-type instantiation with only_for=("cuda", "hpu") over FSDPTestMultiThread and
DTensorTestBase, plus plain classes whose tests carry the accelerator requirements upstream
files use (`skip_if_lt_x_gpu(2)` without allow_cpu, `skip_if_no_gpu`, `requires_nccl`,
`requires_accelerator_dist_backend`, `at_least_x_gpu`, `skip_unless_torch_gpu`, a
`with_comms` backend naming nccl). Without an accelerator the instantiated classes are not
made and the plain tests skip; with HARNESS_ALLOW_CPU=1 all run on CPU with gloo.
tests/test_allow_cpu.py runs it both ways.
"""

import copy
import unittest

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from harness import (
    DTensorTestBase,
    FSDPTest,
    FSDPTestMultiThread,
    at_least_x_gpu,
    get_devtype,
    instantiate_device_type_tests,
    onlyAccelerator,
    requires_accelerator_dist_backend,
    requires_nccl,
    run_tests,
    skip_if_lt_x_gpu,
    skip_if_no_gpu,
    skip_unless_torch_gpu,
    with_comms,
)

device_type = torch.device(get_devtype())


class TestFullyShardOnAccelerators(FSDPTestMultiThread):
    @property
    def world_size(self):
        return 2

    @skip_if_lt_x_gpu(2)
    def test_fully_shard_matches_local_training(self, device):
        """fully_shard on each Linear trains as the unsharded model does on the same batch."""
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).to(device_type)
        with torch.no_grad():  # the same values in every rank (thread ranks share one RNG)
            for i, param in enumerate(model.parameters()):
                param.copy_(torch.linspace(-1, 1, param.numel()).reshape(param.shape) / (i + 1))
        reference = copy.deepcopy(model)
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
        inp = torch.arange(16, dtype=torch.float32, device=device_type).reshape(2, 8) / 16
        for net in (model, reference):
            optim = torch.optim.SGD(net.parameters(), lr=0.1)
            for _ in range(2):
                net(inp).sum().backward()
                optim.step()
                optim.zero_grad()
        self.assertEqual(model(inp), reference(inp))

    @onlyAccelerator
    @skip_if_lt_x_gpu(2)
    def test_only_accelerator_all_reduce(self, device):
        """onlyAccelerator: runs on CPU only when the CPU stands in for the accelerators."""
        value = torch.full((2,), float(self.rank + 1), device=device)
        dist.all_reduce(value)
        self.assertEqual(value, torch.full((2,), 3.0, device=device))


class TestDTensorOnAccelerators(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @skip_if_lt_x_gpu(2)
    @with_comms
    def test_shard_then_full_tensor(self, device):
        """A tensor sharded over the mesh comes back whole."""
        mesh = self.build_device_mesh()
        full = torch.arange(8, dtype=torch.float32, device=self.device_type).reshape(4, 2)
        sharded = distribute_tensor(full, mesh, [Shard(0)])
        self.assertEqual(sharded.to_local(), full[2 * self.rank: 2 * self.rank + 2])
        self.assertEqual(sharded.redistribute(mesh, [Replicate()]).to_local(), full)


instantiate_device_type_tests(TestFullyShardOnAccelerators, globals(), only_for=("cuda", "hpu"))
instantiate_device_type_tests(TestDTensorOnAccelerators, globals(), only_for=("cuda", "hpu"))


class TestRequirementsOnAccelerators(FSDPTest):
    @property
    def world_size(self):
        return 2

    def _sum_of_ranks(self):
        value = torch.tensor([float(self.rank + 1)], device=self.device)
        dist.all_reduce(value)
        return value.item()

    @skip_if_no_gpu
    def test_skip_if_no_gpu(self):
        self.assertEqual(self._sum_of_ranks(), 3.0)

    @requires_nccl()
    @skip_if_lt_x_gpu(2)
    def test_requires_nccl(self):
        self.assertEqual(self._sum_of_ranks(), 3.0)

    @requires_accelerator_dist_backend()
    def test_requires_accelerator_dist_backend(self):
        self.assertEqual(self._sum_of_ranks(), 3.0)

    @unittest.skipIf(not at_least_x_gpu(2), "Need at least 2 GPUs")
    def test_at_least_x_gpu(self):
        self.assertEqual(self._sum_of_ranks(), 3.0)


class TestDTensorRequirements(DTensorTestBase):
    @skip_unless_torch_gpu
    @with_comms
    def test_skip_unless_torch_gpu(self):
        """As many ranks as the DTensor default (4); the mesh spans them all."""
        mesh = self.build_device_mesh()
        self.assertEqual(mesh.size(), self.world_size)

    @with_comms(backend="cpu:gloo,cuda:nccl")
    def test_backend_naming_nccl(self):
        """A backend naming nccl needs one accelerator per rank; gloo stands in on CPU."""
        value = torch.ones(1)
        dist.all_reduce(value)
        self.assertEqual(value.item(), float(self.world_size))


if __name__ == "__main__":
    run_tests()
