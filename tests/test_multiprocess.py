"""Fault injection for MultiProcessTestCase: one test per outcome, checking outcome and message.

Each test runs a case from tests/fault_cases.py through `case.run(result)` and inspects
what the harness reported to unittest.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from typing import Any, Dict, List, Optional, Tuple
from unittest import mock

import pytest
import torch.distributed as dist

from harness import settings
from harness.launch.context import RankContext
from harness.launch.launcher import Launcher, RankSetup
from harness.outcome.rank_record import RankRecord, RecordSink, ReportingResult
from harness.process import torchrun
from harness.process.multiprocess_case import DistributedTestBase, MultiProcessTestCase
from harness.process.supervisor import RankGroup
from harness.requirements.decorators import TEST_SKIPS, skip_if_no_gpu
from harness.settings import HarnessConfigError
from tests import fault_cases
from tests.fault_cases import FAULT_DIR_ENV
from tests.fixtures import procs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class RecordingResult(unittest.TestResult):
    """A TestResult that also keeps passing subtests, to see every grid point reported."""

    def __init__(self) -> None:
        super().__init__()
        self.subtests: List[Tuple[Any, Any]] = []

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802
        super().addSubTest(test, subtest, err)
        self.subtests.append((subtest, err))


def _alive(pid: int) -> bool:
    """Whether pid is a live process (a zombie waiting to be reaped counts as dead)."""
    found = procs.process(pid)
    return found is not None and found.state not in ("Z", "X")


def _wait_until(condition: Any, limit_s: float) -> bool:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


class FaultTestBase(unittest.TestCase):
    def setUp(self) -> None:
        self.fault_dir = tempfile.mkdtemp(prefix="harness-fault-")
        self.addCleanup(lambda: __import__("shutil").rmtree(self.fault_dir, ignore_errors=True))
        patcher = mock.patch.dict(os.environ, {FAULT_DIR_ENV: self.fault_dir})
        patcher.start()
        self.addCleanup(patcher.stop)

    def run_case(self, cls: type, name: str, env: Optional[Dict[str, str]] = None) -> Any:
        case = cls(name)
        result = RecordingResult()
        with mock.patch.dict(os.environ, env or {}):
            case.run(result)
        self.assertEqual(result.testsRun, 1)
        harness_errors = [text for _, text in result.errors if "RankError: " not in text]
        self.assertEqual(harness_errors, [], "the harness itself raised")
        self.addCleanup(self._assert_private_dir_removed, case)
        return case, result

    def _assert_private_dir_removed(self, case: Any) -> None:
        if case.file_name is not None:
            self.assertFalse(os.path.exists(os.path.dirname(case.file_name)))

    def failure_of(self, cls: type, name: str) -> str:
        """The report of a test that failed or errored (a rank's exception other than an
        assertion's is an error, as unittest's)."""
        _, result = self.run_case(cls, name)
        reported = result.failures + result.errors
        self.assertEqual(len(reported), 1, reported)
        return reported[0][1]

    def noted(self, name: str) -> str:
        with open(os.path.join(self.fault_dir, name)) as f:
            return f.read()


@pytest.mark.slow
class TestOutcomes(FaultTestBase):
    def test_pass(self) -> None:
        case, result = self.run_case(fault_cases.Passing, "test_all_reduce")
        self.assertTrue(result.wasSuccessful())
        self.assertEqual((result.failures, result.skipped), ([], []))
        self.assertEqual([r.exitcode for r in case.rank_records], [0, 0])
        self.assertTrue(all(r.duration > 0 for r in case.rank_records), case.rank_records)

    def test_an_override_of_run_with_four_parameters_runs(self) -> None:
        _, result = self.run_case(fault_cases.OwnRun, "test_all_reduce")
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        self.assertEqual([self.noted(f"own_run.{rank}") for rank in (0, 1)],
                         ["test_all_reduce"] * 2)

    def test_exception_on_one_rank(self) -> None:
        _, result = self.run_case(fault_cases.Failing, "test_raise_on_rank_1")
        self.assertEqual(result.failures, [])  # a ValueError is an error, as unittest's
        message = result.errors[0][1]
        self.assertIn("RankError: rank 1 raised", message)
        self.assertNotIn("harness", message.split("rank 1 raised:")[1])  # no harness frames
        self.assertIn('fault_cases.py", line', message)
        self.assertIn("ValueError: boom from rank 1", message)
        self.assertNotIn("rank 0 raised", message)

    def test_exception_on_all_ranks(self) -> None:
        message = self.failure_of(fault_cases.Failing, "test_raise_on_all_ranks")
        for rank in (0, 1):
            self.assertIn(f"rank {rank} raised:", message)
            self.assertIn(f"ValueError: boom from rank {rank}", message)

    def test_exit_code(self) -> None:
        message = self.failure_of(fault_cases.Failing, "test_exit_code")
        self.assertIn("rank 1 exited with code 3", message)
        self.assertNotIn("rank 0", message.splitlines()[0])

    def test_sigsegv_on_non_first_rank(self) -> None:
        message = self.failure_of(fault_cases.Failing, "test_sigsegv_on_rank_1")
        self.assertIn("rank 1 died by signal SIGSEGV", message)
        # The stack it crashed with, out of its output, without faulthandler's noise.
        self.assertIn(
            "rank 1 died by signal SIGSEGV; its stack (most recent call last):\n"
            '  File "' + fault_cases.__file__ + '", line ', message
        )
        self.assertIn(", in test_sigsegv_on_rank_1\n    ctypes.string_at(0)", message)
        self.assertNotIn("Fatal Python error", message)
        self.assertNotIn("Extension modules", message)

    def test_sigkill_on_non_first_rank(self) -> None:
        message = self.failure_of(fault_cases.Failing, "test_sigkill_on_rank_1")
        self.assertIn("rank 1 died by signal SIGKILL", message)

    def test_fail_fast_stops_other_ranks(self) -> None:
        # Rank 1 would sleep 600 s (timeout 60 s): it must be stopped once rank 0 failed.
        message = self.failure_of(fault_cases.Failing, "test_fail_fast")
        self.assertIn("RankError: rank 0 raised", message)
        self.assertIn("ValueError: rank 0 gives up early", message)
        self.assertIn("rank 1 was still running and was stopped", message)
        self.assertIn("in sleep_a_long_time", message)
        self.assertNotIn("timed out", message)

    @pytest.mark.timeout(60)  # a limit of its own: a harness that never times out fails here
    def test_timeout_shows_every_stack(self) -> None:
        message = self.failure_of(fault_cases.Hanging, "test_hang")
        head = "RankError: timed out after 3 s with rank 0, rank 1 still running"  # an error
        self.assertIn(head, message)
        for rank in (0, 1):
            stack = message.split(f"--- stack of rank {rank} ---", 1)[1]
            self.assertIn("in hang_forever", stack.split("---", 1)[0])

    def test_captured_output_prefixed_by_rank(self) -> None:
        message = self.failure_of(fault_cases.Failing, "test_output")
        for rank in (0, 1):
            self.assertIn(f"[rank {rank}] stdout line of rank {rank}", message)
            self.assertIn(f"[rank {rank}] fd 2 line of rank {rank}", message)

    def test_output_streamed_live_when_asked(self) -> None:
        shown = io.StringIO()
        with contextlib.redirect_stdout(shown):
            _, result = self.run_case(
                fault_cases.Passing, "test_prints", env={"HARNESS_SHOW_OUTPUT": "1"}
            )
        self.assertTrue(result.wasSuccessful())
        for rank in (0, 1):
            self.assertIn(f"[rank {rank}] hello from rank {rank}\n", shown.getvalue())

    def test_expected_failure(self) -> None:
        _, result = self.run_case(fault_cases.Failing, "test_expected_failure")
        self.assertEqual(result.failures, [])
        self.assertEqual(len(result.expectedFailures), 1)
        self.assertIn("ValueError: known bug on rank 1", result.expectedFailures[0][1])


class TestSkips(FaultTestBase):
    def skip_reason(self, name: str) -> str:
        _, result = self.run_case(fault_cases.Skipping, name)
        self.assertEqual(result.failures, [])
        self.assertEqual(len(result.skipped), 1)
        return result.skipped[0][1]

    @pytest.mark.slow
    def test_skip_on_one_rank(self) -> None:
        self.assertEqual(self.skip_reason("test_skip_on_rank_1"), "rank 1 cannot run this")

    @pytest.mark.slow
    def test_skip_on_all_ranks(self) -> None:
        self.assertEqual(self.skip_reason("test_skip_on_all_ranks"), "no rank can run this")

    @pytest.mark.slow
    def test_skip_by_sys_exit_with_skip_code(self) -> None:
        reason = self.skip_reason("test_skip_by_sys_exit")
        self.assertEqual(reason, TEST_SKIPS["multi-gpu-2"].message)

    @pytest.mark.slow
    def test_skip_by_exit_code(self) -> None:
        reason = self.skip_reason("test_skip_by_exit_code")
        self.assertEqual(reason, TEST_SKIPS["small_worldsize"].message)

    def test_skip_decorator_starts_no_process(self) -> None:
        case, result = self.run_case(fault_cases.Skipping, "test_needs_many_gpus")
        self.assertEqual(len(result.skipped), 1)
        self.assertIn("Need at least 64 CUDA devices", result.skipped[0][1])
        self.assertEqual((case.processes, case.rank_records, case.file_name), ([], [], None))
        self.assertFalse(os.path.exists(os.path.join(self.fault_dir, "started")))


@pytest.mark.slow
class TestGrid(FaultTestBase):
    def test_failing_points_reported_each_and_the_rest_still_run(self) -> None:
        case, result = self.run_case(fault_cases.Grid, "test_grid")
        self.assertFalse(result.wasSuccessful())
        reported = {str(sub.params["x"]): err for sub, err in result.subtests}
        self.assertEqual(sorted(reported), ["0", "1", "2", "3"])
        self.assertIsNone(reported["0"])
        self.assertIsNone(reported["3"])
        failures = {str(test): text for test, text in result.failures}
        point1 = next(text for name, text in failures.items() if "(x=1)" in name)
        point2 = next(text for name, text in failures.items() if "(x=2)" in name)
        self.assertIn("rank 1 failed this grid point", point1)
        self.assertIn("AssertionError: point 1 fails on rank 1", point1)
        self.assertNotIn("rank 0 failed", point1)
        for rank in (0, 1):
            self.assertIn(f"AssertionError: point 2 fails on rank {rank}", point2)
            self.assertEqual(self.noted(f"point3.{rank}"), "ran")
        self.assertEqual(len(result.failures), 2)
        self.assertEqual([r.grid_points for r in case.rank_records], [4, 4])

    def test_ranks_out_of_step_end_the_grid(self) -> None:
        case, result = self.run_case(fault_cases.Grid, "test_grid_out_of_step")
        texts = "\n".join(text for _, text in result.failures)
        self.assertIn("AssertionError: rank 0 fails point 1 before its collective", texts)
        self.assertIn("ranks could not stay in step after grid point (x=1)", texts)
        self.assertNotIn("timed out", texts)
        self.assertNotIn(2, [sub.params["x"] for sub, _ in result.subtests])


class TestIsolation(FaultTestBase):
    @pytest.mark.slow
    def test_rank_environment_and_private_files(self) -> None:
        case, result = self.run_case(fault_cases.Passing, "test_rank_environment")
        self.assertTrue(result.wasSuccessful(), result.failures)
        work_dir = os.path.dirname(case.file_name)
        for rank in (0, 1):
            rank_temp = self.noted(f"tempdir.{rank}")
            self.assertTrue(rank_temp.startswith(work_dir + os.sep), rank_temp)
            self.assertFalse(os.path.exists(rank_temp))
        self.assertFalse(os.path.exists(work_dir))

    @pytest.mark.slow
    def test_no_leftover_files_after_a_crash(self) -> None:
        case, _ = self.run_case(fault_cases.Failing, "test_sigkill_on_rank_1")
        self.assertFalse(os.path.exists(os.path.dirname(case.file_name)))
        self.assertTrue(all(not _alive(r.pid) for r in case.rank_records))

    def test_bad_world_size_is_a_one_line_error(self) -> None:
        class Negative(fault_cases.BadWorldSize):
            world_size = -1

        with self.assertRaises(HarnessConfigError) as caught:
            Negative("test_nothing")._spawn_processes()
        self.assertEqual(
            str(caught.exception), "Negative.world_size must be a positive int, got -1"
        )

    def test_world_size_zero_is_a_skip_that_starts_no_rank(self) -> None:
        case, result = self.run_case(fault_cases.BadWorldSize, "test_nothing")
        self.assertEqual((result.failures, result.errors), ([], []))
        self.assertEqual(
            [reason for _, reason in result.skipped],
            ["BadWorldSize.world_size is 0: no ranks to start "
             f"({settings.accelerator_count()} accelerators found)"],
        )
        self.assertEqual((case.processes, case.rank_records, case.file_name), ([], [], None))
        self.assertFalse(os.path.exists(os.path.join(self.fault_dir, "started")))

    def test_per_rank_accelerator_requirement_starts_no_rank(self) -> None:
        class NeedsGpus(fault_cases.Passing):
            test_all_reduce = skip_if_no_gpu(fault_cases.Passing.test_all_reduce)

        with mock.patch.object(settings, "accelerator_count", return_value=1):
            case, result = self.run_case(NeedsGpus, "test_all_reduce")
        self.assertEqual(result.skipped[0][1], "Need at least 2 CUDA devices, found 1")
        self.assertEqual((case.processes, case.file_name), ([], None))

    def test_class_defined_in_a_function_is_a_one_line_error(self) -> None:
        class Local(fault_cases.Passing):
            pass

        with self.assertRaisesRegex(HarnessConfigError, "Local is defined inside a function"):
            Local("test_prints")._spawn_processes()

    def _run_parent_then(self, kill_signal: int) -> None:
        code = (
            "import unittest; from tests import fault_cases as f; "
            "unittest.TextTestRunner().run(f.Orphans('test_sleep_forever'))"
        )
        log = open(os.path.join(self.fault_dir, "parent.log"), "w")
        self.addCleanup(log.close)
        parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=log, stderr=log)
        self.addCleanup(lambda: parent.poll() is None and parent.kill())
        pid_files = [os.path.join(self.fault_dir, f"pid.{rank}") for rank in (0, 1)]
        started = lambda: all(os.path.exists(p) and os.path.getsize(p) for p in pid_files)  # noqa: E731
        self.assertTrue(_wait_until(started, 120), "the ranks never started")
        pids = {int(n) for p in pid_files for n in open(p).read().split()}  # ranks + forkserver
        pids.discard(parent.pid)
        work_dir = self.noted("dir.0")
        self.assertTrue(os.path.isdir(work_dir))
        parent.send_signal(kill_signal)
        parent.wait(60)
        self.assertTrue(
            _wait_until(lambda: not any(_alive(pid) for pid in pids), 30),
            f"processes left alive: {[pid for pid in pids if _alive(pid)]}",
        )
        self.assertTrue(_wait_until(lambda: not os.path.exists(work_dir), 10), work_dir)

    @pytest.mark.slow
    def test_interrupted_parent_leaves_no_orphans(self) -> None:
        self._run_parent_then(signal.SIGINT)

    @pytest.mark.slow
    def test_killed_parent_leaves_no_orphans(self) -> None:
        self._run_parent_then(signal.SIGKILL)


class TestRankSideOfTheBase(unittest.TestCase):
    """What a rank does after its test, run here by making this process the only rank."""

    def run_as_rank(self, destroy: bool) -> Tuple[unittest.TestResult, bool]:
        folder = tempfile.mkdtemp(prefix="harness-destroy-")
        self.addCleanup(lambda: __import__("shutil").rmtree(folder, ignore_errors=True))

        class LeavesGroup(MultiProcessTestCase):
            world_size = 1
            destroy_pg_upon_exit = destroy

            def test_leaves_group(self) -> None:
                dist.init_process_group(
                    "gloo", init_method=f"file://{folder}/rendezvous", rank=0, world_size=1
                )

        case = LeavesGroup("test_leaves_group")
        result = ReportingResult(RecordSink(RankRecord(0)))
        case.attach_rank(RankContext(0, 1, result))
        with mock.patch.dict(os.environ, {"GLOO_SOCKET_IFNAME": "lo"}):
            case.run(result)
        left = dist.is_initialized()
        if left:
            dist.destroy_process_group()
        return result, left

    def test_destroy_pg_upon_exit(self) -> None:
        self.assertTrue(MultiProcessTestCase("run").destroy_pg_upon_exit)
        result, left = self.run_as_rank(destroy=True)
        self.assertEqual((result.failures, result.errors, left), ([], [], False))
        result, left = self.run_as_rank(destroy=False)
        self.assertEqual((result.failures, result.errors, left), ([], [], True))

    def test_both_method_name_spellings_as_upstream(self) -> None:
        class Case(MultiProcessTestCase):
            def test_x(self) -> None:
                raise AssertionError("not run here")

        for case in (Case("test_x"), Case(method_name="test_x"), Case(methodName="test_x")):
            self.assertEqual(case._testMethodName, "test_x")
        with self.assertRaisesRegex(ValueError, "no such test method"):
            Case(method_name="test_y")

    def test_is_master_and_distributed_test_base_helpers(self) -> None:
        case = DistributedTestBase("run")
        self.assertFalse(case.is_master)  # the supervising parent is no rank
        case.rank = 0
        self.assertTrue(case.is_master)
        self.assertEqual(
            [case.backend(d) for d in ("cuda", "cuda:1", "hpu", "xpu", "cpu", "meta")],
            ["nccl", "nccl", "hccl", "xccl", "gloo", "gloo"],
        )
        # upstream's default for this base: 4 ranks, each on the CPU's one device
        self.assertEqual(case.rank_to_device("cpu"), {0: [0], 1: [0], 2: [0], 3: [0]})
        with mock.patch.dict(os.environ, {"HARNESS_WORLD_SIZE": "3"}):
            self.assertEqual(case.rank_to_device("cpu"), {0: [0], 1: [0], 2: [0]})


SCRIPT_SUITE = """
import os
import unittest

