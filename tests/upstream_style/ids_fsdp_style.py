# Owner(s): ["oncall: distributed"]
"""An upstream-style FSDP test file, converted only by its imports, over process and thread ranks.

Device-type instantiation over `FSDPTest` and `FSDPTestMultiThread` with parametrize
(enum values, name_fn, comma names, subtests), @dtypes and @onlyCUDA; every body does
real collective work. tests/test_device_type.py runs it as a script and checks the exact
ids that ran and that they passed on CPU.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy

from harness import (
    FSDPTest,
    FSDPTestMultiThread,
    dtypes,
    instantiate_device_type_tests,
    onlyCUDA,
    parametrize,
    run_tests,
    skip_if_lt_x_gpu,
    subtest,
)


def _train_step(test, sharding_strategy, use_orig_params=False):
    """One FSDP step on the same input in every rank: every rank must see the same loss."""
    module = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    # The same weights in every rank from a private generator: thread ranks share torch's
    # global one, so seeding it in each rank would race.
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator))
    model = FSDP(
        module.to(test.device),
        sharding_strategy=sharding_strategy, device_id=test.device,
        use_orig_params=use_orig_params,
    )
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    inp = torch.arange(16, dtype=torch.float32, device=test.device).reshape(2, 8) / 16
    for _ in range(2):
        loss = model(inp).sum()
        loss.backward()
        optim.step()
        optim.zero_grad()
    losses = [torch.zeros(1, device=test.device) for _ in range(test.world_size)]
    dist.all_gather(losses, loss.detach().reshape(1))
    test.assertEqual(losses[0], losses[1])


class TestFSDPStyle(FSDPTest):
    @property
    def world_size(self):
        return 2

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_all_reduce(self, device):
        self.assertEqual(torch.device(device).type, self.device_type)
        value = torch.full((3,), float(self.rank + 1), device=self.device)
        dist.all_reduce(value)
        self.assertEqual(value, torch.full((3,), 3.0, device=self.device))

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    @parametrize(
        "sharding_strategy",
        [ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP, ShardingStrategy.NO_SHARD],
    )
    def test_fsdp_train(self, device, sharding_strategy):
        _train_step(self, sharding_strategy)

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    @parametrize(
        "op,expected",
        [("sum", 3.0), subtest(("max", 2.0), name="maximum")],
        name_fn=lambda op, expected: f"reduce_{op}",
    )
    def test_reduce(self, device, op, expected):
        value = torch.tensor([float(self.rank + 1)], device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        self.assertEqual(value.item(), expected)

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    @dtypes(torch.float32, torch.float64)
    def test_broadcast(self, device, dtype):
        value = torch.full((2,), float(self.rank), dtype=dtype, device=self.device)
        dist.broadcast(value, src=1)
        self.assertEqual(value, torch.ones(2, dtype=dtype, device=self.device))

    @onlyCUDA
    def test_needs_cuda(self, device):
        self.assertEqual(torch.device(device).type, "cuda")


class TestFSDPThreadStyle(FSDPTestMultiThread):
    @property
    def world_size(self):
        return 2

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    @parametrize("use_orig_params", [True, False])
    @parametrize("sharding_strategy", [ShardingStrategy.FULL_SHARD, ShardingStrategy.NO_SHARD])
    def test_fsdp_train(self, device, use_orig_params, sharding_strategy):
        _train_step(self, sharding_strategy, use_orig_params)

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    @parametrize("size,src", [(4, 0), subtest((2, 1), name="small_from_1")])
    def test_all_gather(self, device, size, src):
        value = torch.full((size,), float(self.rank), device=self.device)
        gathered = [torch.empty(size, device=self.device) for _ in range(self.world_size)]
        dist.all_gather(gathered, value)
        self.assertEqual(gathered[src], torch.full((size,), float(src), device=self.device))


instantiate_device_type_tests(TestFSDPStyle, globals(), only_for=("cpu", "cuda"))
instantiate_device_type_tests(TestFSDPThreadStyle, globals(), except_for="hpu")

if __name__ == "__main__":
    run_tests()
