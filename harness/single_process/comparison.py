"""assertEqual's comparison engine: upstream's verdicts and upstream's failure messages.

Why its own module: TestCase (harness/single_process/testcase.py) only formats the failure; what
"equal" means for tensors, numbers, containers and other objects, and what a mismatch says, is here.
The rules and texts are those of upstream's common_utils.TestCase.assertEqual (a differential test
in tests/test_testcase.py holds them to it): tensors by value with dtype-based tolerances
("Tensor-likes are not close!"), numbers with float32's tolerances for Python floats ("Scalars are
not equal!" / "Scalars are not close!"), containers elementwise (a mismatch ends with "The failure
occurred for item [..]"), and `precision` / `rel_tol` as lower bounds of the tolerances.
"""

from __future__ import annotations

import sys
import unittest
from collections.abc import Mapping
from dataclasses import dataclass, replace
from numbers import Integral, Number
from typing import Any, Optional, Sequence, Tuple

import torch
from torch import nn

from harness.compat import comparison as compat_comparison

# Upstream compares Python floats (and complex) with float32's default tolerances.
FLOAT_RTOL, FLOAT_ATOL = 1.3e-6, 1e-5
_SEQUENCES = (Sequence, nn.Sequential, nn.ModuleList, nn.ParameterList)
_MAPPINGS = (Mapping, nn.ModuleDict, nn.ParameterDict)
# Upstream words the other mismatches with plain unittest's assertEqual message.
_PLAIN = unittest.TestCase()


@dataclass(frozen=True)
class Comparison:
    """The keyword options of assertEqual, as upstream's TestCase takes them, plus the
    case's `precision` / `rel_tol`: lower bounds of the absolute / relative tolerance."""

    atol: Optional[float] = None
    rtol: Optional[float] = None
    equal_nan: bool = True
    exact_dtype: bool = True
    exact_device: bool = False
    exact_layout: bool = False
    exact_stride: bool = False
    exact_is_coalesced: bool = False
    atol_floor: float = 0.0
    rtol_floor: float = 0.0


def _from_numpy(value: Any) -> Any:
    """A numpy array as a tensor (or a list when torch has no such dtype); anything else as is.

    Only real arrays: other objects that have `__array__` (a tensor subclass *class*, for
    one) are not array data and are compared with `==`.
    """
    numpy = sys.modules.get("numpy")  # an array exists only if numpy was imported
    if numpy is None or not isinstance(value, numpy.ndarray):
        return value
    return torch.as_tensor(value) if value.dtype.kind in "biufc" else value.tolist()


def _is_sequence(value: Any) -> bool:
    return isinstance(value, _SEQUENCES) and not isinstance(value, (str, bytes))


def _is_number(value: Any) -> bool:
    return isinstance(value, Number)


def _item(path: Tuple[Any, ...]) -> str:
    """Upstream's suffix naming where in the containers a mismatch is."""
    if not path:
        return ""
    return "\n\nThe failure occurred for item " + "".join(str([key]) for key in path)


def _tensor_tolerances(
    actual: torch.Tensor, expected: torch.Tensor, how: Comparison
) -> Tuple[Optional[float], Optional[float]]:
    """(atol, rtol) for assert_close: given ones, raised to the case's floors; None for
    assert_close's dtype defaults where neither was given nor raised."""
    atol, rtol = how.atol, how.rtol
    if atol is not None or rtol is not None:
        atol, rtol = atol or 0.0, rtol or 0.0
    if not (how.atol_floor or how.rtol_floor):
        return atol, rtol
    if atol is None or rtol is None:
        rtol, atol = compat_comparison.default_tolerances(actual, expected)
    return max(atol, how.atol_floor), max(rtol, how.rtol_floor)


