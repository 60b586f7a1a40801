# Owner(s): ["oncall: distributed"]
"""An upstream-style DTensor / c10d test file, converted only by its imports.

Device-type instantiation over `DTensorTestBase` (with `@with_comms`) and a plain
`MultiProcessTestCase` that spawns in setUp and builds its own group, with comma
parametrize, name_fn, subtests and @onlyCPU; every body does real collective work.
tests/test_device_type.py runs it as a script and checks the exact ids that ran.
"""

import torch
import torch.distributed as dist
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from harness import (
    DTensorTestBase,
    MultiProcessTestCase,
    instantiate_device_type_tests,
    onlyCPU,
    parametrize,
    run_tests,
    skip_if_lt_x_gpu,
    subtest,
    with_comms,
)


class DTensorStyleTest(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    @parametrize("shard_dim", [0, 1])
    def test_distribute_and_gather(self, device, shard_dim):
        mesh = self.build_device_mesh()
        full = torch.arange(16, dtype=torch.float32, device=device).reshape(4, 4)
        sharded = distribute_tensor(full, mesh, [Shard(shard_dim)])
        self.assertEqual(sharded.to_local().shape[shard_dim], 4 // self.world_size)
        self.assertEqual(sharded.full_tensor(), full)

    @with_comms
    @parametrize(
        "placement,local_rows",
        [subtest((Shard(0), 2), name="sharded"), (Replicate(), 4)],
        name_fn=lambda placement, local_rows: f"rows{local_rows}",
    )
    def test_redistribute(self, device, placement, local_rows):
        mesh = self.build_device_mesh()
        tensor = distribute_tensor(torch.ones(4, 2, device=device), mesh, [placement])
        self.assertEqual(tensor.to_local().shape[0], local_rows)
        self.assertEqual(tensor.redistribute(mesh, [Replicate()]).to_local().sum().item(), 8.0)


class ProcessGroupStyleTest(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _init_group(self):
        dist.init_process_group(
            "gloo", init_method=f"file://{self.file_name}", rank=self.rank,
            world_size=self.world_size,
        )

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    @onlyCPU
    @parametrize("op,expected", [(dist.ReduceOp.SUM, 3.0), (dist.ReduceOp.PRODUCT, 2.0)])
    def test_all_reduce(self, device, op, expected):
        self._init_group()
        try:
            value = torch.tensor([float(self.rank + 1)], device=device)
            dist.all_reduce(value, op=op)
            self.assertEqual(value.item(), expected)
        finally:
            dist.destroy_process_group()

    @onlyCPU
    @parametrize("src", [0, subtest(1, name="from_last")])
    def test_broadcast_object(self, src):
        self._init_group()
        try:
            box = [f"rank{self.rank}"]
            dist.broadcast_object_list(box, src=src)
            self.assertEqual(box, [f"rank{src}"])
        finally:
            dist.destroy_process_group()


instantiate_device_type_tests(DTensorStyleTest, globals())
instantiate_device_type_tests(ProcessGroupStyleTest, globals(), only_for="cpu")

if __name__ == "__main__":
    run_tests()
