"""harness/pytest_plugin/rank_program.py: a marked function's call run as one rank's test,
without unittest: what it reports for each way a call ends, and what it leaves behind.

The rank runs here, in this process (`run_rank_here`, as torchrun's rank runs), with init=False
so that no group is made; the functions it calls are this module's.
"""

from __future__ import annotations

import sys
import unittest
from typing import Any, List
from unittest import mock

import pytest
import torch
import torch.distributed as dist

from harness.compat import cpu_defaults
from harness.launch.context import running_rank
from harness.launch.in_process import run_rank_here
from harness.launch.job import Job
from harness.outcome.rank_record import RankRecord
from harness.pytest_plugin import rank_program, run
from harness.pytest_plugin.call import FunctionCall
from harness.pytest_plugin.rank_program import FreshFunction, ThreadFunction

SEEN: List[Any] = []


def passes(rank: int, world_size: int) -> None:
    SEEN.append((rank, world_size))


def fails() -> None:
    assert 1 == 2, "one is not two"


def errs() -> None:
    raise KeyError("nope")


def skips() -> None:
    pytest.skip("not here")


def exits_cleanly() -> None:
    sys.exit(0)


def exits_with_three() -> None:
    sys.exit(3)


def run_function(name: str, argnames: tuple = (), program: type = FreshFunction) -> RankRecord:
    call = FunctionCall(test_id=f"t.py::{name}", module=__name__, qualname=name,
                        argnames=argnames, init=False)
    job = Job(test_id=call.test_id, module=rank_program.__name__, qualname=program.__name__,
              method=rank_program.METHOD, world_size=2, timeout=10.0, inputs=call,
              local_class=program)
    return run_rank_here(job, 1, 2)


def kinds(record: RankRecord) -> List[str]:
    return [event.kind for event in record.events]


class Outcomes(unittest.TestCase):
    def test_a_pass_gets_its_rank_fixtures_and_says_when_they_are_set_up(self) -> None:
        SEEN.clear()
        record = run_function("passes", ("rank", "world_size"))
        self.assertEqual(kinds(record), ["set_up", "success", "done"])
        self.assertEqual(SEEN, [(1, 2)])

    def test_an_assertion_is_a_failure_with_its_data(self) -> None:
        event = run_function("fails").events[1]
        self.assertEqual((event.kind, event.status), ("failure", ""))
        failure = event.failure
        assert failure is not None
        self.assertEqual((failure.exc_module, failure.exc_qualname), ("builtins", "AssertionError"))
        self.assertTrue(failure.exception.startswith("AssertionError: one is not two"))
        self.assertEqual(failure.frames[-1].name, "fails")

    def test_another_exception_is_an_error(self) -> None:
        event = run_function("errs").events[1]
        self.assertEqual((event.kind, event.status, event.failure.exception),
                         ("failure", "error", "KeyError: 'nope'"))

    def test_pytest_skip_is_the_ranks_skip(self) -> None:
        record = run_function("skips")
        self.assertEqual([(e.kind, e.text) for e in record.events],
                         [("set_up", ""), ("skip", "not here"), ("done", "")])

    def test_sys_exit_is_the_ranks_exit(self) -> None:
        self.assertEqual(kinds(run_function("exits_cleanly")), ["set_up", "success", "done"])
        record = run_function("exits_with_three")
        self.assertEqual(record.test_exit_code(), 3)
        self.assertTrue(record.failed)

    def test_no_unittest_case_is_made(self) -> None:
        made: List[Any] = []
        original = unittest.TestCase.__init__

        def counting(case: Any, *args: Any, **kwargs: Any) -> None:
            made.append(type(case))
            original(case, *args, **kwargs)

        unittest.TestCase.__init__ = counting  # type: ignore[method-assign]
        try:
            run_function("passes", ("rank", "world_size"))
            run_function("fails")
        finally:
            unittest.TestCase.__init__ = original  # type: ignore[method-assign]
        self.assertEqual(made, [])

    def test_a_thread_rank_without_init_leaves_no_group(self) -> None:
        record = run_function("passes", ("rank", "world_size"), ThreadFunction)
        self.assertEqual(kinds(record), ["set_up", "success", "done"])
        self.assertFalse(dist.is_initialized())


def draws(rank: int) -> None:
    SEEN.append(torch.rand(1).item())


def where_am_i() -> None:
    SEEN.append((running_rank(), cpu_defaults._in_rank()))


def checks_sparse_invariants() -> None:
    SEEN.append(torch.sparse.check_sparse_tensor_invariants.is_enabled())


def thread_call(name: str, argnames: tuple = ()) -> FunctionCall:
    return FunctionCall(test_id=f"t.py::{name}", module=__name__, qualname=name,
                        argnames=argnames, init=False)


class ThreadRanksShareThisProcess(unittest.TestCase):
    def test_seeded_once_whatever_the_process_drew_before(self) -> None:
        SEEN.clear()
        for seed in (1, 2):
            torch.manual_seed(seed)
            assert run.run_on_ranks(thread_call("draws", ("rank",)), "threads", 1, 10.0,
                                    None).report.status == "passed"
        self.assertEqual(SEEN[0], SEEN[1])

    def test_the_process_state_is_a_tests_while_they_run_and_given_back(self) -> None:
        SEEN.clear()
        torch.sparse.check_sparse_tensor_invariants.disable()
        outcome = run.run_on_ranks(thread_call("checks_sparse_invariants"), "threads", 1, 10.0,
                                   None)
        self.assertEqual((outcome.report.status, outcome.leaked), ("passed", None))
        self.assertEqual(SEEN, [True])  # on for the test, as a class's setUp turns it on
        self.assertFalse(torch.sparse.check_sparse_tensor_invariants.is_enabled())


class TheRunningRank(unittest.TestCase):
    def test_code_the_test_calls_finds_the_rank_it_runs_in(self) -> None:
        SEEN.clear()
        with mock.patch.object(cpu_defaults.decorators, "cpu_stands_in", return_value=True):
            run_function("where_am_i")
        (running, adapted), = SEEN
        self.assertIsInstance(running, FreshFunction)
        self.assertIs(adapted, running)
        self.assertEqual(running.id(), "t.py::where_am_i")
        self.assertIsNone(running_rank())  # only while the rank runs
