"""The single-process base: upstream's assertEqual, seeding, subtest grids.

Every harness base class derives from `TestCase`, so rank processes and rank threads
compare values the same way a plain unit test does, and the way upstream's
common_utils.TestCase does (its keywords, tolerances and verdicts; a differential test in
tests/test_testcase.py holds them to upstream's). `setUp` also honours accelerator
requirements declared on the test class (harness/skips.py).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import subprocess
import sys
import types
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from numbers import Integral, Number
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import expecttest
import torch
from torch import nn

from harness.compat.comparison import unrelated_tensors_mismatch
from harness.launch.context import RankContext
from harness.parametrize import run_subtests
from harness.skips import check_case_requirements

# unittest and pytest hide frames of modules that define these (as unittest hides its own):
# a failure points at the test's line, not at assertEqual or the harness's method routing.
__unittest = True
__tracebackhide__ = True

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
    """Seed torch, random and numpy (when installed) so every test starts identically.

    Without an accelerator only the CPU generator is seeded: `torch.manual_seed` would also
    queue a lazy seed for each accelerator type torch knows, recording a stack trace for each
    (a fifth of a millisecond or more, every test, in every rank).
    """
    if torch.accelerator.current_accelerator() is None:
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed % 2**32)


# Upstream compares Python floats (and complex) with float32's default tolerances.
FLOAT_RTOL, FLOAT_ATOL = 1.3e-6, 1e-5
_SEQUENCES = (Sequence, nn.Sequential, nn.ModuleList, nn.ParameterList)
_MAPPINGS = (Mapping, nn.ModuleDict, nn.ParameterDict)


@dataclass(frozen=True)
class Comparison:
    """The keyword options of assertEqual, as upstream's TestCase takes them."""

    atol: Optional[float] = None
    rtol: Optional[float] = None
    equal_nan: bool = True
    exact_dtype: bool = True
    exact_device: bool = False
    exact_layout: bool = False
    exact_stride: bool = False
    exact_is_coalesced: bool = False


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


def _tensor_mismatch(
    actual: torch.Tensor, expected: torch.Tensor, how: Comparison
) -> Optional[str]:
    if not how.exact_device and actual.device != expected.device:
        expected = expected.to(actual.device)
    atol, rtol = how.atol, how.rtol
    if atol is not None or rtol is not None:
        atol, rtol = atol or 0.0, rtol or 0.0
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
        return unrelated_tensors_mismatch(actual, expected, **options)
    try:
        torch.testing.assert_close(actual, expected, **options)
    except AssertionError as error:
        return str(error)
    return None


def _numbers_differ(a: Any, b: Any, how: Comparison) -> bool:
    if a == b or (how.equal_nan and a != a and b != b):  # NaN equals NaN, as upstream by default
        return False
    if how.atol is not None or how.rtol is not None:
        atol, rtol = how.atol or 0.0, how.rtol or 0.0
    elif isinstance(a, Integral) and isinstance(b, Integral):
        return True  # integers compare exactly
    else:
        atol, rtol = FLOAT_ATOL, FLOAT_RTOL
    try:
        return not abs(a - b) <= atol + rtol * abs(b)
    except TypeError:  # numbers without arithmetic between them
        return True


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


def mismatch(actual: Any, expected: Any, *, path: str = "", **options: Any) -> Optional[str]:
    """Why `actual` and `expected` differ, or None when they are equal.

    `options` are assertEqual's keywords (see Comparison). Tensors are compared by value
    with dtype-based tolerances; a tensor and a number, bool or sequence by value; mappings
    and sequences elementwise; numbers with upstream's float tolerances; None, types and
    classes (tensor subclass classes too) and any other object with `==`.
    """
    return _mismatch(actual, expected, Comparison(**options), path)


