"""harness/pytest_plugin/fixtures.py: the stand-ins the pytest process holds, `@rank_fixture`."""

from __future__ import annotations

import pytest

from harness import rank_fixture
from harness.pytest_plugin.call import FixtureRef
from harness.pytest_plugin.fixtures import InRank, rank_fixture_function
from tests.fixtures import ranked_helpers

HELPERS = "tests.fixtures.ranked_helpers"


def test_a_stand_in_used_in_the_pytest_process_says_where_its_value_lives() -> None:
    rank = InRank("rank")
    for use in (lambda: rank + 1, lambda: int(rank), lambda: rank.type, lambda: [0][rank]):
        with pytest.raises(RuntimeError, match="'rank' has a value only inside the ranks"):
            use()
    assert repr(rank) == "<rank: inside the ranks>"


def test_a_rank_fixture_is_found_in_the_rank_by_module_and_name() -> None:
    assert rank_fixture_function(HELPERS, "doubled")(rank=3) == 6
    assert rank_fixture_function(HELPERS, "renamed") is not None
    with pytest.raises(LookupError, match="rank fixture 'nope' not found"):
        rank_fixture_function(HELPERS, "nope")


def test_the_pytest_process_holds_a_reference_with_the_fixtures_arguments() -> None:
    definition = ranked_helpers.doubled
    ref = getattr(definition, "_get_wrapped_function", lambda: None)()
    if ref is None:
        pytest.skip("this pytest wraps fixtures differently")
    assert ref() == FixtureRef(HELPERS, "doubled", "function", ("rank",), ranked_helpers.__file__)


def test_bad_scope_and_local_functions_are_one_line_errors() -> None:
    with pytest.raises(ValueError, match="unknown scope 'session'"):
        rank_fixture(scope="session")

    def local(rank: int) -> int:
        return rank

    with pytest.raises(ValueError, match="defined inside a function"):
        rank_fixture(local)
