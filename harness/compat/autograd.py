"""What autograd keeps on a tensor that only private attributes show.

test_misc checks that FSDP1 registered its pre-backward hooks on a forward's outputs; a tensor
lists its hooks only in ``_backward_hooks``.
"""

from __future__ import annotations

from typing import Any


def backward_hooks(tensor: Any) -> list[Any]:
    """Hooks registered on ``tensor`` with ``register_hook`` (its ``_backward_hooks``)."""
    hooks = tensor._backward_hooks
    return list(hooks.values()) if hooks else []
