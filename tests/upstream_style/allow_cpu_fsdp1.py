# Owner(s): ["oncall: distributed"]
"""An upstream-style FSDP1 file written for GPUs, converted only by its imports.

As upstream's FSDP1 files do: device-type instantiation with only_for=("cuda", "hpu") over
FSDPTest and FSDPTestMultiThread, `skip_if_lt_x_gpu(2)` without allow_cpu, FSDP1 built
without `device_id` (on a GPU it takes the current device) and a DDP reference with
`device_ids=[self.rank]`. Without an accelerator no class is even made (as upstream's
harness does); with HARNESS_ALLOW_CPU=1 they run on CPU with gloo (threads: the threaded
backend). tests/test_allow_cpu.py runs it both ways.
"""

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.nn.parallel import DistributedDataParallel as DDP

from harness import (
    FSDPTest,
    FSDPTestMultiThread,
    get_devtype,
    instantiate_device_type_tests,
    onlyCUDA,
    parametrize,
    requires_nccl,
    run_tests,
    skip_if_lt_x_gpu,
)

device_type = torch.device(get_devtype())


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _train(model, inputs):
    """Two SGD steps; the losses each step saw."""
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for inp in inputs:
        loss = model(inp).sum()
        loss.backward()
        optim.step()
        optim.zero_grad()
        losses.append(loss.detach())
    return losses


class TestFSDP1OnAccelerators(FSDPTest):
    @property
    def world_size(self):
        return 2

    def _inputs(self):
        torch.manual_seed(self.rank + 1)  # each rank its own batch, as data parallelism does
        return [torch.randn(4, 8, device=device_type) for _ in range(2)]

    @skip_if_lt_x_gpu(2)
    @parametrize(
        "sharding_strategy", [ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP]
    )
    def test_fsdp_matches_ddp(self, device, sharding_strategy):
        """FSDP1 without device_id trains exactly as DDP(device_ids=[rank]) does."""
        ddp = DDP(_model().to(device_type), device_ids=[self.rank])
        fsdp = FSDP(
            _model(), sharding_strategy=sharding_strategy,
            auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
        )
        inputs = self._inputs()
        self.assertEqual(_train(fsdp, inputs), _train(ddp, inputs))

    @skip_if_lt_x_gpu(2)
    def test_fsdp_without_device_id_all_gathers(self, device):
        """Unsharded parameters are the same on every rank and equal the model's."""
        model = FSDP(_model())
        with FSDP.summon_full_params(model):
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(self.world_size)]
        dist.all_gather(gathered, flat)
        self.assertEqual(gathered[0], gathered[1])
        expected = torch.cat([p.reshape(-1) for p in _model().parameters()])
        self.assertEqual(flat, expected)

    @skip_if_lt_x_gpu(2)
    @requires_nccl()
    def test_ddp_device_ids_rank(self, device):
        """DDP(device_ids=[rank], output_device=rank) averages the ranks' gradients."""
        model = DDP(_model().to(device_type), device_ids=[self.rank], output_device=self.rank)
        model(torch.full((2, 8), float(self.rank + 1), device=device_type)).sum().backward()
        reference = _model()
        for scale in (1.0, 2.0):
            reference(torch.full((2, 8), scale)).sum().backward()
        for got, ref in zip(model.parameters(), reference.parameters()):
            self.assertEqual(got.grad, ref.grad / 2)

    @onlyCUDA
    @skip_if_lt_x_gpu(2)
    def test_only_cuda_broadcast(self, device):
        """onlyCUDA: runs on CPU only when the CPU stands in for the accelerators."""
        tensor = torch.full((2,), float(self.rank), device=device)
        dist.broadcast(tensor, src=1)
        self.assertEqual(tensor, torch.ones(2, device=device))

    @skip_if_lt_x_gpu(2)
    def test_fsdp_state_dict_round_trip(self, device):
        """A full state dict of FSDP1 built without device_id loads into a plain copy."""
        model = FSDP(_model())
        state = copy.deepcopy(model.state_dict())
        plain = _model()
        plain.load_state_dict({k.replace("_fsdp_wrapped_module.", ""): v for k, v in state.items()})
        inp = torch.randn(3, 8, device=device_type)
        self.assertEqual(model(inp), plain(inp))


class TestFSDP1ThreadRanks(FSDPTestMultiThread):
    @property
    def world_size(self):
        return 2

    @skip_if_lt_x_gpu(2)
    def test_fsdp_without_device_id_in_threads(self, device):
        """FSDP1 without device_id in rank threads trains as the unsharded model does."""
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        with torch.no_grad():  # the same values in every rank (thread ranks share one RNG)
            for i, param in enumerate(model.parameters()):
                param.copy_(torch.linspace(-1, 1, param.numel()).reshape(param.shape) / (i + 1))
        reference = copy.deepcopy(model)
        inputs = [torch.arange(32, dtype=torch.float32).reshape(4, 8) / 32] * 2
        self.assertEqual(_train(FSDP(model), inputs), _train(reference, inputs))


instantiate_device_type_tests(TestFSDP1OnAccelerators, globals(), only_for=("cuda", "hpu"))
instantiate_device_type_tests(TestFSDP1ThreadRanks, globals(), only_for=("cuda", "hpu"))

if __name__ == "__main__":
    run_tests()
