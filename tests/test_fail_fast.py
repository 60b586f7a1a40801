"""harness/launch/fail_fast.py: the one fail-fast policy, and every launch mode using it."""

from __future__ import annotations

import ast
import os
import unittest
from unittest import mock

from harness import settings
from harness.launch import fail_fast
from harness.launch.fail_fast import GRACE_S, FailFast, ended_test
from harness.outcome.rank_record import Event, RankRecord

HARNESS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "harness")


def record(rank: int, *kinds: str) -> RankRecord:
    return RankRecord(rank, events=[Event(kind) for kind in kinds])


class Policy(unittest.TestCase):
    def setUp(self) -> None:
        patcher = mock.patch.dict(os.environ, {settings.DEBUG_RANK_ENV: ""})
        patcher.start()
        self.addCleanup(patcher.stop)

    def test_nothing_is_stopped_while_no_rank_ended_the_test(self) -> None:
        policy = FailFast()
        running = [record(0, "success"), record(1), record(2, "subtest")]  # a grid point: no end
        self.assertEqual(policy.stop_at(running), float("inf"))
        self.assertFalse(policy.triggered)

    def test_the_others_get_the_grace_from_the_first_rank_seen_ending_it(self) -> None:
        policy = FailFast()
        with mock.patch.object(fail_fast.time, "monotonic", return_value=100.0):
            self.assertEqual(policy.stop_at([record(0, "failure"), record(1)]), 100.0 + GRACE_S)
        with mock.patch.object(fail_fast.time, "monotonic", return_value=105.0):
            self.assertEqual(policy.stop_at([record(0, "failure"), record(1, "failure")]),
                             100.0 + GRACE_S)
        self.assertTrue(policy.triggered)

    def test_a_failure_an_exit_or_a_skip_ends_the_test(self) -> None:
        for kinds in (("failure",), ("expected_failure",), ("exit",), ("skip",)):
            with self.subTest(kinds=kinds):
                self.assertTrue(ended_test(record(0, *kinds)))
        self.assertTrue(ended_test(RankRecord(0, exitcode=-9)))  # a crash
        for kinds in ((), ("success", "done"), ("subtest",), ("unexpected_success",)):
            with self.subTest(kinds=kinds):
                self.assertFalse(ended_test(record(0, *kinds)))

    def test_never_while_a_rank_is_debugged(self) -> None:
        os.environ[settings.DEBUG_RANK_ENV] = "1"
        self.assertEqual(FailFast().stop_at([record(0, "failure")]), float("inf"))


class EveryModeUsesIt(unittest.TestCase):
    """Fresh and shared processes (the supervisor), threads and torchrun ask the one policy;
    none keeps a grace of its own."""

    def test_each_launcher_asks_the_policy(self) -> None:
        for path in ("process/supervisor.py", "threads/launcher.py", "process/torchrun.py"):
            with self.subTest(path=path):
                with open(os.path.join(HARNESS, path)) as f:
                    source = f.read()
                names = {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
                names |= {n.attr for n in ast.walk(ast.parse(source))
                          if isinstance(n, ast.Attribute)}
                self.assertIn("FailFast", names)
                self.assertNotIn("FAIL_FAST_GRACE", source)


if __name__ == "__main__":
    unittest.main()
