"""Gathering a distributed state dict into full tensors
(``torch.distributed._state_dict_utils._gather_state_dict``)."""

from __future__ import annotations

from typing import Any, Dict


def gather_state_dict(state_dict: Dict[str, Any]) -> Dict[str, Any]:
    """The state dict with every DTensor and ShardedTensor replaced by its full tensor."""
    from torch.distributed._state_dict_utils import _gather_state_dict

    return _gather_state_dict(state_dict)