def _tensor_mismatch(
    actual: torch.Tensor, expected: torch.Tensor, how: Comparison
) -> Optional[str]:
    if not how.exact_device and actual.device != expected.device:
        expected = expected.to(actual.device)
    atol, rtol = _tensor_tolerances(actual, expected, how)
    if actual.layout == torch.sparse_coo and expected.layout == torch.sparse_coo:
        if how.exact_is_coalesced and actual.is_coalesced() != expected.is_coalesced():
            return f"is_coalesced {actual.is_coalesced()} != {expected.is_coalesced()}"
        actual, expected = actual.coalesce(), expected.coalesce()  # compare values, not storage
    options = dict(
        atol=atol, rtol=rtol, equal_nan=how.equal_nan, check_dtype=how.exact_dtype,
        check_device=how.exact_device, check_layout=how.exact_layout,
        check_stride=how.exact_stride,
    )
    if not (isinstance(actual, type(expected)) or isinstance(expected, type(actual))):
        return compat_comparison.unrelated_tensors_mismatch(actual, expected, **options)
    try:
        torch.testing.assert_close(actual, expected, **options)
    except AssertionError as error:
        return str(error)
    return None


def _number_tolerances(a: Any, b: Any, how: Comparison) -> Tuple[float, float]:
    if how.atol is not None or how.rtol is not None:  # as given (an int 0 shows as 0)
        atol = how.atol if how.atol is not None else 0
        rtol = how.rtol if how.rtol is not None else 0
    elif isinstance(a, Integral) and isinstance(b, Integral):
        atol, rtol = 0.0, 0.0  # integers compare exactly
    else:
        atol, rtol = FLOAT_ATOL, FLOAT_RTOL
    return max(atol, how.atol_floor), max(rtol, how.rtol_floor)


def _numbers_mismatch(a: Any, b: Any, how: Comparison) -> Optional[str]:
    if a == b or (how.equal_nan and a != a and b != b):  # NaN equals NaN, as upstream by default
        return None
    atol, rtol = _number_tolerances(a, b, how)
    try:
        difference = abs(a - b)
    except TypeError:  # numbers without arithmetic between them
        return _plain_message("Object", a, b)
    if difference <= atol + rtol * abs(b):
        return None
    return scalars_message(a, b, atol=atol, rtol=rtol)


def scalars_message(actual: Any, expected: Any, *, atol: float, rtol: float) -> str:
    """Upstream's text for two numbers that differ (torch.testing's wording)."""
    exact = atol == 0 and rtol == 0
    difference = abs(actual - expected)
    relative = float("inf") if expected == 0 else difference / abs(expected)
    allowed = ("", "") if exact else (f" (up to {atol} allowed)", f" (up to {rtol} allowed)")
    return (
        f"Scalars are not {'equal' if exact else 'close'}!\n\n"
        f"Expected {expected} but got {actual}.\n"
        f"Absolute difference: {difference}{allowed[0]}\n"
        f"Relative difference: {relative}{allowed[1]}"
    )


def _plain_message(kind: str, actual: Any, expected: Any) -> str:
    """`<Kind> comparison failed: ` and plain unittest's message, as upstream words them."""
    try:
        _PLAIN.assertEqual(actual, expected)
    except AssertionError as error:
        text = str(error)
    except Exception:  # an `==` that raises: name the values instead
        text = f"{actual!r} != {expected!r}"
    else:
        text = f"{actual!r} != {expected!r}"
    return f"{kind} comparison failed: {text}"


def _tensor_and_other(
    tensor: torch.Tensor, other: Any, how: Comparison
) -> Tuple[Any, Any, Comparison]:
    """The pair to compare for a tensor and a non-tensor (number, bool or sequence)."""
    if _is_number(other):
        if tensor.numel() == 1:
            return tensor.item(), other, how  # compared as numbers, as upstream
        return tensor, torch.full(tensor.shape, other, device=tensor.device), replace(
            how, exact_dtype=False
        )
    return tensor, torch.as_tensor(other, dtype=tensor.dtype, device=tensor.device), how


def mismatch(actual: Any, expected: Any, **options: Any) -> Optional[str]:
    """Upstream's message for why `actual` and `expected` differ, or None when they are equal.

    `options` are Comparison's fields. Tensors are compared by value with dtype-based
    tolerances; a tensor and a number, bool or sequence by value; mappings and sequences
    elementwise; numbers with upstream's float tolerances; None, types and classes (tensor
    subclass classes too) and any other object with `==`.
    """
    return _mismatch(actual, expected, Comparison(**options), ())


