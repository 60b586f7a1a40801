"""Comparing two tensors whose classes are unrelated subclasses of torch.Tensor; the default
tolerances of a pair of tensors; assert_close's DTensor check made to wait for DTensor.

`torch.testing.assert_close` refuses such a pair (say an AsyncCollectiveTensor against a
LocalTensor); upstream's `assertEqual` compares them by value. Doing the same needs
torch's comparison machinery with a relaxed input check, which is private, so it is here.

Importing this module also replaces `torch.testing._comparison._unwrap_dtensor_for_comparison`
(for the whole process) by one that does nothing until torch.distributed.tensor is imported:
torch imports that module on every assert_close, over a second in each fresh rank.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Tuple

import torch
from torch.testing import _comparison
from torch.testing._comparison import (
    BooleanPair,
    NonePair,
    NumberPair,
    TensorLikePair,
    not_close_error_metas,
)


class _AnyTensorPair(TensorLikePair):
    """TensorLikePair that accepts any two tensors, whatever their subclasses."""

    def _process_inputs(
        self, actual: Any, expected: Any, *, id: tuple, allow_subclasses: bool
    ) -> tuple:
        if not (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)):
            self._inputs_not_supported()
        actual, expected = _plain_unless_dispatching(actual), _plain_unless_dispatching(expected)
        for tensor in (actual, expected):
            self._check_supported(tensor, id=id)
        return actual, expected


def _plain_unless_dispatching(tensor: torch.Tensor) -> torch.Tensor:
    """A subclass that only inherits torch.Tensor's dispatch is compared as a plain tensor.

    Ops mixing two such unrelated classes have no handler; a class with its own
    __torch_function__ / __torch_dispatch__ (LocalTensor, AsyncCollectiveTensor) keeps it.
    """
    hooks = ("__torch_function__", "__torch_dispatch__")
    own = [k for k in type(tensor).__mro__ if issubclass(k, torch.Tensor) and k is not torch.Tensor]
    if any(hook in vars(k) for k in own for hook in hooks):
        return tensor
    return tensor.as_subclass(torch.Tensor)


def unrelated_tensors_mismatch(
    actual: torch.Tensor, expected: torch.Tensor, **options: Any
) -> Optional[str]:
    """Why two tensors of unrelated subclasses differ (assert_close's options), or None."""
    metas = not_close_error_metas(
        actual, expected, pair_types=(NonePair, BooleanPair, NumberPair, _AnyTensorPair),
        **options,
    )
    return str(metas[0].to_error()) if metas else None


def default_tolerances(actual: torch.Tensor, expected: torch.Tensor) -> Tuple[float, float]:
    """(rtol, atol) that `assert_close` would use for the pair's dtypes (the looser of the two),
    for raising them to a test's minimum (``torch.testing._comparison.default_tolerances``)."""
    from torch.testing._comparison import default_tolerances as tolerances

    return tolerances(actual, expected)


def _unwrap_dtensors_once_loaded(unwrap: Any) -> Any:
    """torch's DTensor check of assert_close, skipped while torch.distributed.tensor is not
    imported: no DTensor can exist then, and importing it there (as torch does on every
    call) costs each process that compares a tensor over a second."""

    def unwrap_if_loaded(actual: Any, expected: Any) -> Tuple[Any, Any]:
        if "torch.distributed.tensor" not in sys.modules:
            return actual, expected
        return unwrap(actual, expected)

    unwrap_if_loaded.harness_lazy = True  # type: ignore[attr-defined]
    return unwrap_if_loaded


def assert_close_imports_dtensor() -> bool:
    """Whether torch.testing.assert_close may still import torch.distributed.tensor by itself
    (a torch whose check is not the one replaced below): processes that compare tensors had
    better import it once, up front, then."""
    unwrap = getattr(_comparison, "_unwrap_dtensor_for_comparison", None)
    return not getattr(unwrap, "harness_lazy", False)


_original_unwrap = getattr(_comparison, "_unwrap_dtensor_for_comparison", None)
if _original_unwrap is not None and assert_close_imports_dtensor():
    _comparison._unwrap_dtensor_for_comparison = _unwrap_dtensors_once_loaded(_original_unwrap)
