"""Leak checks of shared processes (harness/process/leaks.py, and their use by shared ranks).

The snapshots and their comparison are checked here in-process, each check on its own; the
shared-process classes of tests/leak_cases.py then check the whole path: each kind of leak
fails its test with a message naming it, and the next test runs on fresh ranks that never
saw it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import unittest
from typing import Dict, List, Tuple
from unittest import mock

import pytest
import torch

from harness.process import forkserver, leaks
from tests import leak_cases
from tests.test_multiprocess import RecordingResult


class ChecksTest(unittest.TestCase):
    def test_default_checks_leave_the_generator_out(self) -> None:
        self.assertEqual(leaks.checks_for(type("C", (), {})), frozenset(leaks.CHECKS))

    def test_opt_out_and_opt_in(self) -> None:
        cls = type("C", (), {"skip_leak_checks": ("environ",), "check_generator_leaks": True})
        self.assertEqual(
            leaks.checks_for(cls), frozenset(leaks.CHECKS) - {"environ"} | {"generator"}
        )

    def test_unknown_check_is_an_error_naming_it(self) -> None:
        cls = type("C", (), {"skip_leak_checks": ("environment",)})
        with self.assertRaisesRegex(leaks.LeakConfigError, "C.skip_leak_checks: unknown check "
                                    "'environment' \\(known: environ, "):
            leaks.checks_for(cls)


class SnapshotTest(unittest.TestCase):
    """Each check sees its own change, and only a change."""

    def found(self, checks: Tuple[str, ...], change, undo) -> List[str]:  # type: ignore[no-untyped-def]
        before = leaks.snapshot(checks)
        self.assertEqual(leaks.leaks(before, leaks.snapshot(checks)), [])
        change()
        try:
            return leaks.leaks(before, leaks.snapshot(checks))
        finally:
            undo()

    def test_environ(self) -> None:
        with mock.patch.dict(os.environ, {"HOME": "/root", "PATH": "/bin"}):
            before = leaks.snapshot(["environ"])
            os.environ.update({"HOME": "/elsewhere", "ADDED_A": "1", "ADDED_B": "2"})
            os.environ.pop("PATH")
            found = leaks.leaks(before, leaks.snapshot(["environ"]))
        self.assertEqual(found, ["ADDED_A, ADDED_B in os.environ", "PATH removed from os.environ",
                                 "HOME changed in os.environ"])

    def test_environ_set_by_torch_on_first_use_is_not_a_leak(self) -> None:
        with mock.patch.dict(os.environ):
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            before = leaks.snapshot(["environ"])
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = "/tmp/cache"
            self.assertEqual(leaks.leaks(before, leaks.snapshot(["environ"])), [])

    def test_default_dtype(self) -> None:
        found = self.found(("default_dtype",), lambda: torch.set_default_dtype(torch.float64),
                           lambda: torch.set_default_dtype(torch.float32))
        self.assertEqual(found, ["default dtype float64 (was float32)"])

    def test_default_device(self) -> None:
        found = self.found(("default_device",), lambda: torch.set_default_device("meta"),
                           lambda: torch.set_default_device(None))
        self.assertEqual(found, ["default device meta (was cpu)"])

    def test_grad_mode(self) -> None:
        found = self.found(("grad_mode",), lambda: torch.set_grad_enabled(False),
                           lambda: torch.set_grad_enabled(True))
        self.assertEqual(found, ["grad mode off (was on)"])

    def test_deterministic(self) -> None:
        found = self.found(
            ("deterministic",), lambda: torch.use_deterministic_algorithms(True, warn_only=True),
            lambda: torch.use_deterministic_algorithms(False),
        )
        self.assertEqual(found, ["deterministic algorithms warn only (was off)"])

    def test_threads_only_non_daemon_ones(self) -> None:
        stop = threading.Event()
        daemon = threading.Thread(target=stop.wait, daemon=True)
        worker = threading.Thread(target=stop.wait, name="left-running")
        found = self.found(("threads",), lambda: (daemon.start(), worker.start()),
                           lambda: (stop.set(), worker.join()))
        self.assertEqual(found, ["1 thread still running ('left-running')"])

    def test_process_groups_other_than_the_own_one(self) -> None:
        own, other = object(), object()
        groups = [own]
        with mock.patch.object(leaks.compat_distributed, "live_process_groups", lambda: groups):
            before = leaks.snapshot(["process_groups"], own)
            groups.append(other)
            after = leaks.snapshot(["process_groups"], own)
        self.assertEqual(leaks.leaks(before, after), ["1 process group not destroyed"])

    def test_device_mesh_groups_are_not_counted(self) -> None:
        mesh_group = mock.Mock(group_desc="mesh_tp")
        groups: List[object] = []
        with mock.patch.object(leaks.compat_distributed, "live_process_groups", lambda: groups):
            before = leaks.snapshot(["process_groups"])
            groups.append(mesh_group)
            self.assertEqual(leaks.leaks(before, leaks.snapshot(["process_groups"])), [])

    def test_generator_reseeded_or_drawn_from(self) -> None:
        state = torch.get_rng_state()
        self.addCleanup(torch.set_rng_state, state)
        torch.manual_seed(1234)
        before = leaks.snapshot(["generator"])
        torch.rand(1)
        self.assertEqual(leaks.leaks(before, leaks.snapshot(["generator"])),
                         ["default generator advanced (random numbers drawn from it)"])
        torch.manual_seed(7)
        self.assertEqual(leaks.leaks(before, leaks.snapshot(["generator"])),
                         ["default generator reseeded with 7 (was 1234)"])

    def test_unchecked_state_is_not_compared(self) -> None:
        before = leaks.snapshot(["grad_mode"])
        with mock.patch.dict(os.environ, {"ADDED": "1"}):
            self.assertEqual(leaks.leaks(before, leaks.snapshot(["grad_mode", "environ"])), [])

    def test_message_names_each_leak(self) -> None:
        found = ["LEAKED_VAR in os.environ", "default dtype float64 (was float32)",
                 "1 process group not destroyed"]
        self.assertEqual(
            leaks.leak_message("test_x", found),
            "test_x left LEAKED_VAR in os.environ; default dtype float64 (was float32); "
            "1 process group not destroyed",
        )

    def test_message_names_the_option_that_waives_the_leaks(self) -> None:
        self.assertEqual(
            leaks.leak_message("test_x", ["A in os.environ"], ["environ"]),
            'test_x left A in os.environ (skip_leak_checks=("environ",) waives it)',
        )
        message = leaks.leak_message("test_x", ["A in os.environ", "1 thread"],
                                     ["environ", "threads"])
        self.assertTrue(message.endswith('(skip_leak_checks=("environ", "threads") waives them)'))

    def test_the_leak_event_names_the_checks_that_found_something(self) -> None:
        before = leaks.snapshot(["grad_mode", "environ"])
        with mock.patch.dict(os.environ, {"ADDED": "1"}):
            event = leaks.leak_event("test_x", before, leaks.snapshot(["grad_mode", "environ"]))
        assert event is not None
        self.assertEqual(event.text, 'test_x left ADDED in os.environ '
                                     '(skip_leak_checks=("environ",) waives it)\n')
        self.assertEqual(event.status, leaks.LEAK_STATUS)
        self.assertIsNone(leaks.leak_event("test_x", before, before))

    def test_snapshot_is_cheap(self) -> None:
        checks = sorted(leaks.CHECKS)
        began = time.perf_counter()
        for _ in range(100):
            leaks.leaks(leaks.snapshot(checks), leaks.snapshot(checks))
        per_test = (time.perf_counter() - began) / 100
        self.assertLess(per_test, 0.005, "two snapshots and a comparison, per test")


@pytest.mark.slow
class SharedRanksTest(unittest.TestCase):
    """A whole shared class in this process's runner: outcomes per test and who ran them."""

    def run_class(self, cls: type) -> Tuple[Dict[str, str], str]:
        folder = tempfile.mkdtemp(prefix="harness-leaks-")
        self.addCleanup(shutil.rmtree, folder, ignore_errors=True)
        forkserver.context(cls.__module__)
        result = RecordingResult()
        with mock.patch.dict(os.environ, {leak_cases.PIDS_ENV: folder}):
            unittest.TestLoader().loadTestsFromTestCase(cls).run(result)
        outcomes = {test._testMethodName: f"failed: {text}" for test, text in result.failures}
        outcomes.update({test._testMethodName: f"error: {text}" for test, text in result.errors})
        return outcomes, folder

    def test_each_kind_of_leak_fails_its_test_and_the_next_runs_on_fresh_ranks(self) -> None:
        outcomes, folder = self.run_class(leak_cases.LeakEveryKind)
        expected = {
            "test_01_environ": "test_01_environ left LEAKED_VAR in os.environ",
            "test_02_default_dtype": "test_02_default_dtype left default dtype float64 "
                                     "(was float32)",
            "test_03_default_device": "test_03_default_device left default device meta (was cpu)",
            "test_04_grad_mode": "test_04_grad_mode left grad mode off (was on)",
            "test_05_deterministic": "test_05_deterministic left deterministic algorithms on "
                                     "(was off)",
            "test_06_process_group": "test_06_process_group left 1 process group not destroyed",
            "test_07_thread": "test_07_thread left 1 thread still running ('leaked-thread')",
            "test_08_generator": "test_08_generator left default generator reseeded with 7 "
                                 "(was 1234)",
            "test_10_three_at_once": "test_10_three_at_once left LEAKED_VAR in os.environ; "
                                     "default dtype float64 (was float32); "
                                     "1 process group not destroyed",
        }
        self.assertEqual(sorted(outcomes), sorted(expected), outcomes)
        for method, message in expected.items():
            self.assertIn(message, outcomes[method])
            self.assertIn("rank 0", outcomes[method])
        methods = sorted(m for m in dir(leak_cases.LeakEveryKind) if m.startswith("test_"))
        pids = leak_cases.pids_of(folder, methods)
        # after each leak, new ranks; after a clean test, the same ones
        fresh = [methods[i + 1] for i in range(len(methods) - 1) if pids[i] != pids[i + 1]]
        leaked = [methods[i + 1] for i, m in enumerate(methods[:-1]) if m in expected]
        self.assertEqual(fresh, leaked)

    def test_a_class_opts_out_of_named_checks(self) -> None:
        outcomes, folder = self.run_class(leak_cases.LeakOptedOut)
        self.assertEqual(outcomes, {})
        methods = ["test_1_leaks_what_is_not_checked", "test_2_sees_it"]
        pids = leak_cases.pids_of(folder, methods)
        self.assertEqual(pids[0], pids[1], "nothing checked leaked: the ranks were kept")

    def test_an_unknown_check_fails_the_tests_naming_it(self) -> None:
        outcomes, _ = self.run_class(leak_cases.LeakUnknownCheck)
        self.assertIn("LeakUnknownCheck.skip_leak_checks: unknown check 'environment'",
                      outcomes["test_anything"])