def _mismatch(actual: Any, expected: Any, how: Comparison, path: str) -> Optional[str]:
    where = f" at {path}" if path else ""
    actual, expected = _from_numpy(actual), _from_numpy(expected)
    if actual is None or expected is None:
        return None if actual is expected else f"{actual!r} != {expected!r}{where}"
    if isinstance(actual, type) or isinstance(expected, type):  # classes are never array data
        same = isinstance(actual, type) and isinstance(expected, type) and actual == expected
        return None if same else f"{actual!r} != {expected!r}{where}"
    actual_is_tensor, expected_is_tensor = (
        isinstance(actual, torch.Tensor), isinstance(expected, torch.Tensor)
    )
    if actual_is_tensor != expected_is_tensor:
        tensor, other = (actual, expected) if actual_is_tensor else (expected, actual)
        if not (_is_number(other) or _is_sequence(other)):
            kind = type(other).__name__
            return f"a tensor and a {kind} differ{where}: {actual!r} != {expected!r}"
        try:
            tensor, other, how = _tensor_and_other(tensor, other, how)
        except (TypeError, ValueError, RuntimeError) as error:
            return f"cannot compare a tensor with {type(other).__name__}{where}: {error}"
        actual, expected = (tensor, other) if actual_is_tensor else (other, tensor)
        if not isinstance(actual, torch.Tensor):  # a one-element tensor against a number
            return _mismatch(actual, expected, how, path)
    if isinstance(actual, torch.Tensor):
        reason = _tensor_mismatch(actual, expected, how)
        return f"tensors differ{where}: {reason}" if reason else None
    if isinstance(actual, _MAPPINGS) and isinstance(expected, _MAPPINGS):
        if set(actual) != set(expected):
            keys = f"{sorted(map(repr, actual))} != {sorted(map(repr, expected))}"
            return f"keys differ{where}: {keys}"
        for key in actual:
            reason = _mismatch(actual[key], expected[key], how, f"{path}[{key!r}]")
            if reason:
                return reason
        return None
    if _is_sequence(actual) and _is_sequence(expected):
        if len(actual) != len(expected):
            return f"lengths differ{where}: {len(actual)} != {len(expected)}"
        for index, (a, b) in enumerate(zip(actual, expected)):
            reason = _mismatch(a, b, how, f"{path}[{index}]")
            if reason:
                return reason
        return None
    if isinstance(actual, bool) or isinstance(expected, bool):
        both_numbers = _is_number(actual) and _is_number(expected)
        differs = not both_numbers or bool(actual) != bool(expected)
    elif _is_number(actual) and _is_number(expected):
        differs = _numbers_differ(actual, expected, how)
    else:
        differs = not _objects_equal(actual, expected)
    return f"{actual!r} != {expected!r}{where}" if differs else None


def _objects_equal(actual: Any, expected: Any) -> bool:
    """`==` for any other object; one whose `==` gives no truth value is equal only to itself."""
    if actual is expected:
        return True
    try:
        return bool(actual == expected)
    except (TypeError, ValueError, RuntimeError):
        return False


def route_test_method(case: TestCase, join: Callable[[], Any]) -> None:
    """Make the case's test method `join` the ranks in the supervising instance (no
    `rank_context`) and run the body in a rank.

    The replacement is bound with MethodType: unittest's loader treats a plain function found
    on an instance as a static method and calls it without `self`.
    """
    name = case._testMethodName
    method = getattr(case, name, None)
    if method is None:
        return

    @functools.wraps(method)
    def join_or_run(_case: TestCase, *args: Any, **kwargs: Any) -> Any:
        return join() if _case.rank_context is None else method(*args, **kwargs)

    setattr(case, name, types.MethodType(join_or_run, case))


Message = Union[str, Callable[[str], str], None]


