"""Where a multi-rank test's method runs: the supervisor joins the ranks, a rank runs the body.

A multi-rank test exists twice (harness/launch/ranked_case.py): the instance the runner holds, which
has no `rank_context`, and one instance per rank, which its launcher gave one. The same test
method must do different things in each, so the case routes it here once, when built.
"""

from __future__ import annotations

import functools
import types
import unittest
from typing import Any, Callable

from harness.compat import unittest_internals

# unittest and pytest hide frames of modules that define these: a failure points at the
# test's line, not at the routing.
__unittest = True
__tracebackhide__ = True


def route_test_method(case: unittest.TestCase, join: Callable[[], Any]) -> None:
    """Make the case's test method `join` the ranks in the supervising instance (no
    `rank_context`) and run the body in a rank.

    The replacement is bound with MethodType: unittest's loader treats a plain function found
    on an instance as a static method and calls it without `self`.
    """
    name = unittest_internals.method_name(case)
    method = getattr(case, name, None)
    if method is None:
        return

    @functools.wraps(method)
    def join_or_run(_case: unittest.TestCase, *args: Any, **kwargs: Any) -> Any:
        in_rank = getattr(_case, "rank_context", None) is not None
        return method(*args, **kwargs) if in_rank else join()

    setattr(case, name, types.MethodType(join_or_run, case))
