"""harness.compat.local_tensor: each private torch hook the DTensor kit uses still works here."""

from __future__ import annotations

import importlib
import unittest

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

from harness.compat import local_tensor as compat


def _one_rank_group(test: unittest.TestCase) -> None:
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    test.addCleanup(dist.destroy_process_group)


class TestLocalTensorHooks(unittest.TestCase):
    def test_rank_is_one_int_per_simulated_rank(self) -> None:
        rank = compat.local_rank(3)
        self.assertIsInstance(rank, torch.SymInt)
        self.assertEqual(compat.local_ints(rank), {0: 0, 1: 1, 2: 2})
        self.assertEqual(compat.local_ints(rank * 2 + 1), {0: 1, 1: 3, 2: 5})

    def test_mode_simulates_ranks_and_maybe_run_runs_per_rank(self) -> None:
        @compat.maybe_run_for_local_tensor
        def row(tensor: torch.Tensor, rank: int) -> torch.Tensor:
            return tensor[rank]

        table = torch.arange(6).reshape(3, 2)
        self.assertEqual(row(table, 1).tolist(), [2, 3])  # outside the mode: one call
        with compat.local_tensor_mode(3):
            per_rank = row(table, compat.local_rank(3))
            with compat.maybe_disable_local_tensor_mode():
                self.assertFalse(compat.is_local_tensor(torch.ones(1)))
        self.assertTrue(compat.is_local_tensor(per_rank))
        self.assertEqual({r: t.tolist() for r, t in per_rank._local_tensors.items()},
                         {0: [0, 1], 1: [2, 3], 2: [4, 5]})
        self.assertFalse(compat.is_local_tensor(torch.ones(1)))

    def test_fake_group_has_world_size_and_no_communication(self) -> None:
        compat.register_fake_backend()
        compat.register_fake_backend()  # registering twice is harmless
        group = compat.init_fake_process_group(4)
        self.addCleanup(dist.destroy_process_group)
        self.assertIs(group, dist.group.WORLD)
        self.assertEqual((dist.get_backend(), dist.get_world_size(), dist.get_rank()),
                         ("fake", 4, 0))
        tensor = torch.ones(2)
        dist.all_reduce(tensor)
        self.assertEqual(tensor.tolist(), [1.0, 1.0])

    def test_async_collective_tensor_is_what_async_redistribute_gives(self) -> None:
        compat.init_fake_process_group(2)
        self.addCleanup(dist.destroy_process_group)
        mesh = init_device_mesh("cpu", (2,))
        sharded = distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)])
        out = sharded.redistribute(mesh, [Replicate()], async_op=True).to_local()
        self.assertIs(type(out), compat.AsyncCollectiveTensor)
        self.assertTrue(issubclass(compat.AsyncCollectiveTensor, torch.Tensor))
        self.assertEqual(out.wait().shape, (4, 2))

    def test_op_strategy_context_swaps_the_rule_for_the_block(self) -> None:
        compat.init_fake_process_group(2)
        self.addCleanup(dist.destroy_process_group)
        mesh = init_device_mesh("cpu", (2,))
        calls = []

        def refusing_strategy(op_schema: object) -> None:
            calls.append(op_schema)
            raise LookupError("harness-test strategy")

        sharded = distribute_tensor(torch.ones(4, 6), mesh, [Shard(0)])
        with compat.op_strategy_context(torch.ops.aten.sum.default, refusing_strategy):
            with self.assertRaisesRegex(RuntimeError, "harness-test strategy"):
                torch.sum(sharded)
        self.assertEqual(len(calls), 1)
        self.assertEqual(torch.sum(sharded).placements, (Partial(),))  # the real rule is back

    def test_record_function_switch(self) -> None:
        compat.set_record_function_enabled(False)
        compat.set_record_function_enabled(True)
        with torch.profiler.profile() as prof:
            with torch.profiler.record_function("harness-probe"):
                torch.ones(1).add_(1)
        self.assertIn("harness-probe", [e.name for e in prof.events()])

    def test_reset_dtensor_rng_tracker(self) -> None:
        module = importlib.import_module("torch.distributed.tensor._random")
        module._rng_tracker = object()
        compat.reset_dtensor_rng_tracker()
        self.assertIsNone(module._rng_tracker)

    def test_thread_safe_sharding_propagation_swaps_and_restores_the_lock(self) -> None:
        propagator = importlib.import_module("torch.distributed.tensor._sharding_prop")
        original = propagator.ShardingPropagator._fake_mode_lock
        with compat.thread_safe_sharding_propagation():
            swapped = propagator.ShardingPropagator._fake_mode_lock
            self.assertIsNot(swapped, original)
            self.assertTrue(swapped.acquire(blocking=False))
            swapped.release()
        self.assertIs(propagator.ShardingPropagator._fake_mode_lock, original)

    def test_functional_tensor_check(self) -> None:
        self.assertFalse(compat.is_functional_tensor(torch.ones(1)))

    def test_reset_dynamo(self) -> None:
        compiled = torch.compile(lambda x: x + 1, backend="eager")
        self.assertEqual(compiled(torch.ones(1)).tolist(), [2.0])
        compat.reset_dynamo()
        self.assertEqual(compiled(torch.ones(1)).tolist(), [2.0])


class TestCollectivesAndMeshes(unittest.TestCase):
    def setUp(self) -> None:
        _one_rank_group(self)

    def test_gather_and_scatter_along_dim0_with_autograd(self) -> None:
        group = dist.group.WORLD
        x = torch.arange(4.0, requires_grad=True)
        gathered = compat.all_gather_along_dim0(x, group)
        self.assertEqual(gathered.tolist(), [0.0, 1.0, 2.0, 3.0])
        scattered = compat.reduce_scatter_sum_along_dim0(gathered * 2, group)
        self.assertEqual(scattered.tolist(), [0.0, 2.0, 4.0, 6.0])
        scattered.sum().backward()
        self.assertEqual(x.grad.tolist(), [2.0, 2.0, 2.0, 2.0])

    def test_concatenate_meshes(self) -> None:
        mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("ep", "tp"))
        joined = compat.concatenate_meshes([mesh["ep"], mesh["tp"]])
        self.assertEqual(joined.ndim, 2)
        self.assertEqual(joined.mesh_dim_names, ("ep", "tp"))


if __name__ == "__main__":
    unittest.main()
