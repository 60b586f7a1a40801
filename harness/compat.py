"""The one place that touches private torch symbols.

Private names move between torch releases; each lookup below says what it is for and
tries the locations known for this torch (2.13) and earlier ones, so a move breaks
one function here instead of every suite.
"""

from __future__ import annotations

import contextlib
from importlib import import_module
from typing import Any, Iterator, Sequence, Tuple


def first_attr(candidates: Sequence[Tuple[str, str]]) -> Any:
    """The first `module.attr` of `candidates` that exists; ImportError naming all tried."""
    for module_name, attr in candidates:
        try:
            module = import_module(module_name)
        except ImportError:
            continue
        if hasattr(module, attr):
            return getattr(module, attr)
    tried = ", ".join(f"{m}.{a}" for m, a in candidates)
    raise ImportError(f"none of these exist in this torch: {tried}")


# --- fsdp helpers ---
# Where FSDP's private pieces live in this torch. The FSDP helpers, the FSDP suites and the
# strictness test reach them only through these functions.


def fsdp_reduce_scatter_name() -> str:
    """Name of the ``torch.distributed`` function FSDP calls to reduce-scatter gradients.

    Both FSDP1 and ``fully_shard`` call ``dist.reduce_scatter_single`` in this torch; older
    releases called ``dist.reduce_scatter_tensor``. Patching anything else has no effect.
    """
    import torch.distributed as dist

    if hasattr(dist, "reduce_scatter_single"):
        return "reduce_scatter_single"
    return "reduce_scatter_tensor"


def register_post_backward_function() -> type:
    """``fully_shard``'s autograd Function whose backward runs a param group's post-backward."""
    return first_attr(
        [
            (f"torch.distributed.{package}._fsdp_param_group", "RegisterPostBackwardFunction")
            for package in ("fsdp._fully_shard", "_composable.fsdp")  # torch >= 2.6, older
        ]
    )


def composable_replicate(module: Any, **kwargs: Any) -> Any:
    """``torch.distributed._composable.replicate``: DDP in place, keeping the module's type."""
    from torch.distributed._composable import replicate

    return replicate(module, **kwargs)


def composable_checkpoint(module: Any) -> Any:
    """``torch.distributed._composable.checkpoint``: activation checkpointing applied in place."""
    from torch.distributed._composable import checkpoint

    return checkpoint(module)


def fsdp1_unsharded_handles(module: Any) -> list[str]:
    """Names of FSDP1 instances under ``module`` whose sharded flat parameter is unsharded now.

    A handle counts as unsharded when its padded unsharded storage is allocated or its flat
    parameter does not point at the local shard. ``NO_SHARD`` handles never count.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel

    names = []
    for name, sub in module.named_modules():
        handle = sub._handle if isinstance(sub, FullyShardedDataParallel) else None
        if handle is None or not handle.uses_sharded_strategy:
            continue
        if not handle.needs_unshard() or not handle.is_sharded(handle.flat_param):
            names.append(name or "<root>")
    return names


@contextlib.contextmanager
def record_fsdp1_post_backward_reshards() -> Iterator[list[Any]]:
    """Record every FSDP1 post-backward reshard (one list entry, the FlatParamHandle, per call).

    FSDP1 reshards each handle in the post-backward through
    ``_runtime_utils._post_backward_reshard``, both for flat parameters that require gradients
    and for frozen ones (through the reshard-only hook); the end-of-backward catch-all reshard
    does not go through it.
    """
    from torch.distributed.fsdp import _runtime_utils

    calls: list[Any] = []
    orig = _runtime_utils._post_backward_reshard

    def recording(state: Any, handle: Any, *args: Any) -> Any:
        calls.append(handle)
        return orig(state, handle, *args)

    _runtime_utils._post_backward_reshard = recording
    try:
        yield calls
    finally:
        _runtime_utils._post_backward_reshard = orig


def fsdp1_exec_order_class() -> type:
    """FSDP1's execution-order bookkeeping (its ``_check_order`` validates the forward order)."""
    from torch.distributed.fsdp._exec_order_utils import _ExecOrderData

    return _ExecOrderData
