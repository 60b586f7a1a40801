"""Private ``torch.distributed`` entry points outside FSDP that the suites call as upstream does.

The default group, composable DDP and checkpointing (``_composable``), and the optimizer step in
backward: upstream's tests reach them through private names, so the migrated suites do too,
through here. Also a barrier on a group's CPU backend, for shared ranks' meeting.
"""

from __future__ import annotations

from typing import Any, List


def default_process_group() -> Any:
    """The default (WORLD) process group, as ``distributed_c10d._get_default_group`` returns it."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_group()


def composable_replicate(module: Any, **kwargs: Any) -> Any:
    """``torch.distributed._composable.replicate``: DDP in place, keeping the module's type."""
    from torch.distributed._composable import replicate

    return replicate(module, **kwargs)


def composable_checkpoint(module: Any) -> Any:
    """``torch.distributed._composable.checkpoint``: activation checkpointing applied in place."""
    from torch.distributed._composable import checkpoint

    return checkpoint(module)


def apply_optimizer_in_backward(**kwargs: Any) -> None:
    """``torch.distributed.optim._apply_optimizer_in_backward`` (optimizer step in backward)."""
    from torch.distributed.optim import _apply_optimizer_in_backward

    _apply_optimizer_in_backward(**kwargs)


def cpu_barrier(group: Any) -> None:
    """A barrier through `group`'s CPU backend (gloo), also in a group that has an accelerator
    backend too ("cpu:gloo,cuda:nccl"), where `dist.barrier` would pick the accelerator's.
    Through `ProcessGroup._get_backend`, the backend object behind one device type."""
    import torch
    from torch.distributed import BarrierOptions

    options = BarrierOptions()
    options.device = torch.device("cpu")
    group._get_backend(torch.device("cpu")).barrier(options).wait()


def live_process_groups() -> List[Any]:
    """Every process group this process created and has not destroyed (the default one
    included), from c10d's private group map; empty before any group exists."""
    import torch.distributed as dist

    if not dist.is_available():
        return []
    from torch.distributed import distributed_c10d

    return list(distributed_c10d._world.pg_map)
