"""unittest's private API, which the harness touches here only: the name of the method a case
runs (`_testMethodName`), a result's traceback text (`_exc_info_to_string`), the per-test
hooks `TestCase.run` calls (`_callSetUp`, `_callTestMethod`, `_callTearDown`), the flags its
skip and expectedFailure decorators set on a test (`__unittest_skip__`,
`__unittest_skip_why__`, `__unittest_expecting_failure__`), how it hides its own frames (a
module global `__unittest`), `_formatMessage` and `_diffThreshold`.

unittest keeps these names from one Python to the next, but they are not its documented API:
a Python that renames one breaks the harness here, in one place, and the harness's own tests
(tests/test_compat_unittest_internals.py) name the symbol and the Python that lacks it.
Plain standard library: the outcome model (harness/outcome/), which imports no torch, uses it.
"""

from __future__ import annotations

import platform
import sys
import unittest
from types import FrameType
from typing import Any, Optional, TypeVar

_METHOD_NAME = "_testMethodName"
_SKIP, _SKIP_WHY = "__unittest_skip__", "__unittest_skip_why__"
_EXPECTING_FAILURE = "__unittest_expecting_failure__"
_HIDING_GLOBAL = "__unittest"  # a module that defines it has its frames left out of reports
_NO_DEFAULT: Any = object()

T = TypeVar("T")


def about(symbol: str) -> str:
    """`symbol` and the Python whose unittest it belongs to, for a message."""
    return f"{symbol} of unittest in Python {platform.python_version()}"


def method_name(case: Any, default: Any = _NO_DEFAULT) -> Any:
    """The name of the test method `case` runs (unittest's `_testMethodName`); `default` for
    an object that is not a unittest case, when given (AttributeError otherwise)."""
    if default is _NO_DEFAULT:
        return getattr(case, _METHOD_NAME)
    return getattr(case, _METHOD_NAME, default)


def exc_info_to_string(result: unittest.TestResult, err: Any, test: Any) -> str:
    """The traceback text unittest's `result` reports for `err` (its own frames left out)."""
    return result._exc_info_to_string(err, test)  # type: ignore[attr-defined]


def format_message(case: unittest.TestCase, msg: Optional[str], standard: str) -> str:
    """An assertion's message as unittest builds it from the caller's `msg` and the standard
    text (`longMessage`)."""
    return case._formatMessage(msg, standard)  # type: ignore[attr-defined]


def show_every_diff(cls: type) -> type:
    """Class decorator: multi-line strings always get a diff, however long (as upstream's
    TestCase sets `_diffThreshold`)."""
    cls._diffThreshold = sys.maxsize  # type: ignore[attr-defined]
    return cls


def mark_skipped(target: T, reason: str) -> T:
    """Mark a test function or class as unittest's `skip` decorator does."""
    setattr(target, _SKIP, True)
    setattr(target, _SKIP_WHY, reason)
    return target


def marked_skipped(target: Any) -> bool:
    """Whether unittest's `skip` decorators (or `mark_skipped`) marked `target`."""
    return bool(getattr(target, _SKIP, False))


def mark_expected_failure(target: T) -> T:
    """Mark a test function as `unittest.expectedFailure` does."""
    setattr(target, _EXPECTING_FAILURE, True)
    return target


def expects_failure(target: Any) -> bool:
    """Whether `unittest.expectedFailure` (or `mark_expected_failure`) marked `target`."""
    return bool(getattr(target, _EXPECTING_FAILURE, False))


def hidden_by_unittest(frame: FrameType) -> bool:
    """Whether unittest leaves `frame` out of a traceback (its module sets `__unittest`)."""
    return _HIDING_GLOBAL in frame.f_globals


class TestHooks:
    """A mixin before unittest.TestCase that overrides the private hooks `TestCase.run` calls
    around each test, once, here: a case changes how its set-up, test method or tear-down is
    called by overriding `call_set_up`, `call_test_method(method)` and `call_tear_down`,
    whose default is unittest's own."""

    def _callSetUp(self) -> None:  # noqa: N802 - unittest's hook
        self.call_set_up()

    def _callTestMethod(self, method: Any) -> None:  # noqa: N802 - unittest's hook
        self.call_test_method(method)

    def _callTearDown(self) -> None:  # noqa: N802 - unittest's hook
        self.call_tear_down()

    def call_set_up(self) -> None:
        """unittest's: `self.setUp()` (with its own bookkeeping around it)."""
        super()._callSetUp()  # type: ignore[misc]

    def call_test_method(self, method: Any) -> None:
        """unittest's: call the bound test method `method`."""
        super()._callTestMethod(method)  # type: ignore[misc]

    def call_tear_down(self) -> None:
        """unittest's: `self.tearDown()`."""
        super()._callTearDown()  # type: ignore[misc]
