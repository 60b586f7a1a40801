"""Helpers the FSDP suites use to compare, inspect and intercept FSDP.

They exist so that a suite can check *what FSDP did*, not only that it ran: that every rank holds
the same module state, that a sharded module matches a replicated reference shard by shard, that
gradient reduce-scatters carry the expected number of elements, and that ``fully_shard``'s
post-backward runs inside autograd. Patches are applied to what FSDP really calls in this torch
(``harness.compat`` knows where that is), and every patch is undone on exit.
"""

from __future__ import annotations

import contextlib
import unittest
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from harness import compat

__all__ = [
    "assert_module_states",
    "_assert_module_states",
    "check_sharded_parity",
    "patch_reduce_scatter",
    "patch_register_post_backward_hook_backward",
    "reduce_scatter_with_assert",
]


def assert_module_states(
    model: nn.Module,
    process_group: dist.ProcessGroup,
    assert_fn: Callable[[torch.Tensor, torch.Tensor], Any],
) -> None:
    """Check that every rank holds the same parameters and buffers as rank 0.

    Each rank's named parameters and buffers are gathered (as CPU tensors) to every rank, then
    ``assert_fn(rank0_tensor, rank_r_tensor)`` is called for every other rank ``r``. Names must
    match too, so ranks with differently structured modules fail instead of being zipped short.
    """
    if not callable(assert_fn):
        raise TypeError(f"assert_module_states: assert_fn must be callable, got {assert_fn!r}")
    local = [
        (name, tensor.detach().cpu())
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]
    ]
    world_size = dist.get_world_size(process_group)
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, local, group=process_group)
    reference = gathered[0]
    for rank in range(1, world_size):
        other = gathered[rank]
        ref_names = [name for name, _ in reference]
        other_names = [name for name, _ in other]
        if ref_names != other_names:
            raise AssertionError(
                f"module state names differ between rank 0 and rank {rank}: "
                f"{ref_names} vs {other_names}"
            )
        for (_, ref_tensor), (_, tensor) in zip(reference, other):
            assert_fn(ref_tensor, tensor)


_assert_module_states = assert_module_states


def _expected_local_shard(full: torch.Tensor, sharded: DTensor) -> torch.Tensor:
    """The part of ``full`` that ``sharded``'s placements put on this rank (torch.chunk layout)."""
    mesh = sharded.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ValueError("check_sharded_parity: this rank is not part of the parameter's mesh")
    local = full
    for mesh_dim, placement in enumerate(sharded.placements):
        if isinstance(placement, Replicate):
            continue
        if not isinstance(placement, Shard):
            raise ValueError(f"check_sharded_parity: unsupported placement {placement!r}")
        chunks = torch.chunk(local, mesh.size(mesh_dim), dim=placement.dim)
        index = coordinate[mesh_dim]
        local = chunks[index] if index < len(chunks) else local.narrow(placement.dim, 0, 0)
    return local


def check_sharded_parity(
    cls: unittest.TestCase,
    replicated_module: nn.Module,
    sharded_module: nn.Module,
    prefixes_to_ignore: Iterable[str] = (),
) -> None:
    """Check that ``sharded_module`` (``fully_shard``) matches ``replicated_module`` shard by shard.

    Parameter names must correspond (after removing ``prefixes_to_ignore`` from the replicated
    names), every sharded parameter must be a DTensor, and its local shard and local gradient
    shard must equal the matching slice of the replicated parameter and gradient. A gradient
    present on one side only is a mismatch. No collectives are issued.
    """
    replicated = list(replicated_module.named_parameters())
    sharded = list(sharded_module.named_parameters())
    if len(replicated) != len(sharded):
        raise AssertionError(
            f"check_sharded_parity: {len(replicated)} replicated parameters but "
            f"{len(sharded)} sharded parameters"
        )
    for (name, param), (sharded_name, sharded_param) in zip(replicated, sharded):
        clean_name = name
        for prefix in prefixes_to_ignore:
            clean_name = clean_name.replace(prefix, "")
        cls.assertEqual(clean_name, sharded_name)
        if not isinstance(sharded_param, DTensor):
            raise AssertionError(
                f"check_sharded_parity: {sharded_name} is a {type(sharded_param).__name__}, "
                "not a DTensor (is the module sharded, and resharded?)"
            )
        expected = _expected_local_shard(param.detach(), sharded_param)
        cls.assertEqual(sharded_param.to_local().detach(), expected, msg=sharded_name)
        if param.grad is None:
            cls.assertIsNone(sharded_param.grad, msg=f"{sharded_name} has an unexpected gradient")
            continue
        cls.assertIsNotNone(sharded_param.grad, msg=f"{sharded_name} is missing its gradient")
        expected_grad = _expected_local_shard(param.grad, sharded_param)
        cls.assertEqual(sharded_param.grad.to_local(), expected_grad, msg=f"{sharded_name}.grad")


def _barrier_if_initialized() -> None:
    """Keep ranks in step around a patch (threaded ranks share the patched module)."""
    if dist.is_initialized():
        dist.barrier()


@contextlib.contextmanager
def patch_reduce_scatter(new_reduce_scatter: Callable[..., Any]) -> Iterator[None]:
    """Replace the reduce-scatter that FSDP calls for gradients by ``new_reduce_scatter``.

    ``new_reduce_scatter`` receives FSDP's arguments unchanged (``output``, ``input``, ``op``,
    ``group``, ``async_op``; positionally or by keyword). The original is restored on exit.
    """
    if not callable(new_reduce_scatter):
        raise TypeError(f"patch_reduce_scatter: expected a callable, got {new_reduce_scatter!r}")
    name = compat.fsdp_reduce_scatter_name()
    original = getattr(dist, name)
    _barrier_if_initialized()
    setattr(dist, name, new_reduce_scatter)
    try:
        yield
    finally:
        _barrier_if_initialized()
        setattr(dist, name, original)


@contextlib.contextmanager
def patch_register_post_backward_hook_backward(new_backward: Callable[..., Any]) -> Iterator[None]:
    """Replace the backward of ``fully_shard``'s post-backward autograd Function.

    ``new_backward(ctx, *grads)`` runs whenever autograd reaches a parameter group's
    post-backward (as opposed to the end-of-backward callback); it usually counts and then
    calls the original. The original is restored on exit.
    """
    if not callable(new_backward):
        raise TypeError(
            f"patch_register_post_backward_hook_backward: expected a callable, got {new_backward!r}"
        )
    function_cls = compat.register_post_backward_function()
    original = function_cls.__dict__["backward"]
    _barrier_if_initialized()
    function_cls.backward = staticmethod(new_backward)
    try:
        yield
    finally:
        _barrier_if_initialized()
        function_cls.backward = original


def reduce_scatter_with_assert(
    cls: unittest.TestCase,
    orig_reduce_scatter: Callable[..., Any],
    assert_fn: Callable[[torch.Tensor], Any],
    output: torch.Tensor,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """Run ``assert_fn(output)`` on a reduce-scatter's output, then the real reduce-scatter.

    Meant for ``functools.partial(reduce_scatter_with_assert, self, orig, assert_fn)`` passed to
    :func:`patch_reduce_scatter`; ``cls`` is the running test case (upstream signature).
    """
    if not isinstance(output, torch.Tensor):
        raise TypeError(
            f"reduce_scatter_with_assert ({type(cls).__name__}): output must be a tensor, "
            f"got {type(output).__name__}"
        )
    assert_fn(output)
    return orig_reduce_scatter(output, *args, **kwargs)
