"""harness/pytest_plugin/call.py: what a rank finds by module and name, and what cannot be sent."""

from __future__ import annotations

import threading

import pytest

from harness.pytest_plugin.call import CallError, check_sendable, find_target, marked_param
from tests.fixtures import ranked_helpers

HELPERS = "tests.fixtures.ranked_helpers"


def test_the_test_is_found_by_module_and_qualified_name() -> None:
    assert find_target(HELPERS, "target") is ranked_helpers.target
    method = find_target(HELPERS, "Owner.method")
    assert isinstance(method.__self__, ranked_helpers.Owner)  # a new instance, bound


def test_parametrize_values_are_read_from_the_marker_by_index() -> None:
    assert marked_param(HELPERS, "target", "a", 1) == (True, 2)  # a pytest.param
    assert marked_param(HELPERS, "target", "b", 0) == (True, "x")
    found, fn = marked_param(HELPERS, "target", "fn", 0)
    assert found and fn(4) == 8  # a lambda: never pickled
    assert marked_param(HELPERS, "Owner.method", "n", 1) == (True, 20)
    assert marked_param(HELPERS, "target", "missing", 0) == (False, None)
    assert marked_param(HELPERS, "target", "a", 5) == (False, None)


def test_a_value_that_cannot_be_sent_is_one_line_naming_the_fixture_and_the_fix() -> None:
    check_sendable("plain", {"a": [1, 2]})
    with pytest.raises(CallError) as raised:
        check_sendable("lock", threading.Lock())
    text = str(raised.value)
    assert text.startswith("fixture 'lock'") and "@harness.rank_fixture" in text
    assert "\n" not in text
