"""FSDP2 (``fully_shard``) internals: its parameter groups and their autograd post-backward.

The FSDP helpers and suites patch these to see what ``fully_shard`` does (all-gathers,
reduce-scatters, reshards, where the post-backward runs). Their package moved in torch 2.6
(``_composable.fsdp`` to ``fsdp._fully_shard``); each lookup tries both.
"""

from __future__ import annotations

from typing import Any

from harness.compat.lookup import first_attr

_PACKAGES = ("fsdp._fully_shard", "_composable.fsdp")  # torch >= 2.6, older


def param_group_module() -> Any:
    """The param-group module, whose ``foreach_all_gather``/``foreach_reduce`` globals the
    param group calls (patching them there is what reaches FSDP2)."""
    return first_attr(
        [(f"torch.distributed.{package}", "_fsdp_param_group") for package in _PACKAGES]
    )


def param_group_class() -> type:
    """``FSDPParamGroup`` (its ``unshard``/``reshard``/``post_backward``)."""
    return param_group_module().FSDPParamGroup


def register_post_backward_function() -> type:
    """The autograd Function whose backward runs a param group's post-backward."""
    return first_attr(
        [
            (f"torch.distributed.{package}._fsdp_param_group", "RegisterPostBackwardFunction")
            for package in _PACKAGES
        ]
    )
