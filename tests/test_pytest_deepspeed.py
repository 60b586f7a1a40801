"""harness/pytest_plugin/deepspeed.py: what a DistributedTest class asks for (its ranks run in
tests/test_pytest_functions.py and tests/test_recipes.py)."""

from __future__ import annotations

import pytest

from harness.pytest_plugin import deepspeed
from harness.pytest_plugin.marker import MarkerError


class Reused(deepspeed.DistributedTest):
    world_size = 2
    reuse_dist_env = True
    skip_leak_checks = ("process_groups",)


def test_a_class_waives_leak_checks_as_the_marker_does() -> None:
    ranks = deepspeed.ranks_of(Reused, None)
    assert (ranks.mode, ranks.skip_leak_checks) == ("shared", ("process_groups",))


def test_an_unknown_check_is_the_classes_one_line_error() -> None:
    class Wrong(Reused):
        skip_leak_checks = "environment"

    with pytest.raises(MarkerError, match="skip_leak_checks: unknown check 'environment'"):
        deepspeed.ranks_of(Wrong, None)
