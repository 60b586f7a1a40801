"""Upstream's sharded-tensor test kit (`distributed._shard.sharded_tensor` with its
`_test_st_common` and `_test_ops_common` helpers, and `distributed._shard.test_common`).

`ShardedTensorTestBase` runs each test in 4 rank processes; `@with_comms` (this module's, not
DTensor's: `from harness.kit.sharded_tensor import with_comms`) starts RPC and the default
group around the test and skips, before any collective, where an accelerator backend is
asked for and this machine has fewer accelerators than ranks, as upstream does.
"""

from __future__ import annotations

import copy
import functools
import random
import unittest
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed import rpc

from harness import settings
from harness.compat.sharding import (
    ChunkShardingSpec,
    EnumerableShardingSpec,
    ShardedTensor,
    ShardMetadata,
    sharded_tensor,
)
from harness.process.multiprocess_case import MultiProcessTestCase
from harness.requirements.decorators import TEST_SKIPS
from harness.upstream.network import tp_transports

__all__ = [
    "DEFAULT_GPU_NUM", "PLACEMENTS", "TEST_GPU_NUM", "MyShardedModel1", "MyShardedModel2",
    "ShardedTensorTestBase", "SimpleMegatronLM", "_chunk_sharding_specs_list_for_test",
    "clone_module_parameter", "gen_binary_op_func", "generate_chunk_sharding_specs_for_test",
    "generate_enumerable_sharding_specs_for_test",
    "generate_local_weight_sharding_params_for_test", "with_comms",
]

TEST_GPU_NUM = 4
DEFAULT_GPU_NUM = 4
SUPPORTED_BACKENDS = ("nccl", "gloo", "mpi", "hccl", "xccl")
# Shuffled in place by each call of _chunk_sharding_specs_list_for_test, as upstream's list.
PLACEMENTS = [f"rank:{rank}/cuda:{rank}" for rank in range(DEFAULT_GPU_NUM)]


class ShardedTensorTestBase(MultiProcessTestCase):
    """Sharded-tensor tests: 4 ranks, `init_comms`/`destroy_comms`, shard comparisons."""

    @property
    def world_size(self) -> int:
        return TEST_GPU_NUM

    def init_pg(self, backend: str = "nccl") -> None:
        if backend not in SUPPORTED_BACKENDS:
            raise RuntimeError(f"Backend {backend} not supported!")
        dist.init_process_group(backend=backend, world_size=self.world_size, rank=self.rank,
                                init_method=f"file://{self.file_name}")
        if backend in ("nccl", "xccl"):
            torch.accelerator.set_device_index(self.rank)

    def init_rpc(self) -> None:
        options = rpc.TensorPipeRpcBackendOptions(_transports=tp_transports())
        options.init_method = f"file://{self.file_name}"
        for rank in range(self.world_size):
            options.set_device_map(f"worker{rank}", {rank: self.rank, self.rank: rank})
        rpc.init_rpc(name=f"worker{self.rank:d}", rank=self.rank, world_size=self.world_size,
                     rpc_backend_options=options)

    def init_comms(self, init_rpc: bool = True, backend: str = "nccl") -> None:
        if init_rpc:
            self.init_rpc()
        self.init_pg(backend=backend)

    def destroy_comms(self, destroy_rpc: bool = True) -> None:
        dist.barrier()  # every rank reaches shutdown before any leaves
        if destroy_rpc:
            rpc.shutdown()
        dist.destroy_process_group()

    def assert_sharded_tensor_equal(self, st1: ShardedTensor, st2: ShardedTensor) -> None:
        shards1, shards2 = st1.local_shards(), st2.local_shards()
        self.assertEqual(len(shards1), len(shards2))
        for shard1, shard2 in zip(shards1, shards2):
            self.assertEqual(shard1.tensor, shard2.tensor)
            self.assertEqual(shard1.metadata, shard2.metadata)
        self.assertEqual(st1.metadata(), st2.metadata())
        self.assertEqual(st1.sharding_spec(), st2.sharding_spec())
        self.assertEqual(len(st1.remote_shards()), len(st2.remote_shards()))


def _accelerators_lacking(backend: str, world_size: int) -> bool:
    """Upstream's rule: an accelerator backend needs an accelerator whose default backend it
    is, and one per rank."""
    if backend not in settings.ACCELERATOR_BACKENDS:
        return False
    accelerator = torch.accelerator.current_accelerator()
    return (
        accelerator is None
        or backend != settings.backend_for(accelerator.type)
        or torch.accelerator.device_count() < world_size
    )


def with_comms(func: Optional[Callable] = None, init_rpc: bool = True,
               backend: str = "nccl") -> Any:
    """Run the test between `init_comms` and `destroy_comms` (bare or with arguments)."""
    if func is None:
        return functools.partial(with_comms, init_rpc=init_rpc, backend=backend)

    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        if _accelerators_lacking(backend, self.world_size):
            raise unittest.SkipTest(TEST_SKIPS[f"multi-gpu-{self.world_size}"].message)
        self.init_comms(init_rpc=init_rpc, backend=backend)
        func(self, *args, **kwargs)
        self.destroy_comms(destroy_rpc=init_rpc)

    return wrapper


# ----------------------------------------------------------------- _test_st_common


