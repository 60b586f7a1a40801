"""run_all.py as a user runs it: a subprocess, checked by exit code, closing line and files.

The modules it runs are the tiny fixtures in tests/fixtures/ (passing, failing, skipping,
grid points, a module that cannot be imported), so every expected count is known. Bad input
and --list start no test, so those cases call run_all's main in this process (fast tier);
every case that runs tests starts run_all.py as a subprocess (`slow`).
"""

from __future__ import annotations

import io
import os
import pty
import re
import signal
import subprocess
import sys
import tempfile
import threading
import unittest
import xml.etree.ElementTree as ET
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Dict, Iterator, List, Optional
from unittest import mock

import pytest
import torch

from harness.runner.cli import run_all_main
from tests.fixtures import REPO, child_env

PASS = "tests.fixtures.runner_pass"
FAIL = "tests.fixtures.runner_fail"
BROKEN = "tests.fixtures.runner_broken"
CONFIG = "tests/fixtures/runner_config.py"
FIXTURE_IDS = [
    f"{PASS}.TestPasses.test_grid",
    f"{PASS}.TestPasses.test_one",
    f"{PASS}.TestPasses.test_two",
    f"{PASS}.TestSkips.test_skipped",
    f"{FAIL}.TestFailures.test_assert",
    f"{FAIL}.TestFailures.test_error",
    f"{FAIL}.TestFailures.test_grid",
    f"{FAIL}.TestFailures.test_ok",
]


def run_all(*args: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "run_all.py"), *args],
        cwd=REPO, env=child_env(env), capture_output=True, text=True, timeout=300,
    )


@contextmanager
def _working_dir(path: Path) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def run_all_here(*args: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """run_all's main called in this process, as `run_all()` would run it (same cwd and env,
    restored after): for bad input and --list, which exit before any test starts."""
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, child_env(env), clear=True), _working_dir(REPO), \
            redirect_stdout(out), redirect_stderr(err):
        code = run_all_main(list(args))
    return subprocess.CompletedProcess(["run_all.py", *args], code, out.getvalue(), err.getvalue())


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def xml_cases(folder: str) -> Dict[str, ET.Element]:
    """Every <testcase> in the JUnit files of `folder`, by classname.name."""
    cases: Dict[str, ET.Element] = {}
    for path in sorted(Path(folder).glob("TEST-*.xml")):
        for case in ET.parse(path).getroot().iter("testcase"):
            key = f"{case.get('classname')}.{case.get('name')}"
            assert key not in cases, f"{key} reported twice"
            cases[key] = case
    return cases