from harness.process.multiprocess_case import MultiProcessTestCase

IMPORTED_BY = os.getpid()


class Script(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def test_script_was_imported_by_the_forkserver(self):
        self.assertEqual(IMPORTED_BY, os.getppid(), "the rank imported the script itself")


if __name__ == "__main__":
    unittest.main()
"""


class TestStartAndModes(FaultTestBase):
    @pytest.mark.slow
    def test_script_run_as_main_is_preloaded_in_the_forkserver(self) -> None:
        script = os.path.join(self.fault_dir, "script_suite.py")
        with open(script, "w") as f:
            f.write(SCRIPT_SUITE)
        env = {**os.environ, "PYTHONPATH": ROOT}
        done = subprocess.run(
            [sys.executable, script], env=env, capture_output=True, text=True, timeout=300
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("Ran 1 test", done.stderr)

    @pytest.mark.slow
    def test_spawn_start_method(self) -> None:
        _, result = self.run_case(
            fault_cases.Passing, "test_all_reduce", env={"HARNESS_START_METHOD": "spawn"}
        )
        self.assertTrue(result.wasSuccessful(), result.failures)

    def test_torchrun_mode_runs_in_process(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {
            "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "HARNESS_LAUNCHED": "1",  # those four alone may be stray: only a launch opts in
        }
        fault_cases.InProcess.pids.clear()
        with mock.patch.dict(os.environ, env):
            case = fault_cases.InProcess("test_records_pid")
            result = RecordingResult()
            case.run(result)
        self.assertTrue(result.wasSuccessful(), result.failures)
        init_method = torchrun.init_method()
        self.assertEqual(fault_cases.InProcess.pids, [(os.getpid(), 0, 1, init_method)])
        self.assertEqual(case.processes, [])



class SetUpOnly(Launcher):
    """A launcher that starts nothing and says it set up a rendezvous file and two ranks."""

    def start(self, case: Any) -> RankSetup:
        return RankSetup("/tmp/harness-x/rendezvous", ("rank0", "rank1"))

    def join(self, case: Any) -> Tuple[List[RankRecord], Optional[float]]:
        return [], None

    def close(self) -> None:
        pass


class TestTheCaseDescribesItsRun(unittest.TestCase):
    def test_upstreams_attributes_come_from_what_start_returned(self) -> None:
        class Described(MultiProcessTestCase):
            world_size = 2

            def make_launcher(self) -> Launcher:
                return SetUpOnly()

            def test_nothing(self) -> None:
                """Never run: only setUp is."""

        case = Described("test_nothing")
        case.setUp()
        case._spawn_processes()
        self.assertEqual(case.file_name, "/tmp/harness-x/rendezvous")
        self.assertEqual(case.init_method, "file:///tmp/harness-x/rendezvous")
        self.assertEqual(case.processes, ["rank0", "rank1"])
        case.doCleanups()


class ExitingRank:
    """A rank process as spawn's Popen shows one that is exiting: its sentinel reads as
    closed, but it can be reaped (its exit code known) only `delay_s` later."""

    def __init__(self, exitcode: int, delay_s: float) -> None:
        self.sentinel = -1
        self._exitcode, self._reapable_at = exitcode, time.monotonic() + delay_s
        self.exitcode: Optional[int] = None

    def join(self, timeout: Optional[float] = None) -> None:
        wait_s = self._reapable_at - time.monotonic()
        if timeout is not None and timeout < wait_s:
            time.sleep(max(timeout, 0))
            return
        time.sleep(max(wait_s, 0))
        self.exitcode = self._exitcode

    def kill(self) -> None:
        pass

    def close(self) -> None:
        pass


class TestRankExit(unittest.TestCase):
    def test_an_exiting_rank_is_reaped_before_its_exit_is_judged(self) -> None:
        """A rank that exited with code 1 before it ran its test fails the test, even when its
        exit code is known a moment after the supervisor saw it go (it once passed then)."""
        group = RankGroup(world_size=1)
        self.addCleanup(group.close)
        group.processes = [ExitingRank(exitcode=1, delay_s=0.2)]
        group._alive.add(0)
        group._exited(0)
        record = group.records[0]
        self.assertEqual(record.exitcode, 1)
        self.assertEqual(record.problems(), ["rank 0 exited with code 1"])


if __name__ == "__main__":
    unittest.main()
