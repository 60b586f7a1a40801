"""Which public ``torch.distributed`` collectives FSDP (FSDP1 and ``fully_shard``) calls.

The names changed between torch releases; patching a name FSDP no longer calls has no effect,
so a helper that intercepts FSDP's communication asks here which one to patch.
"""

from __future__ import annotations

import torch.distributed as dist


def reduce_scatter_name() -> str:
    """The function FSDP calls to reduce-scatter gradients.

    Both FSDP1 and ``fully_shard`` call ``dist.reduce_scatter_single`` in this torch; older
    releases called ``dist.reduce_scatter_tensor``.
    """
    if hasattr(dist, "reduce_scatter_single"):
        return "reduce_scatter_single"
    return "reduce_scatter_tensor"


def all_gather_name() -> str:
    """The function FSDP1 calls to all-gather flat parameters.

    ``dist.all_gather_single`` in this torch; older releases called
    ``dist.all_gather_into_tensor``.
    """
    if hasattr(dist, "all_gather_single"):
        return "all_gather_single"
    return "all_gather_into_tensor"
