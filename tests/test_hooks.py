"""harness/launch/hooks.py: every base implements the rank hooks its launcher calls, by the
public names the protocols declare, and no launcher calls a base by a private name."""

from __future__ import annotations

import ast
import os
import unittest

from harness import (
    DTensorTestBase,
    FSDPTest,
    FSDPTestContinuous,
    FSDPTestMultiThread,
    MultiProcContinuousTest,
    MultiProcessTestCase,
    MultiThreadedTestCase,
)
from harness.launch.hooks import RankHooks, SharedRankHooks, ThreadRankHooks
from harness.pytest_plugin.rank_program import FreshFunction, SharedFunction, ThreadFunction

HARNESS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "harness")
LAUNCHERS = ("launch/in_process.py", "process/rank.py", "process/launchers.py",
             "process/shared.py", "process/torchrun.py", "threads/launcher.py")


class EveryBaseImplementsItsHooks(unittest.TestCase):
    def test_rank_hooks(self) -> None:
        for base in (MultiProcessTestCase, FSDPTest, DTensorTestBase, MultiProcContinuousTest,
                     MultiThreadedTestCase, FSDPTestMultiThread):
            with self.subTest(base=base.__name__):
                self.assertIsInstance(base(), RankHooks)

    def test_a_pytest_functions_rank_programs_implement_them_without_unittest(self) -> None:
        for program in (FreshFunction, SharedFunction, ThreadFunction):
            with self.subTest(program=program.__name__):
                self.assertIsInstance(program(), RankHooks)
                self.assertFalse(issubclass(program, unittest.TestCase))
        self.assertIsInstance(ThreadFunction(), ThreadRankHooks)
        self.assertNotIsInstance(FreshFunction(), ThreadRankHooks)
        self.assertIsInstance(SharedFunction, SharedRankHooks)

    def test_thread_rank_hooks(self) -> None:
        for base in (MultiThreadedTestCase, FSDPTestMultiThread):
            with self.subTest(base=base.__name__):
                self.assertIsInstance(base(), ThreadRankHooks)
        self.assertNotIsInstance(MultiProcessTestCase(), ThreadRankHooks)

    def test_shared_rank_hooks_are_the_classs(self) -> None:
        for base in (MultiProcContinuousTest, FSDPTestContinuous):
            with self.subTest(base=base.__name__):
                self.assertIsInstance(base, SharedRankHooks)
        self.assertNotIsInstance(MultiProcessTestCase, SharedRankHooks)


class LaunchersCallNoPrivateHook(unittest.TestCase):
    def test_no_launcher_calls_a_private_method_of_the_case(self) -> None:
        """A launcher reaches a case only through public names (unittest's own `_testMethodName`
        and upstream's `_run` aside)."""
        allowed = {"_testMethodName", "_run"}
        for path in LAUNCHERS:
            with open(os.path.join(HARNESS, path)) as f:
                tree = ast.parse(f.read())
            called = {
                node.func.attr for node in ast.walk(tree)
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in ("case", "rank_case", "cls")
                and node.func.attr.startswith("_")
            }
            with self.subTest(path=path):
                self.assertEqual(called - allowed, set())


if __name__ == "__main__":
    unittest.main()