def _sorted_keys(mapping: Any) -> list:
    keys = list(mapping)
    try:
        return sorted(keys)
    except TypeError:
        return keys


def _container_mismatch(
    actual: Any, expected: Any, how: Comparison, path: Tuple[Any, ...]
) -> Optional[str]:
    if isinstance(actual, _MAPPINGS):
        if set(actual) != set(expected):
            missing, additional = set(expected) - set(actual), set(actual) - set(expected)
            return (
                "The keys of the mappings do not match:\n"
                f"Missing keys in the actual mapping: {sorted(missing)}\n"
                f"Additional keys in the actual mapping: {sorted(additional)}" + _item(path)
            )
        pairs = [(key, actual[key], expected[key]) for key in _sorted_keys(actual)]
    else:
        if len(actual) != len(expected):
            return (
                f"The length of the sequences mismatch: {len(actual)} != {len(expected)}"
                + _item(path)
            )
        pairs = [(index, a, b) for index, (a, b) in enumerate(zip(actual, expected))]
    for key, a, b in pairs:
        reason = _mismatch(a, b, how, (*path, key))
        if reason:
            return reason
    return None


def _mismatch(actual: Any, expected: Any, how: Comparison, path: Tuple[Any, ...]) -> Optional[str]:
    actual, expected = _from_numpy(actual), _from_numpy(expected)
    if actual is None or expected is None:
        same = actual is expected
        return None if same else f"None mismatch: {actual} is not {expected}" + _item(path)
    if isinstance(actual, type) or isinstance(expected, type):  # classes are never array data
        same = isinstance(actual, type) and isinstance(expected, type) and actual == expected
        kind = "Type" if isinstance(actual, type) and isinstance(expected, type) else "Object"
        return None if same else _plain_message(kind, actual, expected) + _item(path)
    actual_is_tensor, expected_is_tensor = (
        isinstance(actual, torch.Tensor), isinstance(expected, torch.Tensor)
    )
    if actual_is_tensor != expected_is_tensor:
        tensor, other = (actual, expected) if actual_is_tensor else (expected, actual)
        if not (_is_number(other) or _is_sequence(other)):
            kind = type(other).__name__
            return f"a tensor and a {kind} differ: {actual!r} != {expected!r}" + _item(path)
        try:
            tensor, other, how = _tensor_and_other(tensor, other, how)
        except (TypeError, ValueError, RuntimeError) as error:
            return f"cannot compare a tensor with {type(other).__name__}: {error}" + _item(path)
        actual, expected = (tensor, other) if actual_is_tensor else (other, tensor)
        if not isinstance(actual, torch.Tensor):  # a one-element tensor against a number
            return _mismatch(actual, expected, how, path)
    if isinstance(actual, torch.Tensor):
        reason = _tensor_mismatch(actual, expected, how)
        return reason + _item(path) if reason else None
    if (isinstance(actual, _MAPPINGS) and isinstance(expected, _MAPPINGS)) or (
        _is_sequence(actual) and _is_sequence(expected)
    ):
        return _container_mismatch(actual, expected, how, path)
    if isinstance(actual, bool) or isinstance(expected, bool):
        both_numbers = _is_number(actual) and _is_number(expected)
        if both_numbers and bool(actual) == bool(expected):
            return None
        if both_numbers:
            return f"Booleans mismatch: {actual} is not {expected}" + _item(path)
        return _plain_message("Object", actual, expected) + _item(path)
    if _is_number(actual) and _is_number(expected):
        reason = _numbers_mismatch(actual, expected, how)
        return reason + _item(path) if reason else None
    if _objects_equal(actual, expected):
        return None
    if isinstance(actual, (str, bytes)) and isinstance(expected, (str, bytes)):
        kind = "String"
    elif isinstance(actual, set) and isinstance(expected, set):
        kind = "Set"
    else:
        kind = "Object"
    return _plain_message(kind, actual, expected) + _item(path)


def _objects_equal(actual: Any, expected: Any) -> bool:
    """`==` for any other object; one whose `==` gives no truth value is equal only to itself."""
    if actual is expected:
        return True
    try:
        return bool(actual == expected)
    except (TypeError, ValueError, RuntimeError):
        return False