@pytest.mark.slow
class TestPassingRun(unittest.TestCase):
    """`run_all.py <passing module> --save-xml DIR -v`: exit 0, table, closing line, XML, a
    line per test."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory()
        cls.xml_dir = os.path.join(cls.tmp.name, "reports")
        cls.proc = run_all(PASS, "--save-xml", cls.xml_dir, "-v")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    def test_exit_code_and_closing_line(self) -> None:
        self.assertEqual(self.proc.returncode, 0, self.proc.stderr)
        self.assertEqual(last_line(self.proc.stdout), "3 passed, 0 failed, 1 skipped")

    def test_summary_table_counts_grid_points(self) -> None:
        row = next(line for line in self.proc.stdout.splitlines() if line.startswith(PASS))
        self.assertEqual(row.split()[1:5], ["3", "0", "1", "4"])  # passed failed skipped grid
        self.assertRegex(row.split()[5], r"^\d+\.\ds$")
        self.assertIn("grid points", self.proc.stdout)

    def test_junit_xml_has_one_testcase_per_test(self) -> None:
        cases = xml_cases(self.xml_dir)
        self.assertEqual(sorted(cases), FIXTURE_IDS[:4])
        skipped = cases[f"{PASS}.TestSkips.test_skipped"].find("skipped")
        self.assertIsNotNone(skipped)
        self.assertEqual(skipped.get("message"), "no widget attached")
        self.assertEqual(list(cases[f"{PASS}.TestPasses.test_one"]), [])

    def test_plain_progress_lines_when_not_a_terminal(self) -> None:
        self.assertIn("running 4 test(s) from 1 suite(s)", self.proc.stderr)
        self.assertNotIn("\r", self.proc.stderr)

    def test_verbose_prints_a_line_per_test(self) -> None:
        self.assertRegex(self.proc.stderr, rf"\[2/4\] ok +{PASS}\.TestPasses\.test_one \(\d")
        self.assertRegex(self.proc.stderr, rf"\[4/4\] skip +{PASS}\.TestSkips\.test_skipped")


@pytest.mark.slow
class TestFailingRun(unittest.TestCase):
    """Failures, errors, a failing grid point and a module that cannot be imported."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory()
        cls.proc = run_all(FAIL, BROKEN, "--save-xml", cls.tmp.name)
        cls.cases = xml_cases(cls.tmp.name)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    def test_exit_code_and_closing_line(self) -> None:
        self.assertEqual(self.proc.returncode, 1)
        self.assertEqual(last_line(self.proc.stdout), "1 passed, 4 failed, 0 skipped")

    def test_report_names_each_failure(self) -> None:
        out = self.proc.stdout
        self.assertIn(f"FAIL: {FAIL}.TestFailures.test_assert", out)
        self.assertIn(f"ERROR: {FAIL}.TestFailures.test_error", out)
        self.assertIn("ValueError: broken on purpose", out)
        self.assertIn("grid point (a=1, b=2) failed", out)
        self.assertIn("this fixture module is broken on purpose", out)

    def test_failing_grid_point_in_xml_with_its_params(self) -> None:
        failure = self.cases[f"{FAIL}.TestFailures.test_grid"].find("failure")
        self.assertIsNotNone(failure)
        self.assertEqual(failure.get("message"), "1 grid point(s) failed: (a=1, b=2)")
        self.assertIn("grid point b=2 fails on purpose", failure.text)
        self.assertNotIn("b=1", failure.get("message"))

    def test_xml_failure_and_error_elements(self) -> None:
        self.assertEqual(len([c for c in self.cases if c.startswith(FAIL)]), 4)
        self.assertIsNotNone(self.cases[f"{FAIL}.TestFailures.test_assert"].find("failure"))
        error = self.cases[f"{FAIL}.TestFailures.test_error"].find("error")
        self.assertEqual(error.get("type"), "ValueError")
        self.assertIn(f"{BROKEN}.ImportFailure.test_import", self.cases)


def listed_ids(test: unittest.TestCase, *args: str) -> List[str]:
    """The ids `run_all.py --list ARGS` prints (in this process: listing starts no test)."""
    proc = run_all_here("--list", *args)
    test.assertEqual(proc.returncode, 0, proc.stderr)
    return proc.stdout.split()


class TestSelection(unittest.TestCase):
    """--list, -k, module names, shards."""

    def listed(self, *args: str) -> List[str]:
        return listed_ids(self, *args)

    def test_list_prints_ids_only(self) -> None:
        self.assertEqual(self.listed(PASS, FAIL), FIXTURE_IDS)

    def test_k_uses_unittest_matching_and_is_repeatable(self) -> None:
        ids = self.listed(PASS, FAIL, "-k", "test_one", "-k", "*Failures.test_[ae]*")
        self.assertEqual(ids, [
            f"{PASS}.TestPasses.test_one",
            f"{FAIL}.TestFailures.test_assert",
            f"{FAIL}.TestFailures.test_error",
        ])

    def test_short_and_dotted_suite_names_agree(self) -> None:
        self.assertEqual(self.listed("test_misc"), self.listed("test_cases.test_misc"))
        self.assertTrue(self.listed("test_misc"))

    def test_shards_are_disjoint_and_cover_the_run(self) -> None:
        everything = self.listed(PASS, FAIL)
        shards = [self.listed(PASS, FAIL, "--shard", str(i), "3") for i in (1, 2, 3)]
        self.assertEqual(sorted(sum(shards, [])), sorted(everything))
        self.assertEqual(len(set(sum(shards, []))), len(everything))
        self.assertTrue(all(shards))
        self.assertEqual(shards[0], self.listed(PASS, FAIL, "--shard", "1", "3"))


