"""The single-process base: tensor-aware equality, seeding, subtest grids.

Every harness base class derives from `TestCase`, so rank processes and rank threads
compare tensors the same way a plain unit test does.
"""

from __future__ import annotations

import functools
import math
import os
import random
import types
import unittest
from collections.abc import Mapping
from numbers import Number
from typing import Any, Callable, Dict, Optional, Sequence

import expecttest
import torch

from harness.parametrize import run_subtests

SEED_ENV = "HARNESS_SEED"
DEFAULT_SEED = 1234


def current_seed() -> int:
    """The seed every test starts from: HARNESS_SEED (set by `--seed N`), else 1234."""
    value = os.environ.get(SEED_ENV, "")
    try:
        return int(value) if value else DEFAULT_SEED
    except ValueError:
        raise ValueError(f"{SEED_ENV}={value!r} is not an int") from None


def seed_everything(seed: int) -> None:
    """Seed torch, random and numpy (when installed) so every test starts identically."""
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed % 2**32)


def _is_array_like(value: Any) -> bool:
    return hasattr(value, "__array__") and not isinstance(value, (torch.Tensor, Number, str))


def _as_tensor_like(value: Any, like: torch.Tensor) -> torch.Tensor:
    """A number (broadcast to `like`'s shape) or nested list as a tensor on `like`'s device."""
    if isinstance(value, Number):
        return torch.full(like.shape, value, device=like.device)
    return torch.as_tensor(value, device=like.device)


def _tensor_mismatch(
    actual: torch.Tensor,
    expected: torch.Tensor,
    atol: Optional[float],
    rtol: Optional[float],
    exact_dtype: bool,
    exact_device: bool,
) -> Optional[str]:
    if not exact_device and actual.device != expected.device:
        expected = expected.to(actual.device)
    if atol is not None or rtol is not None:
        atol, rtol = atol or 0.0, rtol or 0.0
    try:
        torch.testing.assert_close(
            actual, expected, atol=atol, rtol=rtol, equal_nan=True,
            check_dtype=exact_dtype, check_device=exact_device,
        )
    except AssertionError as error:
        return str(error)
    return None


def _numbers_mismatch(a: Number, b: Number, atol: Optional[float], rtol: Optional[float]) -> bool:
    if atol is None and rtol is None:
        return not (a == b or (a != a and b != b))  # NaN equals NaN
    return not math.isclose(a, b, rel_tol=rtol or 0.0, abs_tol=atol or 0.0)


def mismatch(
    actual: Any,
    expected: Any,
    *,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    exact_dtype: bool = True,
    exact_device: bool = False,
    path: str = "",
) -> Optional[str]:
    """Why `actual` and `expected` differ, or None when they are equal."""
    where = f" at {path}" if path else ""
    kwargs = dict(atol=atol, rtol=rtol, exact_dtype=exact_dtype, exact_device=exact_device)
    if _is_array_like(actual):
        actual = torch.as_tensor(actual)
    if _is_array_like(expected):
        expected = torch.as_tensor(expected)
    if isinstance(actual, torch.Tensor) or isinstance(expected, torch.Tensor):
        if not isinstance(expected, torch.Tensor):
            expected, kwargs["exact_dtype"] = _as_tensor_like(expected, actual), False
        elif not isinstance(actual, torch.Tensor):
            actual, kwargs["exact_dtype"] = _as_tensor_like(actual, expected), False
        kwargs.pop("path", None)
        reason = _tensor_mismatch(actual, expected, **kwargs)
        return f"tensors differ{where}: {reason}" if reason else None
    if isinstance(actual, Mapping) and isinstance(expected, Mapping):
        if set(actual) != set(expected):
            keys = f"{sorted(map(repr, actual))} != {sorted(map(repr, expected))}"
            return f"keys differ{where}: {keys}"
        for key in actual:
            reason = mismatch(actual[key], expected[key], path=f"{path}[{key!r}]", **kwargs)
            if reason:
                return reason
        return None
    if _is_sequence(actual) and _is_sequence(expected):
        if len(actual) != len(expected):
            return f"lengths differ{where}: {len(actual)} != {len(expected)}"
        for index, (a, b) in enumerate(zip(actual, expected)):
            reason = mismatch(a, b, path=f"{path}[{index}]", **kwargs)
            if reason:
                return reason
        return None
    if isinstance(actual, Number) and isinstance(expected, Number):
        differs = _numbers_mismatch(actual, expected, atol, rtol)
    else:
        differs = not bool(actual == expected)
    return f"{actual!r} != {expected!r}{where}" if differs else None


def _is_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def route_test_method(
    case: unittest.TestCase, is_supervisor: Callable[[], bool], join: Callable[[], Any]
) -> None:
    """Make the case's test method join the ranks in the supervisor and run the body in a rank.

    The replacement is bound with MethodType: unittest's loader treats a plain function found
    on an instance as a static method and calls it without `self`.
    """
    name = case._testMethodName
    method = getattr(case, name, None)
    if method is None:
        return

    @functools.wraps(method)
    def join_or_run(_case: unittest.TestCase, *args: Any, **kwargs: Any) -> Any:
        return join() if is_supervisor() else method(*args, **kwargs)

    setattr(case, name, types.MethodType(join_or_run, case))


class TestCase(expecttest.TestCase):
    """unittest/expecttest TestCase with tensor-aware equality, seeding and subtest grids."""

    def setUp(self) -> None:
        super().setUp()
        seed_everything(current_seed())

    def assertEqual(  # noqa: N802 - unittest's naming
        self,
        first: Any,
        second: Any,
        msg: Optional[str] = None,
        *,
        atol: Optional[float] = None,
        rtol: Optional[float] = None,
        exact_dtype: bool = True,
        exact_device: bool = False,
    ) -> None:
        """Tensors by value (dtype-based tolerances as assert_close), containers elementwise."""
        if isinstance(first, str) and isinstance(second, str):
            return super().assertEqual(first, second, msg)
        reason = mismatch(first, second, atol=atol, rtol=rtol,
                          exact_dtype=exact_dtype, exact_device=exact_device)
        if reason is not None:
            raise self.failureException(self._formatMessage(msg, reason))

    def assertNotEqual(  # noqa: N802 - unittest's naming
        self,
        first: Any,
        second: Any,
        msg: Optional[str] = None,
        *,
        atol: Optional[float] = None,
        rtol: Optional[float] = None,
        exact_dtype: bool = True,
        exact_device: bool = False,
    ) -> None:
        """The negation of assertEqual, with the same comparison rules."""
        reason = mismatch(first, second, atol=atol, rtol=rtol,
                          exact_dtype=exact_dtype, exact_device=exact_device)
        if reason is None:
            shown = f"{first!r} == {second!r}"
            raise self.failureException(self._formatMessage(msg, f"values are equal: {shown}"))

    def run_subtests(
        self, grid: Dict[str, Sequence[Any]], fn: Callable, *args: Any, **kwargs: Any
    ) -> None:
        """Run `fn` for every point of `grid`, each point a subTest (parametrize.run_subtests)."""
        run_subtests(self, grid, fn, *args, **kwargs)

    def _grid_point_done(self, params: Dict[str, Any], passed: bool) -> bool:
        """Hook for multi-rank bases to keep ranks in step between grid points."""
        return True

