"""harness/pytest_plugin/run.py: a marked function's job run from the pytest process, which
only supervises: no unittest case is made there for ranked functions (every mode, passing or
failing), a pool call or a DistributedTest method, and a failure reaches pytest's report."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest

from harness import settings
from harness.outcome.report import ERROR, FAILED, Outcome, RankReport, TestReport
from harness.pytest_plugin import run
from harness.pytest_plugin.call import FunctionCall
from tests.fixtures import user_pytest_env

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


@pytest.mark.slow
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


def test_the_marker_timeout_else_the_default_capped_before_a_runners_deadline() -> None:
    assert run._test_timeout(12.0) == 12.0
    assert run._test_timeout(None) == settings.default_timeout()
    assert run._capped(12.0, None) == 12.0
    capped = run._capped(600.0, time.monotonic() + 20.0)  # pytest-timeout's 20 s
    assert 10.0 <= capped < 20.0
    with mock.patch.dict("os.environ", {settings.DEBUG_RANK_ENV: "0"}):
        assert run._test_timeout(12.0) == settings.DEBUG_TIMEOUT_S
        assert run._capped(settings.DEBUG_TIMEOUT_S, time.monotonic() + 20.0) == (
            settings.DEBUG_TIMEOUT_S)


def test_the_exception_says_failure_or_error_and_carries_the_report() -> None:
    lead = RankReport("rank 1", "ValueError: x", [], [], exc_class=("builtins", "ValueError"))
    failed = TestReport("t", status=FAILED, own=Outcome(FAILED, "m", "detail", "", lead))
    raised = run.raised_for(failed)
    assert type(raised) is run.RanksFailed and isinstance(raised, AssertionError)
    assert not isinstance(raised, RuntimeError)
    assert raised.report is failed and raised.lead is lead and str(raised) == "detail"
    erred = TestReport("t", status=ERROR, own=Outcome(ERROR, "m", "detail", "", lead))
    error = run.raised_for(erred)
    assert isinstance(error, run.RanksErred) and isinstance(error, RuntimeError)
    assert not isinstance(error, AssertionError)  # xfail(raises=AssertionError) does not hide it


def test_a_failed_test_retires_its_shared_set_and_a_passed_one_keeps_it() -> None:
    class Canned:
        def __init__(self, report: TestReport) -> None:
            self.report = report

        def start(self, job: object) -> None:
            self.job = job

        def join(self, job: object) -> tuple:
            return [], None

        def close(self) -> None:
            pass

    call = FunctionCall(test_id="t.py::test_x", module="t", qualname="test_x", argnames=())
    for status, stopped in ((FAILED, ["key"]), ("passed", [])):
        verdict = TestReport("t.py::test_x", status=status, own=Outcome(status))
        launcher = Canned(verdict)
        with mock.patch.object(run, "_launcher", return_value=launcher), \
                mock.patch.object(run, "decide", return_value=verdict), \
                mock.patch.object(run.shared.OPEN_RANKS, "stop") as stop:
            outcome = run.run_on_ranks(call, "shared", 2, 5.0, None, "key")
        assert outcome.report is verdict
        assert [c.args[0] for c in stop.call_args_list] == stopped
        job = launcher.job
        assert (job.module, job.qualname, job.inputs, job.shared_key, job.world_size) == (
            "harness.pytest_plugin.rank_program", "SharedFunction", call, "key", 2)


def test_ranks_that_cannot_start_here_skip_the_test() -> None:
    class Refuses:
        def start(self, job: object) -> None:
            import unittest

            raise unittest.SkipTest("needs world size 2, torchrun launched 4 processes")

        def close(self) -> None:
            pass

    call = FunctionCall(test_id="t.py::test_x", module="t", qualname="test_x", argnames=())
    with mock.patch.object(run, "_launcher", return_value=Refuses()):
        outcome = run.run_on_ranks(call, "fresh", 2, 5.0, None)
    assert (outcome.report.status, outcome.report.message) == (
        "skipped", "needs world size 2, torchrun launched 4 processes")


def test_set_up_is_waited_for_until_every_rank_set_up_or_one_ended() -> None:
    from harness.outcome.rank_record import Event, RankRecord
    from tests.fixtures.events import rank_failure

    set_up, running = RankRecord(0, events=[Event("set_up")]), RankRecord(1)
    assert not run.set_up_or_ended([set_up, running])
    assert run.set_up_or_ended([set_up, RankRecord(1, events=[Event("set_up")])])
    assert run.set_up_or_ended([running, RankRecord(1, events=[Event("skip", "no")])])
    fixture = rank_failure("Traceback\nValueError: x", status="error", phase="setup")
    failed = RankRecord(1, events=[fixture])
    assert run.set_up_or_ended([running, failed])
    assert run.failed_setting_up(failed)
    called = RankRecord(1, events=[Event("set_up"), rank_failure("Traceback\nValueError: x")])
    assert not run.failed_setting_up(called)


def pass_in_a_thread(rank: int) -> None:
    assert rank in (0, 1)


def test_a_run_started_in_set_up_is_joined_by_the_call_and_closed_once() -> None:
    call = FunctionCall(test_id="t.py::pass_in_a_thread", module=__name__,
                        qualname="pass_in_a_thread", argnames=("rank",), init=False)
    released = []
    resources = contextlib.ExitStack()
    resources.callback(released.append, "lease")
    started = run.StartedRun(call, "threads", 2, 10.0, None, resources=resources)
    assert started.wait_for_set_up() is None  # the call phase joins
    outcome = started.finish(None)
    assert outcome.report.status == "passed" and released == ["lease"]
    assert started.finish(None) is outcome  # joined once
    started.close()
    assert released == ["lease"]
