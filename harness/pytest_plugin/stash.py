"""What the plugin's hooks keep on a test item between pytest's phases."""

from __future__ import annotations

from typing import Any, List

import pytest

from harness.outcome.rank_record import RankRecord
from harness.pytest_plugin.call import FunctionCall

DEADLINE = pytest.StashKey[float]()  # when pytest-timeout fires (time.monotonic())
RECORDS = pytest.StashKey[List[RankRecord]]()  # the ranks' records, for the output sections
PROBLEM = pytest.StashKey[str]()  # a marked test that cannot run: the one-line reason
CALL = pytest.StashKey[FunctionCall]()  # a marked test's call, once its fixtures are resolved
STARTED = pytest.StashKey[Any]()  # its ranks, started in set-up (run.py StartedRun) until joined
START_ERROR = pytest.StashKey[BaseException]()  # ... or why they could not start, for the call
TEARDOWN_ERROR = pytest.StashKey[Exception]()  # a `@rank_fixture`'s teardown failed in a rank
