"""--order forward|reverse|shuffle (harness/runner/order.py): what reorders, what stays.

In-process: the rule (each class's tests and each file's classes reordered, files kept, a
class's tests together, shuffles seeded and stable under -k). As subprocesses: the order the
tests of tests/fixtures/ordered.py observe from inside, under run_all.py and run_tests(), and
the summary line that replays it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import unittest
from typing import List
from unittest import mock

import pytest

from harness.runner import order
from tests.fixtures import REPO, child_env
from tests.fixtures.ordered import LOG_ENV

ORDERED = "tests.fixtures.ordered"


def _class(name: str, module: str, methods: List[str]) -> type:
    cls = type(name, (unittest.TestCase,), {m: lambda self: None for m in methods})
    cls.__module__ = module
    return cls


FILE_A_ONE = _class("One", "a", ["test_1", "test_2", "test_3"])
FILE_A_TWO = _class("Two", "a", ["test_1", "test_2"])
FILE_B = _class("Three", "b", ["test_1", "test_2", "test_3", "test_4"])


def _tests() -> List[unittest.TestCase]:
    return [cls(m) for cls in (FILE_A_ONE, FILE_A_TWO, FILE_B)
            for m in sorted(vars(cls)) if m.startswith("test_")]


def _ids(tests: List[unittest.TestCase]) -> List[str]:
    return [f"{type(t).__module__}.{type(t).__name__}.{t._testMethodName}" for t in tests]


class ReorderTest(unittest.TestCase):
    def test_forward_keeps_the_written_order(self) -> None:
        tests = _tests()
        self.assertEqual(order.reorder(tests, "forward", 1), tests)

    def test_reverse_reverses_classes_and_tests_within_each_file(self) -> None:
        self.assertEqual(_ids(order.reorder(_tests(), "reverse", 1)), [
            "a.Two.test_2", "a.Two.test_1", "a.One.test_3", "a.One.test_2", "a.One.test_1",
            "b.Three.test_4", "b.Three.test_3", "b.Three.test_2", "b.Three.test_1",
        ])

    def test_shuffle_is_a_seeded_permutation_keeping_classes_together(self) -> None:
        tests = _tests()
        shuffled = _ids(order.reorder(tests, "shuffle", 7))
        self.assertEqual(shuffled, _ids(order.reorder(tests, "shuffle", 7)))
        self.assertEqual(sorted(shuffled), sorted(_ids(tests)))
        classes = [test_id.rsplit(".", 1)[0] for test_id in shuffled]
        runs = [c for i, c in enumerate(classes) if i == 0 or classes[i - 1] != c]
        self.assertEqual(len(runs), 3, "a class's tests stay together")
        self.assertTrue(all(c.startswith("a.") for c in classes[:5]), "files stay in order")
        seeds = {tuple(_ids(order.reorder(tests, "shuffle", seed))) for seed in range(20)}
        self.assertGreater(len(seeds), 10, "the seed changes the order")

    def test_shuffle_of_a_class_does_not_depend_on_what_else_runs(self) -> None:
        alone = [FILE_B(m) for m in ("test_1", "test_2", "test_3", "test_4")]
        with_others = [t for t in order.reorder(_tests(), "shuffle", 3) if type(t) is FILE_B]
        self.assertEqual(_ids(order.reorder(alone, "shuffle", 3)), _ids(with_others))

    def test_chosen_order_flag_then_env(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != order.ORDER_ENV}
        with mock.patch.dict(os.environ, env, clear=True):
            self.assertEqual(order.chosen_order(None), "forward")
            os.environ[order.ORDER_ENV] = "shuffle"
            self.assertEqual(order.chosen_order(None), "shuffle")
            self.assertEqual(order.chosen_order("reverse"), "reverse")
            os.environ[order.ORDER_ENV] = "sideways"
            with self.assertRaisesRegex(order.OrderError, "HARNESS_ORDER: 'sideways' is not one"):
                order.chosen_order(None)

    def test_describe_says_how_to_replay(self) -> None:
        self.assertIsNone(order.describe("forward", 5))
        self.assertEqual(order.describe("shuffle", 5),
                         "order: shuffle, seed 5 (replay: --order shuffle --seed 5)")


WRITTEN = [f"{c}.test_{m}" for c, ms in
           (("TestFirst", "abc"), ("TestSecond", "ab"), ("TestShared", "abc")) for m in ms]


@pytest.mark.slow
class OrderFromInsideTest(unittest.TestCase):
    """The order the fixture's tests (plain and shared-process) see themselves run in."""

    def run_logged(self, command: List[str], env: dict) -> tuple:
        with tempfile.TemporaryDirectory() as folder:
            log = os.path.join(folder, "order.log")
            done = subprocess.run(command, cwd=REPO, env=child_env({LOG_ENV: log, **env}),
                                  capture_output=True, text=True, timeout=300)
            seen = []
            if os.path.exists(log):
                with open(log) as f:
                    seen = f.read().split()
        return done, seen

    def test_run_all_reverse(self) -> None:
        done, seen = self.run_logged(
            [sys.executable, "run_all.py", ORDERED, "--order", "reverse"], {})
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertEqual(seen, [
            "TestShared.test_c", "TestShared.test_b", "TestShared.test_a",
            "TestSecond.test_b", "TestSecond.test_a",
            "TestFirst.test_c", "TestFirst.test_b", "TestFirst.test_a",
        ])
        lines = done.stdout.strip().splitlines()
        self.assertEqual(lines[-2:], ["order: reverse (replay: --order reverse)",
                                      "8 passed, 0 failed, 0 skipped"])

    def test_run_all_shuffle_from_the_env_replays_with_its_seed(self) -> None:
        command = [sys.executable, "run_all.py", ORDERED, "--seed", "11"]
        done, seen = self.run_logged(command, {order.ORDER_ENV: "shuffle"})
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertIn("order: shuffle, seed 11 (replay: --order shuffle --seed 11)", done.stdout)
        self.assertEqual(sorted(seen), sorted(WRITTEN))
        self.assertNotEqual(seen, WRITTEN)
        _, again = self.run_logged([*command, "--order", "shuffle"], {})
        self.assertEqual(again, seen)

    def test_run_tests_reverse(self) -> None:
        done, seen = self.run_logged(
            [sys.executable, "tests/fixtures/ordered.py", "--order", "reverse"], {})
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertEqual(seen, [*WRITTEN[5:][::-1], *WRITTEN[3:5][::-1], *WRITTEN[:3][::-1]])
        self.assertIn("order: reverse (replay: --order reverse)", done.stderr)

    def test_bad_order_is_a_usage_error(self) -> None:
        done, _ = self.run_logged([sys.executable, "run_all.py", ORDERED, "--order", "up"], {})
        self.assertEqual(done.returncode, 2)
        self.assertIn("--order: invalid choice: 'up'", done.stderr)
        done, _ = self.run_logged(
            [sys.executable, "tests/fixtures/ordered.py"], {order.ORDER_ENV: "up"})
        self.assertEqual(done.returncode, 2)
        self.assertEqual(done.stderr.strip(),
                         "ordered.py: error: HARNESS_ORDER: 'up' is not one of "
                         "forward, reverse, shuffle")
