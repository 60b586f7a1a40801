"""run_tests(): `python some_test_file.py [flags]`, and the real suites run on their own.

The files run are the fixtures in tests/fixtures/, which end with
`if __name__ == "__main__": run_tests()` like every suite.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET
from contextlib import redirect_stderr
from pathlib import Path
from typing import Optional

import pytest

from harness.runner import upstream_flags
from harness.runner.main import run_tests
from tests.fixtures import REPO, child_env
from tests.upstream_probe import compare

FIXTURES = REPO / "tests" / "fixtures"


def run_file(name: str, *args: str, cwd: Optional[str] = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(FIXTURES / name), *args],
        cwd=cwd or REPO, env=child_env(), capture_output=True, text=True, timeout=300,
    )



@pytest.mark.slow
class TestSuitesRunStandalone(unittest.TestCase):
    """The real suites run the three ways users run one file, and pass."""

    def run_command(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], cwd=REPO, env=child_env(),
                              capture_output=True, text=True, timeout=600)

    def test_script_with_verbose_flag(self) -> None:
        proc = self.run_command("test_cases/test_exec_order.py", "-v")
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertIn("test_invalid_first_iter_order_sharding_strategy0", proc.stderr)
        self.assertRegex(proc.stderr, r"Ran 8 tests in .*\n\nOK")

    def test_python_m_unittest(self) -> None:
        proc = self.run_command("-m", "unittest", "test_cases.test_misc")
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertRegex(proc.stderr, r"Ran 26 tests in .*\n\nOK")

    def test_python_m_pytest(self) -> None:
        proc = self.run_command("-m", "pytest", "-q", "-p", "no:cacheprovider",
                                "test_cases/test_exec_order.py")
        self.assertEqual(proc.returncode, 0, proc.stdout[-3000:])
        self.assertRegex(proc.stdout.splitlines()[-1], r"^8 passed\b")
        self.assertNotIn("failed", proc.stdout.splitlines()[-1])

class TestRunTestsFlags(unittest.TestCase):
    @pytest.mark.slow
    def test_passing_file_exits_0_and_failing_file_exits_1(self) -> None:
        passing = run_file("runner_pass.py")
        self.assertEqual(passing.returncode, 0, passing.stderr)
        self.assertIn("Ran 4 tests", passing.stderr)
        self.assertIn("OK (skipped=1)", passing.stderr)
        failing = run_file("runner_fail.py")
        self.assertEqual(failing.returncode, 1)
        self.assertIn("FAILED (failures=2, errors=1)", failing.stderr)

    @pytest.mark.slow
    def test_unittest_arguments_pass_through(self) -> None:
        proc = run_file("runner_pass.py", "-v", "-k", "test_t", "TestPasses")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("test_two (__main__.TestPasses.test_two) ... ok", proc.stderr)
        self.assertIn("Ran 1 test", proc.stderr)

    @pytest.mark.slow
    def test_list_prints_selected_ids_that_the_file_takes_back(self) -> None:
        proc = run_file("runner_pass.py", "--list", "-k", "test_t")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout.split(), ["TestPasses.test_two"])
        again = run_file("runner_pass.py", "-v", *proc.stdout.split())
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertIn("test_two (__main__.TestPasses.test_two) ... ok", again.stderr)
        self.assertIn("Ran 1 test", again.stderr)

    @pytest.mark.slow
    def test_repeat_runs_each_test_n_times(self) -> None:
        proc = run_file("runner_pass.py", "--repeat", "3", "-k", "test_one")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("Ran 3 tests", proc.stderr)

    @pytest.mark.slow
    def test_seed_sets_every_tests_seed(self) -> None:
        proc = run_file("runner_config.py", "--seed", "77", "-k", "reports_config")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("seed=77", proc.stdout)

    def test_bad_flag_value_is_one_line_and_exit_2(self) -> None:
        # in this process: the flags are parsed before the file's tests are looked at
        err = io.StringIO()
        with redirect_stderr(err), self.assertRaises(SystemExit) as stop:
            run_tests([str(FIXTURES / "runner_pass.py"), "--repeat", "zero"])
        self.assertEqual(stop.exception.code, 2)
        self.assertEqual(err.getvalue().strip(),
                         "runner_pass.py: error: argument --repeat: 'zero' is not an integer")

    @pytest.mark.slow
    def test_save_xml_default_dir_and_one_testcase_per_test(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            proc = run_file("runner_fail.py", "--save-xml", cwd=tmp)
            self.assertEqual(proc.returncode, 1)
            report = Path(tmp, "test-reports", "TEST-TestFailures.xml")
            self.assertTrue(report.is_file(), os.listdir(tmp))
            cases = {c.get("name"): c for c in ET.parse(report).getroot().iter("testcase")}
        self.assertEqual(sorted(cases), ["test_assert", "test_error", "test_grid", "test_ok"])
        grid = cases["test_grid"].find("failure")
        self.assertEqual(grid.get("message"), "1 grid point(s) failed: (a=1, b=2)")
        self.assertEqual(cases["test_error"].find("error").get("type"), "ValueError")

    @pytest.mark.slow
    def test_save_xml_into_named_dir(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            proc = run_file("runner_pass.py", f"--save-xml={tmp}/out")
            self.assertEqual(proc.returncode, 0, proc.stderr)
            names = sorted(os.listdir(f"{tmp}/out"))
        self.assertEqual(names, ["TEST-TestPasses.xml", "TEST-TestSkips.xml"])


# The flags upstream's run_tests takes, as PyTorch's CI passes them to every test file.
CI_FLAGS = ("--import-disabled-tests", "--import-slow-tests", "--log-suffix=-shard-1",
            "--showlocals", "--jit-executor", "legacy", "--accept")


class TestUpstreamFlagsParsing(unittest.TestCase):
    """In process: which upstream flags act, which are ignored with a note, what is left."""

    def test_every_upstream_flag_is_taken_out(self) -> None:
        flags, rest = upstream_flags.take([
            "-v", "--subprocess", "--use-pytest", "--log-suffix=-shard-2", "--jit_executor=simple",
            "--test-bailouts", "--run-parallel", "2", "--import-slow-tests", "slow.json",
            "--import-disabled-tests", "--rerun-disabled-tests", "--no-showlocals", "-k", "abc",
            "TestX.test_y",
        ])
        self.assertEqual(rest, ["-v", "-k", "abc", "TestX.test_y"])
        self.assertEqual(len(flags.notes), 8)
        self.assertEqual(flags.log_suffix, "-shard-2")
        self.assertIn("--use-pytest ignored: the file runs under unittest", flags.notes[1])
        self.assertFalse(flags.show_locals or flags.accept or flags.discover)

    def test_flags_that_mean_something_here(self) -> None:
        flags, rest = upstream_flags.take([
            "--accept", "--showlocals", "--discover-tests",
            "--pytest-single-test", "test_file.py::TestX::test_y",
        ])
        self.assertEqual(rest, [])
        self.assertEqual(flags.notes, [])
        self.assertTrue(flags.accept and flags.show_locals and flags.discover)
        self.assertEqual(flags.tests, ["TestX.test_y"])


@pytest.mark.slow
class TestUpstreamFlagsAccepted(unittest.TestCase):
    def test_ci_flags_run_the_file_with_a_note_each(self) -> None:
        proc = run_file("runner_pass.py", *CI_FLAGS, "--use-pytest", "--subprocess",
                        "--rerun-disabled-tests", "-v")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("Ran 4 tests", proc.stderr)
        notes = [line for line in proc.stderr.splitlines() if line.startswith("run_tests: ")]
        self.assertEqual(len(notes), 6, notes)
        self.assertIn("run_tests: --subprocess ignored: every multi-rank test already starts "
                      "fresh rank processes", notes)

    def test_discover_tests_lists_and_single_test_selects(self) -> None:
        listed = run_file("runner_pass.py", "--discover-tests")
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertEqual(len(listed.stdout.split()), 4)
        single = run_file("runner_pass.py", "--pytest-single-test",
                          "runner_pass.py::TestPasses::test_two", "-v")
        self.assertEqual(single.returncode, 0, single.stderr)
        self.assertIn("Ran 1 test", single.stderr)

    def test_same_outcomes_as_upstream_with_the_ci_flags(self) -> None:
        theirs, ours, shown = compare(FLAGS_PROBE, args=CI_FLAGS)
        self.assertEqual(len(theirs), 3, shown)
        self.assertEqual(ours, theirs, shown)


FLAGS_PROBE = """
from torch.testing._internal.common_utils import TestCase, run_tests


class TestFlags(TestCase):
    def test_pass(self):
        self.assertEqual(1, 1)

    def test_fail(self):
        self.assertEqual(1, 2)

    def test_skip(self):
        self.skipTest("not here")


if __name__ == "__main__":
    run_tests()
"""


if __name__ == "__main__":
    unittest.main()
