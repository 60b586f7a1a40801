"""The shared-process mode (MultiProcContinuousTest): the process acceptance cases.

Each `Shared*` class of tests/fault_cases.py runs one case (`test_1_case`) and then
`test_2_after`, which must pass: the case's outcome and report must be the fresh mode's,
and whatever it did to its ranks must not reach the next test. Also: the ranks really are
shared between tests, a set left broken is replaced, and nothing is left running or on
disk after a class, even when the runner is stopped by SIGTERM in the middle of one.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import unittest
from typing import Any, Dict, List, Tuple
from unittest import mock

import pytest

from harness.process import forkserver
from harness.requirements.decorators import TEST_SKIPS
from tests import fault_cases
from tests.fault_cases import FAULT_DIR_ENV
from tests.fixtures import procs
from tests.test_multiprocess import ROOT, RecordingResult, _alive, _wait_until

pytestmark = pytest.mark.slow  # every test starts a class's rank processes


class SharedCaseTest(unittest.TestCase):
    """Runs a whole shared class (setUpClass, its tests, tearDownClass) in a private TMPDIR."""

    def setUp(self) -> None:
        self.fault_dir = tempfile.mkdtemp(prefix="harness-fault-")
        self.addCleanup(shutil.rmtree, self.fault_dir, ignore_errors=True)
        self.tmp = tempfile.mkdtemp(prefix="harness-shared-tmp-")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        patcher = mock.patch.dict(os.environ, {FAULT_DIR_ENV: self.fault_dir})
        patcher.start()
        self.addCleanup(patcher.stop)

    def run_class(
        self, name: str, errors: int = 0
    ) -> Tuple[Dict[str, Tuple[str, str]], RecordingResult]:
        """{test method: (outcome, message)} for every test of the class, in order."""
        cls = getattr(fault_cases, name)
        forkserver.context(cls.__module__)  # multiprocessing's own temp dir, made once, not here
        result = RecordingResult()
        with mock.patch.object(tempfile, "tempdir", self.tmp):
            unittest.TestLoader().loadTestsFromTestCase(cls).run(result)
        self.assertEqual(len(result.errors), errors, result.errors)
        self.assertEqual(result.testsRun, 2)
        outcomes: Dict[str, Tuple[str, str]] = {}
        kinds = (("failed", result.failures), ("skipped", result.skipped), ("error", result.errors))
        for kind, entries in kinds:
            for test, message in entries:
                method = getattr(test, "test_case", test)._testMethodName  # grid points too
                outcomes.setdefault(method, (kind, ""))
                outcomes[method] = (kind, outcomes[method][1] + message)
        for method in ("test_1_case", "test_2_after"):
            outcomes.setdefault(method, ("passed", ""))
        self.assertEqual(outcomes["test_2_after"], ("passed", ""), "the next test was affected")
        self.assertEqual(os.listdir(self.tmp), [], "the class left files behind")
        pids = self.pids("case") + self.pids("after")
        self.assertFalse([pid for pid in pids if _alive(pid)], "the class left ranks running")
        return outcomes, result

    def pids(self, prefix: str) -> List[int]:
        found = []
        for rank in (0, 1):
            path = os.path.join(self.fault_dir, f"{prefix}.{rank}")
            if os.path.exists(path):
                with open(path) as f:
                    found.append(int(f.read()))
        return found

    def failure_of(self, name: str, kind: str = "failed") -> str:
        """The report of test_1_case, which failed (or, `kind="error"`, errored: a rank's
        exception other than an assertion's is an error, as unittest's)."""
        outcomes, _ = self.run_class(name, errors=int(kind == "error"))
        found, message = outcomes["test_1_case"]
        self.assertEqual(found, kind, message)
        return message


class TestSharedOutcomes(SharedCaseTest):
    def test_pass_and_the_ranks_are_shared(self) -> None:
        outcomes, _ = self.run_class("SharedPass")
        self.assertEqual(outcomes["test_1_case"], ("passed", ""))
        self.assertEqual(len(self.pids("case")), 2)
        self.assertEqual(self.pids("case"), self.pids("after"), "each test got new ranks")

    def test_exception_on_one_rank(self) -> None:
        message = self.failure_of("SharedRaiseOnRank1", "error")
        self.assertIn("RankError: rank 1 raised", message)
        self.assertIn('fault_cases.py", line', message)
        self.assertIn("ValueError: boom from rank 1", message)
        self.assertNotIn("rank 0 raised", message)

    def test_exception_on_all_ranks(self) -> None:
        message = self.failure_of("SharedRaiseOnAll", "error")
        for rank in (0, 1):
            self.assertIn(f"rank {rank} raised:", message)
            self.assertIn(f"ValueError: boom from rank {rank}", message)

    def test_exit_code(self) -> None:
        message = self.failure_of("SharedExitCode")
        self.assertIn("rank 1 exited with code 3", message)
        self.assertNotIn("rank 0", message.splitlines()[-1])

    def test_sigsegv_on_non_first_rank(self) -> None:
        message = self.failure_of("SharedSigsegvOnRank1")
        self.assertIn("rank 1 died by signal SIGSEGV", message)
        # The stack it crashed with, taken out of its output (no faulthandler noise).
        self.assertIn("rank 1 died by signal SIGSEGV; its stack (most recent call last):", message)
        self.assertIn(", in test_sigsegv_on_rank_1\n    ctypes.string_at(0)", message)
        self.assertNotIn("Extension modules", message)

    def test_fail_fast_stops_the_other_rank(self) -> None:
        message = self.failure_of("SharedFailFast", "error")
        self.assertIn("ValueError: rank 0 gives up early", message)
        self.assertIn("rank 1 was still running and was stopped", message)
        self.assertIn("in sleep_a_long_time", message)
        self.assertNotIn("timed out", message)

    @pytest.mark.timeout(90)  # a limit of its own: a harness that never times out fails here
    def test_hang_shows_every_stack_and_collective(self) -> None:
        message = self.failure_of("SharedHang", "error")  # a timeout is an error
        self.assertIn("timed out after 8 s with rank 0, rank 1 still running", message)
        self.assertIn("Collectives of each rank", message)
        for rank in (0, 1):
            stack = message.split(f"--- stack of rank {rank} ---", 1)[1]
            self.assertIn("in hang_forever", stack.split("---", 1)[0])

    def test_output_of_the_test_in_its_report(self) -> None:
        message = self.failure_of("SharedOutput", "error")
        for rank in (0, 1):
            self.assertIn(f"[rank {rank}] stdout line of rank {rank}", message)
            self.assertIn(f"[rank {rank}] fd 2 line of rank {rank}", message)

    def test_failing_grid_points_reported_each(self) -> None:
        _, result = self.run_class("SharedGrid")
        failed = {str(test): text for test, text in result.failures}
        self.assertEqual(len(failed), 2, failed)
        point1 = next(text for name, text in failed.items() if "(x=1)" in name)
        point2 = next(text for name, text in failed.items() if "(x=2)" in name)
        self.assertIn("AssertionError: point 1 fails on rank 1", point1)
        self.assertNotIn("rank 0 failed", point1)
        for rank in (0, 1):
            self.assertIn(f"AssertionError: point 2 fails on rank {rank}", point2)
        points = sorted(str(sub.params["x"]) for sub, _ in result.subtests if sub.params)
        self.assertEqual(points, ["0", "1", "2", "3"])


class TestSharedSkips(SharedCaseTest):
    def skip_reason(self, name: str) -> str:
        outcomes, _ = self.run_class(name)
        kind, reason = outcomes["test_1_case"]
        self.assertEqual(kind, "skipped", reason)
        return reason

    def test_skip_on_one_rank(self) -> None:
        self.assertEqual(self.skip_reason("SharedSkipOnRank1"), "rank 1 cannot run this")

    def test_skip_on_all_ranks(self) -> None:
        self.assertEqual(self.skip_reason("SharedSkipOnAll"), "no rank can run this")

    def test_skip_by_sys_exit_with_skip_code(self) -> None:
        reason = self.skip_reason("SharedSkipBySysExit")
        self.assertEqual(reason, TEST_SKIPS["multi-gpu-2"].message)

    def test_skip_by_exit_code(self) -> None:
        reason = self.skip_reason("SharedSkipByExitCode")
        self.assertEqual(reason, TEST_SKIPS["small_worldsize"].message)


class TestBrokenSets(SharedCaseTest):
    def test_group_left_out_of_step_is_replaced(self) -> None:
        outcomes, _ = self.run_class("SharedBrokenGroup")
        self.assertEqual(outcomes["test_1_case"], ("passed", ""))
        self.assertFalse(set(self.pids("case")) & set(self.pids("after")), "ranks were reused")

    def test_destroyed_group_is_replaced(self) -> None:
        outcomes, _ = self.run_class("SharedDestroyedGroup")
        self.assertEqual(outcomes["test_1_case"], ("passed", ""))
        self.assertFalse(set(self.pids("case")) & set(self.pids("after")), "ranks were reused")

    def test_parent_set_up_failing_after_sending_the_test(self) -> None:
        outcomes, _ = self.run_class("SharedParentSetUpFails", errors=1)
        kind, message = outcomes["test_1_case"]
        self.assertEqual(kind, "error")
        self.assertIn("the parent's setUp fails after sending the test", message)


_SCRIPT = textwrap.dedent(
    """
    import os
    import time

    from harness import MultiProcContinuousTest, run_tests


    class Shared(MultiProcContinuousTest):
        world_size = 2

        def test_1(self):
            with open(os.path.join(os.environ["HARNESS_FAULT_DIR"], f"pid.{self.rank}"), "w") as f:
                f.write(str(os.getpid()))

        def test_2(self):
            if os.environ.get("SLEEP_IN_TEST_2"):
                with open(os.path.join(os.environ["HARNESS_FAULT_DIR"], "sleeping"), "w") as f:
                    f.write("yes")
                time.sleep(600)


    if __name__ == "__main__":
        run_tests()
    """
)


def _session_processes(sid: int) -> List[int]:
    """Live processes of session `sid` (zombies do not count)."""
    return [p.pid for p in procs.processes() if p.session == sid and p.state not in ("Z", "X")]


class TestNothingLeft(SharedCaseTest):
    """A runner in its own session and TMPDIR: after it, no process of the session, no file."""

    def start_runner(self, env: Dict[str, str]) -> Any:
        script = os.path.join(self.fault_dir, "shared_script.py")
        with open(script, "w") as f:
            f.write(_SCRIPT)
        runner_env = {**os.environ, "TMPDIR": self.tmp, "PYTHONPATH": ROOT, **env}
        log = open(os.path.join(self.fault_dir, "runner.log"), "w")
        self.addCleanup(log.close)
        runner = subprocess.Popen(
            [sys.executable, script], cwd=ROOT, env=runner_env, stdout=log, stderr=log,
            start_new_session=True,
        )
        self.addCleanup(lambda: runner.poll() is None and runner.kill())
        return runner

    def assert_nothing_left(self, runner: Any) -> None:
        self.assertTrue(
            _wait_until(lambda: not _session_processes(runner.pid), 30),
            f"processes left: {_session_processes(runner.pid)}",
        )
        self.assertEqual(os.listdir(self.tmp), [])

    def log(self) -> str:
        with open(os.path.join(self.fault_dir, "runner.log")) as f:
            return f.read()

    def test_after_a_class(self) -> None:
        runner = self.start_runner({})
        self.assertEqual(runner.wait(300), 0, self.log())
        self.assertEqual(len(self.pids("pid")), 2)
        self.assert_nothing_left(runner)

    def test_after_sigterm_in_the_middle_of_a_class(self) -> None:
        runner = self.start_runner({"SLEEP_IN_TEST_2": "1"})
        sleeping = os.path.join(self.fault_dir, "sleeping")
        self.assertTrue(_wait_until(lambda: os.path.exists(sleeping), 300), self.log())
        runner.send_signal(signal.SIGTERM)
        self.assertEqual(runner.wait(60), 128 + signal.SIGTERM, self.log())
        self.assert_nothing_left(runner)


if __name__ == "__main__":
    unittest.main()
