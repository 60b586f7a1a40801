"""The private torch symbols the DTensor kit needs, in one place.

Upstream's DTensor tests run a second time with every rank simulated in one process
(torch.distributed._local_tensor), on a process group that does no communication (the
`fake` backend). Both are private torch machinery, as are a few hooks the DTensor test
bases and models touch (functional collectives with autograd, the sharding propagator's
lock, DTensor's RNG tracker, DTensor specs for shard-order tests). When torch moves one of
them, only this module changes.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import threading
from typing import Any, Callable, ContextManager, Iterator, List, Tuple

import torch
import torch.distributed as dist

FAKE_BACKEND = "fake"


def _local_tensor_module() -> Any:
    return importlib.import_module("torch.distributed._local_tensor")


def local_tensor_mode(world_size: int) -> ContextManager[Any]:
    """A LocalTensorMode simulating ranks 0..world_size-1 in this process."""
    return _local_tensor_module().LocalTensorMode(frozenset(range(world_size)))


def local_rank(world_size: int) -> torch.SymInt:
    """The rank as LocalTensor code sees it: one int per simulated rank (rank r -> r)."""
    node = _local_tensor_module().LocalIntNode({r: r for r in range(world_size)})
    return torch.SymInt(node)


def local_ints(value: Any) -> dict:
    """The per-rank ints behind a SymInt made by `local_rank` (or by arithmetic on it)."""
    return dict(value.node._local_ints)


def maybe_disable_local_tensor_mode() -> ContextManager[Any]:
    """Leave LocalTensorMode for the block (a no-op outside it): meshes are built outside."""
    return _local_tensor_module().maybe_disable_local_tensor_mode()


def maybe_run_for_local_tensor(func: Callable) -> Callable:
    """Wrap `func` so that under LocalTensorMode it runs once per simulated rank."""
    return _local_tensor_module().maybe_run_for_local_tensor(func)


def is_local_tensor(value: Any) -> bool:
    """Whether `value` is exactly a LocalTensor (one tensor per simulated rank)."""
    return type(value) is _local_tensor_module().LocalTensor


def is_functional_tensor(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is a functionalization wrapper (DTensor cannot hold one)."""
    return bool(torch._is_functional_tensor(tensor))


def _create_fake_pg(common_opts: Any, backend_opts: Any) -> Any:
    fake_pg = torch._C._distributed_c10d.FakeProcessGroup
    return fake_pg._create_internal(common_opts.group_rank, common_opts.group_size, backend_opts)


def register_fake_backend() -> None:
    """Make `init_process_group("fake", ...)` work without importing PyTorch's test utilities.

    torch registers its fake backend only when its private test module is imported;
    registering again under the same name is what that module does too, so either order
    is fine.
    """
    if FAKE_BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(
        FAKE_BACKEND, _create_fake_pg, extended_api=True, devices=["cpu", "cuda", "hpu", "xpu"]
    )


def init_fake_process_group(world_size: int, rank: int = 0) -> Any:
    """A default group of `world_size` ranks, this process as `rank`, that communicates nothing
    (also upstream's `fake_pg=True` ranks)."""
    register_fake_backend()
    dist.init_process_group(
        FAKE_BACKEND, rank=rank, world_size=world_size, store=dist.HashStore()
    )
    return dist.group.WORLD


def set_record_function_enabled(enabled: bool) -> None:
    """Turn autograd's record_function on or off (LocalTensor tests run with it off)."""
    torch.autograd._enable_record_function(enabled)


def reset_dtensor_rng_tracker() -> None:
    """Forget DTensor's RNG tracker so the next test seeds its own (upstream's tearDown)."""
    importlib.import_module("torch.distributed.tensor._random")._rng_tracker = None


def reset_dynamo() -> None:
    """Drop torch.compile caches between LocalTensor tests, as upstream does."""
    importlib.import_module("torch._dynamo").reset()


@contextlib.contextmanager
def thread_safe_sharding_propagation() -> Iterator[None]:
    """Give DTensor's sharding propagator a real lock while rank threads share it."""
    propagator = importlib.import_module("torch.distributed.tensor._sharding_prop")
    cls = propagator.ShardingPropagator
    if not hasattr(cls, "_fake_mode_lock"):  # an older torch (2.11 has none): nothing to replace
        yield
        return
    original = cls._fake_mode_lock
    cls._fake_mode_lock = threading.Lock()
    try:
        yield
    finally:
        cls._fake_mode_lock = original


def tree_flatten(tree: Any) -> Tuple[List[Any], Any]:
    """torch's pytree flatten (leaves, spec): it knows torch's containers, unlike a generic one."""
    return importlib.import_module("torch.utils._pytree").tree_flatten(tree)