def _chunk_sharding_specs_list_for_test(sharding_dims: Sequence[int],
                                        seed: int = 0) -> List[ChunkShardingSpec]:
    """One ChunkShardingSpec per dim, its placements PLACEMENTS shuffled by seed + index (in
    place: later calls start from the order earlier ones left, as upstream)."""
    specs = []
    for index, dim in enumerate(sharding_dims):
        random.Random(seed + index).shuffle(PLACEMENTS)
        specs.append(ChunkShardingSpec(dim=dim, placements=copy.deepcopy(PLACEMENTS)))
    return specs


class MyShardedModel2(nn.Module):
    def __init__(self, spec: Any = None, group: Any = None, init_rrefs: bool = True) -> None:
        super().__init__()
        self.sharded_tensor2 = None if spec is None else sharded_tensor.rand(
            spec, 10, 20, process_group=group, init_rrefs=init_rrefs)
        self.random_tensor2 = nn.Parameter(torch.rand(2, 2))


class MyShardedModel1(nn.Module):
    def __init__(self, spec: Any = None, group: Any = None, init_rrefs: bool = True) -> None:
        super().__init__()
        self.sharded_tensor1 = None if spec is None else sharded_tensor.rand(
            spec, 10, 20, process_group=group, init_rrefs=init_rrefs)
        self.random_tensor1 = nn.Parameter(torch.rand(2, 2))
        self.submodule = MyShardedModel2(spec, group, init_rrefs)


# ----------------------------------------------------------------- _test_ops_common


def _rotated_placements(first: int) -> List[str]:
    ranks = [(first + offset) % DEFAULT_GPU_NUM for offset in range(DEFAULT_GPU_NUM)]
    return [f"rank:{rank}/cuda:{rank}" for rank in ranks]


def generate_chunk_sharding_specs_for_test(sharding_dim: int) -> List[ChunkShardingSpec]:
    """Chunk specs over 4 ranks in three orders: 0-1-2-3, 2-3-0-1, 3-0-1-2."""
    return [ChunkShardingSpec(dim=sharding_dim, placements=_rotated_placements(first))
            for first in (0, 2, 3)]


def generate_enumerable_sharding_specs_for_test() -> List[EnumerableShardingSpec]:
    """One 10x10 spec of four 5x5 blocks, column-major over ranks 0-3."""
    offsets = [(0, 0), (5, 0), (0, 5), (5, 5)]
    return [EnumerableShardingSpec([
        ShardMetadata(shard_offsets=list(offset), shard_sizes=[5, 5],
                      placement=f"rank:{rank}/cuda:{rank}")
        for rank, offset in enumerate(offsets)
    ])]


def generate_local_weight_sharding_params_for_test(
    local_weight: torch.Tensor, sharded_dim: int, gpu_num: int, spec: ChunkShardingSpec,
    rank: int,
) -> Tuple[int, int]:
    """Where `rank`'s chunk of the weight starts along `sharded_dim`, and its size, as the
    spec chunks it (torch.chunk's split size)."""
    dim_size = local_weight.size(sharded_dim)
    split_size = (dim_size + gpu_num - 1) // gpu_num
    offset = start = chunk_size = 0
    for index, placement in enumerate(spec.placements):
        chunk_size = max(min(dim_size, split_size * (index + 1)) - split_size * index, 0)
        if rank == placement.rank():
            start = offset
            break
        offset += chunk_size
    return start, chunk_size


def clone_module_parameter(module: nn.Module, param_name: str) -> nn.Parameter:
    """A detached copy of `module.<param_name>` as a new Parameter."""
    return nn.Parameter(getattr(module, param_name).detach().clone())


def gen_binary_op_func(python_op: str, inplace: bool = False) -> Callable:
    """`f(lhs, rhs)` applying `python_op`: a torch function name, or an operator ("+", ...)
    applied in place when `inplace`."""
    if "torch" in python_op:
        body = f"  return {python_op}(lhs, rhs)\n"
    elif inplace:
        body = f"  lhs {python_op}= rhs\n  return lhs\n"
    else:
        body = f"  return lhs {python_op} rhs\n"
    namespace = {"torch": torch}
    exec("def f(lhs, rhs):\n" + body, namespace)  # noqa: S102 - the operator is the test's own
    return namespace["f"]


# ----------------------------------------------------------------- _shard.test_common


class SimpleMegatronLM(nn.Module):
    """Linear-GELU-Linear with accessors that read a sharded weight's local tensor."""

    def __init__(self, linear_size: Sequence[Sequence[int]], rank: Optional[int] = None,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(*linear_size[0], dtype=dtype)
        self.gelu = nn.GELU()
        self.fc2 = nn.Linear(*linear_size[1], dtype=dtype)
        if rank is not None:
            self.fc1.cuda(rank)
            self.fc2.cuda(rank)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.gelu(self.fc1(inp)))

    @staticmethod
    def _local(weight: Any) -> Any:
        return weight.local_tensor() if isinstance(weight, ShardedTensor) else weight

    def get_weights(self) -> Tuple[Any, Any]:
        return self._local(self.fc1.weight), self._local(self.fc2.weight)

    def get_biases(self) -> Tuple[Any, Any]:
        return self.fc1.bias, self.fc2.bias

    def get_weight_grads(self) -> Tuple[Any, Any]:
        return self.fc1.weight.grad, self.fc2.weight.grad

    def get_bias_grads(self) -> Tuple[Any, Any]:
        return self.fc1.bias.grad, self.fc2.bias.grad