@pytest.mark.slow
class TestSelectedRuns(unittest.TestCase):
    """A shard and --repeat run what --list says they select."""

    def test_shard_runs_only_its_tests(self) -> None:
        proc = run_all(PASS, "--shard", "2", "2", "-v")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        listed = listed_ids(self, PASS, "--shard", "2", "2")
        ran = re.findall(r"^\[\d+/\d+\] \w+ +(\S+)", proc.stderr, re.MULTILINE)
        self.assertEqual(ran, listed)
        # sorted ids: test_grid, test_one, test_two, TestSkips.test_skipped -> shard 2 gets 1 and 3
        self.assertEqual(listed, [f"{PASS}.TestPasses.test_one", f"{PASS}.TestSkips.test_skipped"])
        self.assertEqual(last_line(proc.stdout), "1 passed, 0 failed, 1 skipped")

    def test_repeat_runs_each_test_n_times(self) -> None:
        proc = run_all(PASS, "-k", "test_one", "--repeat", "3")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(last_line(proc.stdout), "3 passed, 0 failed, 0 skipped")


@pytest.mark.slow
class TestRunControl(unittest.TestCase):
    """-x, -v, -q, progress, and the env knobs set by flags."""

    def test_failfast_stops_at_first_failure(self) -> None:
        proc = run_all(FAIL, "-x")
        self.assertEqual(proc.returncode, 1)
        self.assertEqual(last_line(proc.stdout), "0 passed, 1 failed, 0 skipped")

    def test_quiet_prints_failures_and_closing_line_only(self) -> None:
        proc = run_all(FAIL, "-q")
        self.assertEqual(proc.stderr, "")
        self.assertNotIn("grid points", proc.stdout)
        self.assertIn(f"FAIL: {FAIL}.TestFailures.test_assert", proc.stdout)
        self.assertEqual(last_line(proc.stdout), "1 passed, 3 failed, 0 skipped")

    def test_flags_set_env_knobs_before_suites_are_imported(self) -> None:
        proc = run_all(
            CONFIG, "-k", "reports_config", "--world-size", "3", "--device", "cpu",
            "--timeout", "12.5",
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("config: world_size=3 at_import=3 device=cpu timeout=12.5", proc.stdout)

    def test_periodic_progress_lines_while_a_test_runs(self) -> None:
        proc = run_all(CONFIG, "-k", "sleeps", env={"HARNESS_PROGRESS_INTERVAL": "0.2"})
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertRegex(proc.stderr, r"\[0/1\] \dm\d\ds running .*TestSlow\.test_sleeps")

    def test_ctrl_c_reports_what_ran_and_exits_130(self) -> None:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "run_all.py"), CONFIG, "-v"],
            cwd=REPO, env=child_env({"RUNNER_FIXTURE_SLEEP": "60"}),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        self.assertIn("running 2 test(s)", proc.stderr.readline())
        self.assertIn("ok    tests.fixtures.runner_config.TestConfig", proc.stderr.readline())
        proc.send_signal(signal.SIGINT)  # now inside TestSlow.test_sleeps
        out, _ = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 130)
        self.assertIn("run stopped: interrupted by Ctrl-C (SIGINT)", out)
        self.assertEqual(last_line(out), "interrupted: 1 passed, 0 failed, 0 skipped")

    def test_live_line_on_a_terminal(self) -> None:
        leader, follower = pty.openpty()
        chunks: List[bytes] = []

        def drain() -> None:
            while True:
                try:
                    data = os.read(leader, 4096)
                except OSError:
                    return
                if not data:
                    return
                chunks.append(data)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        proc = subprocess.run(
            [sys.executable, str(REPO / "run_all.py"), CONFIG, "-k", "sleeps"],
            cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=follower, text=True,
            timeout=300,
        )
        os.close(follower)
        reader.join(timeout=10)
        os.close(leader)
        shown = b"".join(chunks).decode(errors="replace")
        self.assertEqual(proc.returncode, 0)
        self.assertIn("\r\x1b[K[0/1]", shown)
        self.assertIn("running tests.fixtures.runner_config.TestSlow.test_sleeps", shown)
        self.assertEqual(last_line(proc.stdout), "1 passed, 0 failed, 0 skipped")


