"""pytest's `skip`, `skipif` and `xfail` marks on unittest tests, honoured by the harness's
runners (`run_tests()`, `run_all.py`, `python -m harness`) as pytest itself would.

Client files put `@pytest.mark.skipif(not torch.cuda.is_available(), reason=...)` or
`@pytest.mark.skip("Flaky on CI")` on unittest test methods and classes. pytest applies them;
unittest's runner (upstream's `run_tests` too) ignores them, so a CUDA-only test would fail on
a CPU machine under one runner and skip under the other. Here a file means the same under every
runner: a test whose method, class or module carries such a mark is skipped with pytest's reason
(a string condition is evaluated as pytest does, with `os`, `sys`, `platform` and the module's
globals), or expected to fail. Marks are read as plain attributes (`pytestmark`), so nothing
here imports pytest. A documented difference from upstream's runner.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
import unittest
from typing import Any, Iterator, List, Optional, Tuple

from harness.compat import unittest_internals

_APPLIED = "__harness_pytest_marks__"


def marks_on(obj: Any) -> List[Any]:
    """The pytest marks `obj` (a function, class or module) carries itself, read as pytest
    stores them (`pytestmark`: one mark or a list)."""
    found = getattr(obj, "pytestmark", [])
    return list(found) if isinstance(found, (list, tuple)) else [found]


def marks_of(test: unittest.TestCase) -> Iterator[Any]:
    """The pytest marks that apply to `test`: its method's, its class's, its module's."""
    cls = type(test)
    yield from marks_on(getattr(cls, unittest_internals.method_name(test), None))
    yield from marks_on(cls)
    yield from marks_on(sys.modules.get(cls.__module__))


def _holds(condition: Any, test: unittest.TestCase) -> Tuple[bool, str]:
    """Whether a skipif/xfail condition holds, and pytest's default reason for it."""
    if isinstance(condition, str):
        module = sys.modules.get(type(test).__module__)
        namespace = {"os": os, "sys": sys, "platform": platform, "config": None,
                     **vars(module or object())}
        return bool(eval(condition, namespace)), f"condition: {condition}"  # noqa: S307
    return bool(condition), ""


def verdict(test: unittest.TestCase) -> Tuple[Optional[str], Optional[str]]:
    """(why the test is skipped, why it is expected to fail); None where a mark does not say."""
    expected_failure = None
    for mark in marks_of(test):
        name, args, kwargs = getattr(mark, "name", ""), mark.args, mark.kwargs
        if name == "skip":
            return kwargs.get("reason", args[0] if args else "unconditional skip"), None
        if name == "skipif":
            conditions = args or ((kwargs["condition"],) if "condition" in kwargs else ())
            for condition in conditions:
                holds, default = _holds(condition, test)
                if holds:
                    return kwargs.get("reason", default), None
        if name == "xfail" and expected_failure is None:
            conditions = args[:1] or ((kwargs["condition"],) if "condition" in kwargs else (True,))
            holds, default = _holds(conditions[0], test)
            if holds:
                reason = kwargs.get("reason", default)
                if not kwargs.get("run", True):
                    return f"[NOTRUN] {reason}".rstrip(), None
                expected_failure = reason
    return None, expected_failure


def honour_pytest_marks(tests: List[unittest.TestCase]) -> List[unittest.TestCase]:
    """`tests`, each skipped or expected to fail as its pytest marks say (once per test)."""
    for test in tests:
        name = unittest_internals.method_name(test, None)
        if name is None or getattr(test, _APPLIED, False) or not hasattr(test, name):
            continue
        setattr(test, _APPLIED, True)
        skip, expected_failure = verdict(test)
        method = getattr(test, name)
        if skip is not None:
            setattr(test, name, _skipped(method, skip))
        elif expected_failure is not None:
            setattr(test, name, _expecting_failure(method))
    return tests


def _skipped(method: Any, reason: str) -> Any:
    @functools.wraps(method)
    def skipped(*args: Any, **kwargs: Any) -> None:
        raise unittest.SkipTest(reason)

    return unittest_internals.mark_skipped(skipped, reason)  # unittest's own flags


def _expecting_failure(method: Any) -> Any:
    @functools.wraps(method)
    def expecting_failure(*args: Any, **kwargs: Any) -> Any:
        return method(*args, **kwargs)

    return unittest_internals.mark_expected_failure(expecting_failure)
