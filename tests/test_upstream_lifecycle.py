"""A test's lifecycle, return-code API and verdicts, differentially against upstream's harness.

One small upstream-style file (below) runs twice in child interpreters: with its imports
pointing at torch's installed `torch.testing._internal` and at this harness. The outcomes
per test id must agree (pass / skip / not passed); the one deliberate difference in kind is
checked on its own: a rank's AssertionError is a FAIL here, an ERROR upstream (which reports
every rank exception as a RuntimeError), while any other exception is an ERROR in both.
The file is kept small: upstream starts fresh interpreters for every test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Dict
from unittest import mock

import pytest

from tests import fault_cases
from tests.fixtures import child_env, upstream_env

UPSTREAM_IMPORTS = """\
from torch.testing._internal.common_distributed import (
    MultiProcContinuousTest, MultiProcessTestCase, MultiThreadedTestCase,
)
"""
HARNESS_IMPORTS = """\
from harness import MultiProcContinuousTest, MultiProcessTestCase, MultiThreadedTestCase
"""

PROBE = '''\
import os
import socket
import sys
import threading
import time
from unittest import mock

import torch.distributed as dist

{imports}

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TestLifecycle(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    @property
    def init_method(self):  # upstream's own bases define it so: the class must load
        return f"file://{{self.file_name}}"

    def setUp(self):
        super().setUp()
        os.environ["PROBE_PORT"] = str(free_port())  # before spawning: every rank sees it
        self.from_set_up = True
        if self._testMethodName == "test_exit_code_expected":
            self.special_return_code_checks[self.test_exit_code_expected.__wrapped__] = 3
        if self._testMethodName == "test_exit_code_unchecked":
            self.skip_return_code_checks.append(self.test_exit_code_unchecked.__wrapped__)
        self._spawn_processes()

    def tearDown(self):
        super().tearDown()
        try:  # once, in the parent, after every rank finished
            os.remove(self.file_name)
        except OSError:
            pass

    def test_set_up_runs_once_in_the_parent(self):
        assert not hasattr(self, "from_set_up"), "a rank ran setUp"
        time.sleep(2 * self.rank)  # rank 1 is slower: nothing may remove the file under it
        dist.init_process_group("gloo", init_method=self.init_method, rank=self.rank,
                                world_size=self.world_size)
        ports = [None] * self.world_size
        dist.all_gather_object(ports, os.environ["PROBE_PORT"])
        assert ports[0] == ports[1], f"ranks saw different ports: {{ports}}"
        dist.destroy_process_group()

    def test_exit_zero_is_a_pass(self):
        sys.exit(0)

    def test_exit_code_expected(self):
        sys.exit(3)

    def test_exit_code_unchecked(self):
        sys.exit(3)

    def test_assertion_in_a_rank(self):
        self.assertTrue(self.rank == 0)

    def test_error_in_a_rank(self):
        if self.rank == 1:
            raise ValueError("boom")


class TestRendezvousFileLifetime(MultiProcessTestCase):
    # Upstream leaves the rendezvous file to the test: its tearDown may remove it unguarded,
    # and cleanups may still read what the ranks left beside it.
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()
        self.addCleanup(self._read_what_rank_0_left)

    def tearDown(self):
        super().tearDown()
        os.remove(self.file_name)

    def _read_what_rank_0_left(self):
        with open(self.file_name + ".note") as f:
            assert f.read() == "rank 0 was here"
        os.remove(self.file_name + ".note")

    def test_file_outlives_the_ranks(self):
        if self.rank == 0:
            with open(self.file_name + ".note", "w") as f:
                f.write("rank 0 was here")


class TestOwnReturnCodeCheck(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _check_return_codes(self, fn, elapsed_time):
        # as upstream suites do: the test expects rank 1 to fail and checks that itself
        assert [p.exitcode for p in self.processes] == [0, self.TEST_ERROR_EXIT_CODE]

    def tearDown(self):
        super().tearDown()
        try:
            os.remove(self.file_name + ".rank0-done")
        except OSError:
            pass

    def test_rank_1_fails_on_purpose(self):
        marker = self.file_name + ".rank0-done"
        if self.rank == 0:
            open(marker, "w").close()
            return
        # rank 0 ends first: upstream stops the other ranks at once when one failed
        for _ in range(600):
            if os.path.exists(marker):
                break
            time.sleep(0.1)
        time.sleep(2)
        raise RuntimeError("expected")


SET_UP_IN = []
PER_THREAD = []
VALUE = "original"


class TestThreadHooks(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        SET_UP_IN.append(threading.current_thread().name)
        patcher = mock.patch.object(sys.modules[__name__], "VALUE", "patched")
        patcher.start()
        self.addCleanup(patcher.stop)
        self._spawn_threads()

    def perThreadSetUp(self):
        PER_THREAD.append(("set_up", dist.is_initialized()))

    def perThreadTearDown(self):
        PER_THREAD.append(("tear_down", dist.is_initialized()))

    def test_a_hooks(self):
        assert VALUE == "patched"
        assert SET_UP_IN == ["MainThread"], SET_UP_IN


class TestThreadHooksAfter(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_b_nothing_leaked(self):
        assert VALUE == "original", "the patch of an earlier test leaked"
        assert sorted(PER_THREAD) == [("set_up", True)] * 2 + [("tear_down", False)] * 2, (
            PER_THREAD)


SET_UP_PID = None


class TestContinuous(MultiProcContinuousTest):
    world_size = 2

    def setUp(self):
        global SET_UP_PID
        super().setUp()
        SET_UP_PID = os.getpid()

    def test_set_up_not_in_ranks(self):
        assert SET_UP_PID is None, "a rank ran setUp"
'''

DRIVER = """
import json, sys, unittest
sys.path.insert(0, sys.argv[1])
import probe_lifecycle as module