class TestCase(expecttest.TestCase):
    """unittest/expecttest TestCase with tensor-aware equality, seeding and subtest grids."""

    # In a rank of a multi-rank test, what its launcher told it (harness/launch/case.py);
    # None in a single-process test and in the supervisor.
    rank_context: Optional[RankContext] = None

    def setUp(self) -> None:
        super().setUp()
        check_case_requirements(self)  # class-level requirements; methods check their own too
        seed_everything(current_seed())

    def _comparison_failure(self, msg: Message, reason: str) -> AssertionError:
        if callable(msg):
            return self.failureException(msg(reason))
        return self.failureException(self._formatMessage(msg, reason))

    def assertEqual(  # noqa: N802 - unittest's naming
        self,
        first: Any,
        second: Any,
        msg: Message = None,
        *,
        atol: Optional[float] = None,
        rtol: Optional[float] = None,
        equal_nan: bool = True,
        exact_dtype: bool = True,
        exact_device: bool = False,
        exact_layout: bool = False,
        exact_stride: bool = False,
        exact_is_coalesced: bool = False,
    ) -> None:
        """Upstream's assertEqual: tensors by value (dtype tolerances), containers elementwise.

        `msg` (positional or keyword) is added to the failure, or, when callable, builds it
        from the generated message.
        """
        if isinstance(first, str) and isinstance(second, str):
            if first != second:
                super().assertEqual(first, second, None if callable(msg) else msg)
            return
        reason = mismatch(
            first, second, atol=atol, rtol=rtol, equal_nan=equal_nan, exact_dtype=exact_dtype,
            exact_device=exact_device, exact_layout=exact_layout, exact_stride=exact_stride,
            exact_is_coalesced=exact_is_coalesced,
        )
        if reason is not None:
            raise self._comparison_failure(msg, reason)

    def assertNotEqual(  # noqa: N802 - unittest's naming
        self,
        first: Any,
        second: Any,
        msg: Message = None,
        *,
        atol: Optional[float] = None,
        rtol: Optional[float] = None,
        **options: Any,
    ) -> None:
        """The negation of assertEqual, with the same comparison rules and keywords."""
        reason = mismatch(first, second, atol=atol, rtol=rtol, **options)
        if reason is None:
            raise self._comparison_failure(msg, f"values are equal: {first!r} == {second!r}")

    def assertNotWarn(self, callable: Callable[[], Any], msg: str = "") -> None:  # noqa: N802, A002
        """Fail if `callable()` warns, counting warnings torch would show only once."""
        previous = torch.is_warn_always_enabled()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.set_warn_always(True)
            try:
                callable()
            finally:
                torch.set_warn_always(previous)
        if caught:
            shown = "; ".join(f"{w.category.__name__}: {w.message}" for w in caught)
            raise self.failureException(self._formatMessage(msg or None, f"warned: {shown}"))

    def _attempt_load_from_subprocess(
        self, file: Any, import_string: str, expected_failure_message: Optional[str] = None
    ) -> None:
        """`torch.load(file, weights_only=True)` in a fresh interpreter after `import_string`.

        Checks that a checkpoint loads without the test process's imports. With
        `expected_failure_message`, the load must fail with a RuntimeError containing it.
        """
        script = f"import torch;{import_string}torch.load(r'{file}', weights_only=True)"
        expectation = (
            self.assertRaisesRegex(RuntimeError, re.escape(expected_failure_message))
            if expected_failure_message else contextlib.nullcontext()
        )
        with expectation:
            try:
                subprocess.check_output(
                    [sys.executable, "-c", script], stderr=subprocess.STDOUT,
                    cwd=os.path.dirname(os.path.abspath(str(file))),
                )
            except subprocess.CalledProcessError as error:
                raise RuntimeError(error.output.decode("utf-8", "replace")) from None

    def run_subtests(
        self, grid: Dict[str, Sequence[Any]], fn: Callable, *args: Any, **kwargs: Any
    ) -> None:
        """Run `fn` for every point of `grid`, each point a subTest (parametrize.run_subtests)."""
        run_subtests(self, grid, fn, *args, **kwargs)