class TestBadInput(unittest.TestCase):
    """Each bad input: one line on stderr naming the problem, exit code 2, no traceback."""

    CASES = {
        "unknown module": (["test_no_such_suite"], "unknown test module 'test_no_such_suite'"),
        "unknown path": (["tests/fixtures/nope.py"], "unknown test module"),
        "pattern matching nothing": ([PASS, "-k", "no_such_test"], "-k 'no_such_test'"),
        "empty pattern": ([PASS, "-k", ""], "-k: empty pattern"),
        "shard past the count": ([PASS, "--shard", "3", "2"], "--shard 3 2"),
        "shard zero": ([PASS, "--shard", "0", "2"], "argument --shard: '0' must be positive"),
        "unknown device": ([PASS, "--device", "tpu"], "invalid choice: 'tpu'"),
        "world size not an int": (
            [PASS, "--world-size", "two"], "argument --world-size: 'two' is not an integer"
        ),
        "timeout not positive": ([PASS, "--timeout", "0"], "argument --timeout: '0' must be"),
        "repeat zero": ([PASS, "--repeat", "0"], "argument --repeat: '0' must be positive"),
        "unknown flag": ([PASS, "--colour"], "unrecognized arguments: --colour"),
    }

    def test_bad_inputs(self) -> None:
        for name, (args, expected) in self.CASES.items():
            with self.subTest(name):
                proc = run_all_here(*args)
                self.assertEqual(proc.returncode, 2, proc.stderr)
                self.assertEqual(len(proc.stderr.splitlines()), 1, proc.stderr)
                self.assertIn(expected, proc.stderr)
                self.assertTrue(proc.stderr.startswith("run_all.py: error: "), proc.stderr)
                self.assertEqual(proc.stdout, "")

    def test_bad_env_knobs_are_bad_input_too(self) -> None:
        for name, value in (("HARNESS_WORLD_SIZE", "lots"), ("HARNESS_PROGRESS_INTERVAL", "x"),
                            ("HARNESS_ALLOW_CPU", "maybe")):
            with self.subTest(name):
                proc = run_all_here(PASS, env={name: value})
                self.assertEqual(proc.returncode, 2)
                self.assertEqual(len(proc.stderr.splitlines()), 1, proc.stderr)
                self.assertIn(f"run_all.py: error: {name}='{value}'", proc.stderr)



ALLOW_CPU_FILE = "tests/upstream_style/allow_cpu_fsdp1.py"


@pytest.mark.slow
@unittest.skipIf(torch.cuda.is_available(), "the switch changes nothing where accelerators exist")
class TestAllowCpu(unittest.TestCase):
    """--allow-cpu: a GPU-written file runs on CPU, its adaptations summed up after the table."""

    def test_allow_cpu_runs_the_file_and_lists_adaptations(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            proc = run_all(ALLOW_CPU_FILE, "--allow-cpu", env={"TMPDIR": tmp})
            left = [n for n in os.listdir(tmp) if not n.startswith("torchinductor_")]
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        lines = proc.stdout.strip().splitlines()
        self.assertEqual(lines[-1], "7 passed, 0 failed, 0 skipped")
        self.assertEqual(
            lines[-2],
            "CPU adaptations (HARNESS_ALLOW_CPU): FSDP1 device_id=cpu in 5 tests; "
            "DDP device_ids=None in 3 tests",
        )
        self.assertEqual(left, [])

    def test_without_allow_cpu_nothing_runs_and_nothing_is_adapted(self) -> None:
        proc = run_all(ALLOW_CPU_FILE)
        self.assertNotIn("CPU adaptations", proc.stdout)
        self.assertEqual(last_line(proc.stdout), "0 passed, 0 failed, 0 skipped")


if __name__ == "__main__":
    unittest.main()
