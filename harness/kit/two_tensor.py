"""Upstream's `two_tensor.TwoTensor`: a tensor subclass that holds two tensors of the same
metadata and runs every op on both, the simplest subclass for testing that FSDP, DTensor and
compile carry subclasses through (flatten/unflatten, dispatch, aliasing)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from harness.compat.tensor_subclass import (
    correct_aliasing,
    flatten,
    make_wrapper,
    map_only,
    subclass_constructor,
    unflatten,
)

__all__ = ["TwoTensor"]


class TwoTensor(torch.Tensor):
    """Two tensors `a` and `b`, seen as one with `a`'s metadata (size, stride, dtype...)."""

    a: torch.Tensor
    b: torch.Tensor

    @staticmethod
    def __new__(cls, a: torch.Tensor, b: torch.Tensor, outer_size: Any = None,
                outer_stride: Any = None, *, requires_grad: Optional[bool] = None) -> Any:
        same = (a.device == b.device and a.layout == b.layout
                and a.requires_grad == b.requires_grad and a.dtype == b.dtype)
        if not same:
            raise AssertionError(
                "Expected a and b to have same device, layout, requires_grad, and dtype")
        wrapper = make_wrapper(cls, a, a.size() if outer_size is None else outer_size,
                               a.stride() if outer_stride is None else outer_stride,
                               bool(requires_grad or a.requires_grad))
        if a.shape != b.shape:
            raise AssertionError(f"Expected a.shape == b.shape, got {a.shape} != {b.shape}")
        if a.stride() != b.stride():
            raise AssertionError(
                f"Expected a.stride() == b.stride(), got {a.stride()} != {b.stride()}")
        if a.storage_offset() != b.storage_offset():
            raise AssertionError(
                "Expected a.storage_offset() == b.storage_offset(), "
                f"got {a.storage_offset()} != {b.storage_offset()}")
        return wrapper

    @subclass_constructor
    def __init__(self, a: torch.Tensor, b: torch.Tensor, outer_size: Any = None,
                 outer_stride: Any = None, *, requires_grad: Optional[bool] = None) -> None:
        self.a = a
        self.b = b

    def __repr__(self) -> str:  # type: ignore[override]
        return f"TwoTensor({self.a!r}, {self.b!r})"

    def __tensor_flatten__(self) -> Tuple[List[str], None]:
        return ["a", "b"], None

    @staticmethod
    def __tensor_unflatten__(inner_tensors: Dict[str, torch.Tensor], meta: Any,
                             outer_size: Any, outer_stride: Any) -> TwoTensor:
        if meta is not None:
            raise AssertionError("Expected meta to be None")
        a, b = inner_tensors["a"], inner_tensors["b"]
        if type(a) is torch.Tensor and (outer_size is None or outer_stride is None):
            raise AssertionError("Expected outer_size and outer_stride to not be None")
        return TwoTensor(a, b, outer_size, outer_stride)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        outs = []
        for part in ("a", "b"):
            part_args = map_only(TwoTensor, lambda t, p=part: getattr(t, p), args)
            part_kwargs = map_only(TwoTensor, lambda t, p=part: getattr(t, p), kwargs)
            outs.append(func(*part_args, **part_kwargs))
        leaves_a, spec = flatten(outs[0])
        leaves_b, _ = flatten(outs[1])
        if len(leaves_a) != len(leaves_b):
            raise AssertionError("the two tensors' results differ in structure")
        # non-tensor results (sizes, flags) are taken from `a`: both sides agree on them
        leaves = [cls(x, y) if isinstance(x, torch.Tensor) else x
                  for x, y in zip(leaves_a, leaves_b)]
        return correct_aliasing(func, args, kwargs, unflatten(leaves, spec))

    def get_elem_a(self) -> torch.Tensor:
        return self.a