class Result(unittest.TextTestResult):
    outcomes = {}
    def addSuccess(self, test):
        super().addSuccess(test); self.outcomes[test.id()] = "pass"
    def addFailure(self, test, err):
        super().addFailure(test, err); self.outcomes[test.id()] = "fail"
    def addError(self, test, err):
        super().addError(test, err); self.outcomes[test.id()] = "error"
    def addSkip(self, test, reason):
        super().addSkip(test, reason); self.outcomes[test.id()] = "skip"

suite = unittest.defaultTestLoader.loadTestsFromModule(module)
unittest.TextTestRunner(resultclass=Result, verbosity=2).run(suite)
print("OUTCOMES " + json.dumps({k.split(".", 1)[1]: v for k, v in Result.outcomes.items()}))
"""

EXPECTED = {
    "TestLifecycle.test_set_up_runs_once_in_the_parent": "pass",
    "TestLifecycle.test_exit_zero_is_a_pass": "pass",
    "TestLifecycle.test_exit_code_expected": "pass",
    "TestLifecycle.test_exit_code_unchecked": "pass",
    "TestLifecycle.test_assertion_in_a_rank": "fail",  # upstream: error (see the docstring)
    "TestLifecycle.test_error_in_a_rank": "error",
    "TestRendezvousFileLifetime.test_file_outlives_the_ranks": "pass",
    "TestOwnReturnCodeCheck.test_rank_1_fails_on_purpose": "pass",
    "TestThreadHooks.test_a_hooks": "pass",
    "TestThreadHooksAfter.test_b_nothing_leaked": "pass",
    "TestContinuous.test_set_up_not_in_ranks": "pass",
}


def run_probe(imports: str) -> Dict[str, str]:
    """Each test id of the probe file, run with `imports`, and its outcome."""
    with tempfile.TemporaryDirectory() as work_dir:
        (Path(work_dir) / "probe_lifecycle.py").write_text(PROBE.format(imports=imports))
        proc = subprocess.run(
            [sys.executable, "-c", DRIVER, work_dir], cwd=work_dir, capture_output=True,
            text=True, timeout=1500,
            env=(upstream_env if imports == UPSTREAM_IMPORTS else child_env)(
                {"HARNESS_DEVICE": "cpu"}),
        )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("OUTCOMES ")]
    if not lines:
        raise AssertionError(f"the probe did not run:\n{proc.stdout[-3000:]}{proc.stderr[-5000:]}")
    return json.loads(lines[-1][len("OUTCOMES "):])


def coarse(outcomes: Dict[str, str]) -> Dict[str, str]:
    return {k: "not passed" if v in ("fail", "error") else v for k, v in outcomes.items()}


@pytest.mark.slow
class LifecycleDifferentialTest(unittest.TestCase):
    """The probe file's outcomes, per test id, under upstream's harness and this one."""

    def test_outcomes_match_upstream(self) -> None:
        ours = run_probe(HARNESS_IMPORTS)
        self.assertEqual(ours, EXPECTED)
        theirs = run_probe(UPSTREAM_IMPORTS)
        self.assertEqual(coarse(ours), coarse(theirs))
        # Upstream's one kind for every rank exception, ours unittest's two.
        self.assertEqual(theirs["TestLifecycle.test_assertion_in_a_rank"], "error")
        self.assertEqual(theirs["TestLifecycle.test_error_in_a_rank"], "error")


class FakeProcessGroupTest(unittest.TestCase):
    """`fake_pg = True` (upstream's FSDPTest): the ranks' default group is the fake backend.

    Not differential: upstream's FSDPTest skips every test on a machine without accelerators.
    """

    @pytest.mark.slow
    def test_ranks_run_on_the_fake_backend(self) -> None:
        result = unittest.TestResult()
        with mock.patch.dict(os.environ, {"HARNESS_ALLOW_CPU": "1"}):
            fault_cases.FakeGroup("test_backend").run(result)
        self.assertEqual((result.testsRun, result.failures, result.errors, result.skipped),
                         (1, [], [], []))


if __name__ == "__main__":
    unittest.main()
