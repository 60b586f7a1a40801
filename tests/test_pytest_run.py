"""harness/pytest_plugin/run.py: a marked function's job run from the pytest process, which
only supervises: no unittest case is made there for ranked functions (every mode, passing or
failing), a pool call or a DistributedTest method, and a failure reaches pytest's report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import user_pytest_env

pytestmark = pytest.mark.slow

COUNTING_CONFTEST = '''
import os
import unittest

PYTEST_PID = os.getpid()
MADE = []
_original = unittest.TestCase.__init__


def _counting(case, *args, **kwargs):
    if os.getpid() == PYTEST_PID:
        MADE.append(type(case).__qualname__)
    _original(case, *args, **kwargs)


unittest.TestCase.__init__ = _counting


def pytest_sessionfinish(session):
    with open(os.environ["CASES_OUT"], "w") as f:
        f.write(",".join(MADE))
'''

RANKED = '''
import pytest
import torch
import torch.distributed as dist
import harness


@pytest.mark.ranks(2)
def test_fresh(rank):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2


@pytest.mark.ranks(2, mode="shared")
def test_shared(rank, world_size):
    assert dist.get_world_size() == world_size


@pytest.mark.ranks(2, mode="threads")
def test_threads(rank):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2


@pytest.mark.ranks(2)
def test_fails_on_rank_one(rank):
    assert rank == 0, "rank one disagrees"


def square(rank, world_size, x):
    return x * x + rank


def test_pool(rank_pool):
    assert rank_pool.run(square, 3) == [9, 10]


class TestShape(harness.DistributedTest):
    world_size = 2

    def test_method(self):
        assert dist.get_world_size() == 2
'''


def test_no_unittest_case_in_the_pytest_process(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(COUNTING_CONFTEST)
    (tmp_path / "test_ranked.py").write_text(RANKED)
    out = tmp_path / "cases.txt"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "harness.pytest_plugin", "-p", "no:cacheprovider",
         "-q", "-rf"],
        cwd=tmp_path, env=user_pytest_env(CASES_OUT=str(out), COLUMNS="200"),
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 5 passed" in done.stdout, done.stdout
    assert ("FAILED test_ranked.py::test_fails_on_rank_one - rank 1: AssertionError: rank one "
            "disagrees") in done.stdout
    assert out.read_text() == "", f"unittest cases made in the pytest process: {out.read_text()}"
