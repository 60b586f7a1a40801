"""`-j N|auto` (harness/runner/parallel.py, harness/runner/worker.py).

In-process: how a plan is cut into units (shared-process and fixture classes whole, other
tests alone), what a unit costs, how many workers, which unit goes next. As subprocesses on
tests/fixtures/side_by_side.py: the same results, closing line and XML as a serial run; tests
really side by side; a shared-process class whole in one worker; a worker that dies fails
only its test; -x stops the run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Dict, List, Tuple
from unittest import mock

import pytest

from harness import settings
from harness.runner import parallel
from tests.fixtures import REPO, child_env
from tests.fixtures import side_by_side as fixture

MODULE = "tests.fixtures.side_by_side"


class Plain(unittest.TestCase):
    def test_1(self) -> None:
        pass

    def test_2(self) -> None:
        pass


class WithClassFixture(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        pass

    def test_1(self) -> None:
        pass

    def test_2(self) -> None:
        pass


class UnitsTest(unittest.TestCase):
    def test_plain_tests_alone_fixture_and_shared_classes_whole(self) -> None:
        tests = [Plain("test_1"), Plain("test_2"), WithClassFixture("test_1"),
                 WithClassFixture("test_2"), fixture.TestShared("test_a"),
                 fixture.TestShared("test_b")]
        units = parallel.units_of([("m", tests)], budget=8)
        self.assertEqual([len(u.tests) for u in units], [1, 1, 2, 2])
        self.assertEqual([u.cost for u in units], [1, 1, 1, 2])
        self.assertEqual([u.index for u in units], [0, 1, 2, 3])

    def test_cost_is_capped_by_the_budget(self) -> None:
        units = parallel.units_of([("m", [fixture.TestShared("test_a")])], budget=1)
        self.assertEqual(units[0].cost, 1)

    def test_pool_fits_typical_units_in_the_budget(self) -> None:
        def units(*costs: int) -> List[parallel.Unit]:
            return [parallel.Unit(i, "m", [], c) for i, c in enumerate(costs)]

        self.assertEqual(parallel.pool_size(units(2, 2, 2, 1), 2), 1)  # 2-rank tests, 2 cores
        self.assertEqual(parallel.pool_size(units(2,) * 40, 16), 8)
        self.assertEqual(parallel.pool_size(units(1, 1, 1), 16), 3)
        self.assertEqual(parallel.pool_size(units(4, 4, 4), 2), 1)

    def test_next_unit_fits_beside_those_running(self) -> None:
        hooks = parallel.Hooks(lambda i: None, lambda t, r, p: None, lambda m, s: None,
                               lambda: False)
        units = [parallel.Unit(i, "m", [], c) for i, c in enumerate((2, 3, 1))]
        with mock.patch.object(settings, "device_type", lambda: "cpu"):
            controller = parallel.Controller(units, 2, 4, hooks)
        self.assertEqual(controller._next_unit().index, 0)
        with mock.patch.object(controller, "_used", lambda: 2):
            self.assertEqual(controller._next_unit().index, 2, "3 cores do not fit beside 2")
            self.assertIsNone(controller._next_unit())
        with mock.patch.object(controller, "_used", lambda: 0):
            self.assertEqual(controller._next_unit().index, 1, "alone, any unit runs")

    def test_jobs(self) -> None:
        self.assertEqual(parallel.parse_jobs("3"), 3)
        self.assertEqual(parallel.parse_jobs("auto"), settings.machine_cores())
        with self.assertRaisesRegex(ValueError, "'0' is neither a positive integer nor 'auto'"):
            parallel.parse_jobs("0")


def _run(*args: str, env: Dict[str, str]) -> Tuple[subprocess.CompletedProcess, List[str]]:
    with tempfile.TemporaryDirectory() as folder:
        log = os.path.join(folder, "log")
        done = subprocess.run(
            [sys.executable, "run_all.py", MODULE, *args], cwd=REPO, capture_output=True,
            text=True, timeout=600, env=child_env({fixture.LOG_ENV: log, **env}),
        )
        lines = Path(log).read_text().splitlines() if os.path.exists(log) else []
    return done, lines


def _xml(folder: str) -> Dict[str, str]:
    return {
        path.name: re.sub(r'(time|timestamp)="[^"]*"', "", path.read_text())
        for path in Path(folder).glob("*.xml")
    }


@pytest.mark.slow
class SideBySideTest(unittest.TestCase):
    def test_same_results_and_xml_as_serial(self) -> None:
        with tempfile.TemporaryDirectory() as serial_xml, \
                tempfile.TemporaryDirectory() as parallel_xml:
            serial, _ = _run("--save-xml", serial_xml, env={})
            side, log = _run("--save-xml", parallel_xml, "-j", "3", env={})
            self.assertEqual(_xml(serial_xml), _xml(parallel_xml))
        self.assertEqual(side.returncode, 1, side.stdout + side.stderr)
        self.assertEqual(serial.stdout.splitlines()[-1], side.stdout.splitlines()[-1])
        self.assertEqual(side.stdout.splitlines()[-1], "6 passed, 1 failed, 0 skipped")
        self.assertIn("FAIL: tests.fixtures.side_by_side.TestPlain.test_3_fails", side.stdout)
        pids = dict(line.split() for line in log)
        plain = {pids[f"TestPlain.test_{n}"] for n in ("1", "2", "3_fails", "4_crashes", "5")}
        self.assertGreater(len(plain), 1, "plain tests ran in more than one worker")
        self.assertNotIn(str(os.getpid()), plain)
        self.assertEqual(pids["TestShared.test_a"], pids["TestShared.test_b"],
                         "a shared-process class runs whole in one worker")

    def test_a_dead_worker_fails_only_its_test(self) -> None:
        done, log = _run("-j", "2", env={fixture.CRASH_ENV: "1"})
        self.assertEqual(done.stdout.splitlines()[-1], "5 passed, 2 failed, 0 skipped",
                         done.stdout + done.stderr)
        self.assertIn("ERROR: tests.fixtures.side_by_side.TestPlain.test_4_crashes", done.stdout)
        self.assertIn("its worker exited with code 3 while running", done.stdout)

    def test_failfast_stops_every_worker(self) -> None:
        done, log = _run("-j", "2", "-x", "-k", "TestPlain", env={})
        self.assertEqual(done.returncode, 1)
        # test_1 and test_2 went to the two workers; test_3 fails on the first one free
        self.assertRegex(done.stdout.splitlines()[-1], r"^[12] passed, 1 failed, 0 skipped$")
        self.assertNotIn("TestPlain.test_5", " ".join(log))

    def test_run_tests_of_a_script(self) -> None:
        with tempfile.TemporaryDirectory() as folder:
            log = os.path.join(folder, "log")
            done = subprocess.run(
                [sys.executable, "tests/fixtures/side_by_side.py", "-j", "2", "-k", "TestPlain"],
                cwd=REPO, capture_output=True, text=True, timeout=600,
                env=child_env({fixture.LOG_ENV: log}),
            )
            pids = {line.split()[1] for line in Path(log).read_text().splitlines()}
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
        self.assertIn("FAIL: __main__.TestPlain.test_3_fails", done.stdout)
        self.assertEqual(done.stdout.splitlines()[-1], "4 passed, 1 failed, 0 skipped")
        self.assertGreater(len(pids), 1, "the script's tests ran in more than one worker")

    def test_bad_jobs_is_a_usage_error(self) -> None:
        done, _ = _run("-j", "many", env={})
        self.assertEqual(done.returncode, 2)
        self.assertIn("'many' is neither a positive integer nor 'auto'", done.stderr)
