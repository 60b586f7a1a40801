"""Unsharded gradients of an FSDP1 model, for parity tests that must see gradients.

A parity test that compares only losses after Adam steps cannot see a wrongly scaled gradient
(Adam's update is nearly invariant to the gradient's scale), so the FSDP suites also compare the
reduced gradients with their reference after each backward. ``FSDP.summon_full_params(...,
with_grads=True)`` supports only ``use_orig_params=True`` without CPU offload; the helpers here
work for every FSDP1 configuration with public API only: they put each sharded gradient in place
of its parameter shard, let ``summon_full_params`` gather it, and restore the parameters.
Only the sharded gradients FSDP leaves after a synchronising backward are understood (not the
unsharded ones it accumulates under ``no_sync``).
"""

from __future__ import annotations

import unittest
from typing import Collection, Dict, List, Optional

import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

__all__ = ["assert_fsdp1_grads_equal", "fsdp1_full_grads", "named_grads"]


@torch.no_grad()
def _gather_in_place_of_params(
    fsdp_module: nn.Module, shards: List[torch.Tensor], values: List[torch.Tensor]
) -> Dict[str, torch.Tensor]:
    """Write ``values`` into the local parameter ``shards``, then read every unsharded parameter."""
    for shard, value in zip(shards, values):
        shard.copy_(value)
    with FSDP.summon_full_params(fsdp_module, writeback=False):
        return {name: full.detach().clone() for name, full in fsdp_module.named_parameters()}


@torch.no_grad()
def fsdp1_full_grads(fsdp_module: nn.Module) -> Dict[str, Optional[torch.Tensor]]:
    """Every parameter's unsharded gradient (None where it has none), by its unwrapped name.

    Collective: every rank of the module's process group must call it. Call it between backward
    and the optimizer step; parameters and gradients are left as they were.

    The gradient shards are gathered twice, the second time plus one: a parameter whose gathered
    value did not change has no gradient. This also covers a SHARD_GRAD_OP flat parameter that
    no gradient reached: FSDP keeps its stale unsharded copy and gathers nothing for it.
    Gradient-less shards are filled with NaN, so that a NaN in the result also means "none".
    """
    if not isinstance(fsdp_module, FSDP):
        raise TypeError(f"fsdp1_full_grads needs an FSDP1 module, got {type(fsdp_module).__name__}")
    # Flat parameters (use_orig_params=False) or views into them (True): this rank's shard
    shards = [param for param in fsdp_module.parameters() if param.numel() > 0]
    saved = [shard.detach().clone() for shard in shards]
    grads = [
        shard.grad if shard.grad is not None else torch.full_like(shard, torch.nan)
        for shard in shards
    ]
    for shard, grad in zip(shards, grads):
        if grad.shape != shard.shape:
            raise ValueError(
                f"fsdp1_full_grads: a gradient of shape {tuple(grad.shape)} on a parameter shard "
                f"of shape {tuple(shard.shape)} (call it after a synchronising backward, not "
                "inside no_sync)"
            )
    try:
        first = _gather_in_place_of_params(fsdp_module, shards, grads)
        second = _gather_in_place_of_params(fsdp_module, shards, [grad + 1 for grad in grads])
    finally:
        for shard, data in zip(shards, saved):
            shard.copy_(data)
    return {
        name: None if full.isnan().all() or torch.equal(full, second[name]) else full
        for name, full in first.items()
    }


def assert_fsdp1_grads_equal(
    test: unittest.TestCase,
    fsdp_module: nn.Module,
    expected: Dict[str, Optional[torch.Tensor]],
    *,
    skip: Collection[str] = (),
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    msg: str = "",
) -> None:
    """Check that ``fsdp_module``'s unsharded gradients equal ``expected`` (name -> gradient).

    Names must match (``skip`` names are left out on both sides); a gradient present on one side
    only is a mismatch. ``msg`` starts every failure message. Collective, like
    ``fsdp1_full_grads``.
    """
    prefix = f"{msg}: " if msg else ""
    grads = {n: g for n, g in fsdp1_full_grads(fsdp_module).items() if n not in skip}
    expected = {n: g for n, g in expected.items() if n not in skip}
    test.assertEqual(sorted(grads), sorted(expected), msg=f"{prefix}parameter names differ")
    for name, grad in grads.items():
        if expected[name] is None:
            test.assertIsNone(grad, msg=f"{prefix}{name} has a gradient its reference lacks")
            continue
        test.assertIsNotNone(grad, msg=f"{prefix}{name} has no gradient, its reference has one")
        test.assertEqual(
            grad, expected[name].to(grad.device), atol=atol, rtol=rtol, msg=f"{prefix}{name}.grad"
        )


def named_grads(module: nn.Module) -> Dict[str, Optional[torch.Tensor]]:
    """``module``'s gradients by parameter name (the reference side of a comparison)."""
    return {name: param.grad for name, param in module.named_parameters()}
