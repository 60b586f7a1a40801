"""FSDP1 (``FullyShardedDataParallel``) internals: flat parameters, their handles and runtime.

The FSDP1 base, the models and the suites that check *what FSDP1 did* (which handles are
resharded, which hooks ran, what the nested instances agreed on) read them through these
functions, so that a torch release that moves one breaks one function here.
"""

from __future__ import annotations

import contextlib
from importlib import import_module
from typing import Any, Iterator, Tuple


def runtime_module() -> Any:
    """FSDP1's runtime hooks module (``_runtime_utils``), which delay and fault patches reach."""
    return import_module("torch.distributed.fsdp._runtime_utils")


def no_reshard_after_forward_strategies() -> Tuple[Any, ...]:
    """Sharding strategies that keep parameters unsharded after forward (``_init_utils``)."""
    from torch.distributed.fsdp import _init_utils

    return tuple(_init_utils.NO_RESHARD_AFTER_FORWARD_STRATEGIES)


def assert_idle(fsdp_model: Any) -> None:
    """Raise unless an FSDP1 root is back in its IDLE training state (after a full step)."""
    from torch.distributed.fsdp._common_utils import TrainingState

    fsdp_model._assert_state(TrainingState.IDLE)


def handles(module: Any) -> list[Any]:
    """Every ``FlatParamHandle`` in ``module``'s tree (``_traversal_utils``)."""
    from torch.distributed.fsdp import _traversal_utils

    return list(_traversal_utils._get_fsdp_handles(module))


def flat_param(fsdp_module: Any) -> Any:
    """The ``FlatParameter`` an FSDP1 instance manages itself, or None when it manages none."""
    handle = fsdp_module._handle
    return handle.flat_param if handle is not None else None


def flat_param_resharded(fsdp_module: Any) -> Tuple[bool, int, bool] | None:
    """Facts that say whether an FSDP1 instance is resharded, or None when it has no handle.

    Returns ``(uses_sharded_strategy, unsharded_storage_size, points_at_local_shard)``: the
    padded unsharded buffer's storage size (0 once freed; 0 also for ``NO_SHARD``, which
    has none) and whether the flat parameter's data is its local shard.
    """
    handle = fsdp_module._handle
    if handle is None:
        return None
    param = handle.flat_param
    sharded = bool(handle.uses_sharded_strategy)
    storage = param._full_param_padded.untyped_storage().size() if sharded else 0
    return sharded, storage, param.data_ptr() == param._local_shard.data_ptr()


def unsharded_handles(module: Any) -> list[str]:
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
def record_post_backward_reshards() -> Iterator[list[Any]]:
    """Record every FSDP1 post-backward reshard (one list entry, the FlatParamHandle, per call).

    FSDP1 reshards each handle in the post-backward through
    ``_runtime_utils._post_backward_reshard``, both for flat parameters that require gradients
    and for frozen ones (through the reshard-only hook); the end-of-backward catch-all reshard
    does not go through it.
    """
    runtime = runtime_module()
    calls: list[Any] = []
    orig = runtime._post_backward_reshard

    def recording(state: Any, handle: Any, *args: Any) -> Any:
        calls.append(handle)
        return orig(state, handle, *args)

    runtime._post_backward_reshard = recording
    try:
        yield calls
    finally:
        runtime._post_backward_reshard = orig


def unsafe_setattr_env() -> str:
    """Env var that makes FSDP1 bypass ``nn.Module.__setattr__`` (``_flat_param``)."""
    from torch.distributed.fsdp._flat_param import _FSDP_USE_UNSAFE_SETATTR

    return _FSDP_USE_UNSAFE_SETATTR


def full_prec_in_eval_env() -> str:
    """Env var that makes FSDP1 run eval in full precision (``_flat_param``)."""
    from torch.distributed.fsdp._flat_param import _FSDP_USE_FULL_PREC_IN_EVAL

    return _FSDP_USE_FULL_PREC_IN_EVAL


def homogeneous_attr_names() -> Tuple[str, ...]:
    """State attributes that must agree across nested FSDP1 instances (``_runtime_utils``)."""
    return tuple(runtime_module().HOMOGENEOUS_ATTR_NAMES)


def hybrid_shard_zero2() -> Any:
    """``ShardingStrategy._HYBRID_SHARD_ZERO2``: hybrid sharding that keeps params unsharded."""
    from torch.distributed.fsdp import ShardingStrategy

    return ShardingStrategy._HYBRID_SHARD_ZERO2
