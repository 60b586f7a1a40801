"""Shared-process classes whose tests leave process state behind, for tests/test_leaks.py.

In `LeakEveryKind`, test N first checks that nothing an earlier test left is there (the
state a fresh rank starts with), records its pid, then leaks one kind of state. Ranks import
this module by name, so the classes live at module level (and outside test_*.py, so pytest
does not collect them).
"""

from __future__ import annotations

import os
import threading
from typing import List

import torch
import torch.distributed as dist

from harness.process.continuous import MultiProcContinuousTest

PIDS_ENV = "HARNESS_LEAK_CASES_DIR"  # where each test writes the pid of the rank that ran it
_stop_threads = threading.Event()


def _record_pid(case: MultiProcContinuousTest) -> None:
    folder = os.environ[PIDS_ENV]
    with open(os.path.join(folder, f"{case._testMethodName}.{case.rank}"), "w") as f:
        f.write(str(os.getpid()))


class _CleanStart(MultiProcContinuousTest):
    world_size = 2

    def assert_clean(self) -> None:
        """The state of a rank no test has touched: what each leak below changes."""
        self.assertNotIn("LEAKED_VAR", os.environ)
        self.assertEqual(torch.get_default_dtype(), torch.float32)
        self.assertEqual(torch.get_default_device(), torch.device("cpu"))
        self.assertTrue(torch.is_grad_enabled())
        self.assertFalse(torch.are_deterministic_algorithms_enabled())
        alive = [t.name for t in threading.enumerate() if t.name == "leaked-thread"]
        self.assertEqual(alive, [])
        self.assertEqual(torch.initial_seed(), 1234)


class LeakEveryKind(_CleanStart):
    check_generator_leaks = True

    def rank_set_up(self) -> None:  # in each rank before each test (setUp: the parent's)
        super().rank_set_up()
        self.assert_clean()
        _record_pid(self)

    def test_01_environ(self) -> None:
        os.environ["LEAKED_VAR"] = "1"

    def test_02_default_dtype(self) -> None:
        torch.set_default_dtype(torch.float64)

    def test_03_default_device(self) -> None:
        torch.set_default_device("meta")

    def test_04_grad_mode(self) -> None:
        torch.set_grad_enabled(False)

    def test_05_deterministic(self) -> None:
        torch.use_deterministic_algorithms(True)

    def test_06_process_group(self) -> None:
        dist.new_group([0, 1])

    def test_07_thread(self) -> None:
        threading.Thread(target=_stop_threads.wait, args=(60,), name="leaked-thread").start()

    def test_08_generator(self) -> None:
        torch.manual_seed(7)

    def test_09_clean(self) -> None:
        torch.rand(1, generator=torch.Generator())  # its own generator: the default one untouched

    def test_10_three_at_once(self) -> None:
        self.test_01_environ()
        self.test_02_default_dtype()
        self.test_06_process_group()

    def test_11_clean(self) -> None:
        pass


class LeakOptedOut(_CleanStart):
    """Skips the environ and dtype checks; does not opt into the generator's."""

    skip_leak_checks = ("environ", "default_dtype")

    def rank_set_up(self) -> None:  # in each rank before each test (setUp: the parent's)
        super().rank_set_up()
        _record_pid(self)

    def test_1_leaks_what_is_not_checked(self) -> None:
        os.environ["LEAKED_VAR"] = "1"
        torch.set_default_dtype(torch.float64)
        torch.rand(3)

    def test_2_sees_it(self) -> None:
        self.assertEqual(os.environ.get("LEAKED_VAR"), "1")
        self.assertEqual(torch.get_default_dtype(), torch.float64)


class LeakUnknownCheck(_CleanStart):
    skip_leak_checks = ("environment",)

    def test_anything(self) -> None:
        pass


def pids_of(folder: str, methods: List[str]) -> List[str]:
    """The pid of rank 0 for each test method (as each recorded it)."""
    found = []
    for method in methods:
        with open(os.path.join(folder, f"{method}.0")) as f:
            found.append(f.read())
    return found
