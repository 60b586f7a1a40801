"""What a wrapper tensor subclass needs from torch's private modules: building the wrapper
(``Tensor._make_wrapper_subclass``), mapping over nested arguments (``torch.utils._pytree``),
fixing the aliasing of an op's outputs (``torch.utils._python_dispatch``), and marking the
constructor for Dynamo and export."""

from __future__ import annotations

from typing import Any, Callable, List, Tuple

import torch


def make_wrapper(cls: type, like: torch.Tensor, shape: Any, strides: Any,
                 requires_grad: bool) -> torch.Tensor:
    """A wrapper tensor of class `cls` with `like`'s dtype, device, layout and offset."""
    return torch.Tensor._make_wrapper_subclass(
        cls, shape, strides=strides, storage_offset=like.storage_offset(), device=like.device,
        layout=like.layout, requires_grad=requires_grad, dtype=like.dtype)


def map_only(kind: type, fn: Callable[[Any], Any], tree: Any) -> Any:
    """`tree` with every leaf of type `kind` replaced by fn(leaf)."""
    from torch.utils import _pytree

    return _pytree.tree_map_only(kind, fn, tree)


def flatten(tree: Any) -> Tuple[List[Any], Any]:
    from torch.utils import _pytree

    return _pytree.tree_flatten(tree)


def unflatten(leaves: List[Any], spec: Any) -> Any:
    from torch.utils import _pytree

    return _pytree.tree_unflatten(leaves, spec)


def correct_aliasing(func: Any, args: Any, kwargs: Any, out: Any) -> Any:
    """The op's outputs made to alias its inputs as the op's schema says (views, in-place)."""
    from torch._higher_order_ops.cond import cond_op
    from torch.utils._python_dispatch import return_and_correct_aliasing

    if func is cond_op:
        return out
    return return_and_correct_aliasing(func, args, kwargs, out)


def subclass_constructor(init: Callable) -> Callable:
    """A subclass `__init__` Dynamo does not trace and export may treat as a constructor."""
    from torch._export.wrappers import mark_subclass_constructor_exportable_experimental

    return torch._disable_dynamo(mark_subclass_constructor_exportable_experimental(init))