def tree_unflatten(leaves: List[Any], spec: Any) -> Any:
    """The inverse of `tree_flatten`."""
    return importlib.import_module("torch.utils._pytree").tree_unflatten(leaves, spec)


def _functional_collectives() -> Any:
    return importlib.import_module("torch.distributed._functional_collectives")


# What an async functional collective returns (e.g. `redistribute(..., async_op=True)`
# then `to_local()`): tests compare `type(out)` against it.
AsyncCollectiveTensor: type = _functional_collectives().AsyncCollectiveTensor


def all_gather_along_dim0(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """All-gather along dim 0 with autograd (backward reduce-scatters), waited on."""
    gathered = _functional_collectives().all_gather_single_autograd(
        tensor, gather_dim=0, group=group
    )
    return torch.ops._c10d_functional.wait_tensor(gathered)


def reduce_scatter_sum_along_dim0(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """Reduce-scatter (sum) along dim 0 with autograd (backward all-gathers), waited on."""
    scattered = _functional_collectives().reduce_scatter_single_autograd(
        tensor, "sum", scatter_dim=0, group=group
    )
    return torch.ops._c10d_functional.wait_tensor(scattered)


def concatenate_meshes(meshes: List[Any]) -> Any:
    """One DeviceMesh spanning the given meshes' dims (e.g. an (ep, tp) mesh from ep and tp)."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh._concatenate(meshes)



# --- DTensor shard order (upstream's test helpers until redistribute takes a shard_order) ---


def shard_order_entry(tensor_dim: int, mesh_dims: Tuple[int, ...]) -> Any:
    """One entry of a DTensor shard order: `tensor_dim` sharded over `mesh_dims`, in order."""
    spec = importlib.import_module("torch.distributed.tensor._dtensor_spec")
    return spec.ShardOrderEntry(tensor_dim=tensor_dim, mesh_dims=tuple(mesh_dims))


def redistribute_to_shard_order(
    dtensor: Any, mesh: Any, placements: Tuple[Any, ...], shard_order: Any,
    use_graph_based_transform: bool = True,
) -> Any:
    """`dtensor` moved to `placements` applied in `shard_order` (forward only)."""
    from torch.distributed.tensor import DTensor

    old_spec = dtensor._spec
    new_spec = copy.deepcopy(old_spec)
    new_spec.placements = placements
    new_spec.shard_order = shard_order if shard_order is not None else ()
    if old_spec == new_spec:
        return dtensor
    redistribute = importlib.import_module("torch.distributed.tensor._redistribute")
    local = redistribute.redistribute_local_tensor(
        dtensor.to_local(), old_spec, new_spec,
        use_graph_based_transform=use_graph_based_transform,
    )
    result = DTensor.from_local(local, mesh)
    result._spec = copy.deepcopy(new_spec)
    return result


def use_explicit_shard_order(dtensor: Any) -> None:
    """Make `dtensor`'s spec keep an explicit shard order instead of deriving it from
    strided shards, so a later redistribute can set the order."""
    dtensor._spec.use_strided_shard_as_shard_order = False
    dtensor._spec.__post_init__()


def tree_leaves(tree: Any) -> List[Any]:
    """The leaves of a pytree, in `tree_flatten` order."""
    return importlib.import_module("torch.utils._pytree").tree_leaves(tree)


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """`tree` with every leaf replaced by fn(leaf)."""
    return importlib.import_module("torch.utils._pytree").tree_map(fn, tree)


@contextlib.contextmanager
def op_strategy_context(
    op_overload: Any, strategy_func: Callable, schema_info: Any = None
) -> Iterator[None]:
    """Register `strategy_func` as DTensor's sharding strategy for `op_overload` for the block,
    then put back whatever was registered before (and clear the sharding cache)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    register_op_strategy = importlib.import_module(
        "torch.distributed.tensor._ops.utils"
    ).register_op_strategy
    propagator = DTensor._op_dispatcher.sharding_propagator
    saved_func = propagator.op_strategy_funcs.pop(op_overload, None)
    saved_schema = propagator.op_to_schema_info.pop(op_overload, None)
    try:
        register_op_strategy(op_overload, schema_info=schema_info)(strategy_func)
        yield
    finally:
        propagator.op_strategy_funcs.pop(op_overload, None)
        propagator.op_to_schema_info.pop(op_overload, None)
        if saved_func is not None:
            propagator.op_strategy_funcs[op_overload] = saved_func
        if saved_schema is not None:
            propagator.op_to_schema_info[op_overload] = saved_schema
        _clear_sharding_prop_cache()
