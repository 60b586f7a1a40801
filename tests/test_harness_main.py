"""harness/__main__.py: `python -m harness [PATHS] [flags]`, the command a project that installed
the harness runs its tests with, outside this checkout (no test_cases/ there)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Optional

import pytest

from tests.fixtures import REPO, child_env

SMALL = '''
import unittest

import torch.distributed as dist

from harness import MultiProcessTestCase, TestCase, run_tests


class TestSmall(TestCase):
    def test_adds(self):
        self.assertEqual(1 + 1, 2)

    def test_needs_a_widget(self):
        self.skipTest("no widget attached")


class TestRanks(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_rank_is_known(self):
        self.assertIn(self.rank, (0, 1))


if __name__ == "__main__":
    run_tests()
'''


@pytest.mark.slow
class OutsideTheCheckout(unittest.TestCase):
    """A project's folder with tests/unit/test_small.py; the harness importable, as if
    installed, from a folder that has only it (not this checkout's test_cases/)."""

    def setUp(self) -> None:
        self.project = Path(tempfile.mkdtemp())
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", str(self.project)], check=True))
        (self.project / "lib").mkdir()
        (self.project / "lib" / "harness").symlink_to(REPO / "harness")
        self.env = child_env()
        self.env["PYTHONPATH"] = str(self.project / "lib")
        (self.project / "tests" / "unit").mkdir(parents=True)
        (self.project / "tests" / "unit" / "test_small.py").write_text(SMALL)
        (self.project / ".venv").mkdir()  # hidden folders are not searched
        (self.project / ".venv" / "test_not_mine.py").write_text("raise SystemExit(3)\n")

    def harness(self, *args: str, cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "harness", *args], cwd=cwd or self.project, env=self.env,
            capture_output=True, text=True, timeout=300,
        )

    def test_runs_a_folder_recursively(self) -> None:
        proc = self.harness("tests", "-v")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertEqual(proc.stdout.strip().splitlines()[-1], "2 passed, 0 failed, 1 skipped")
        self.assertIn("test_small.TestSmall.test_needs_a_widget", proc.stderr)
        self.assertIn("no widget attached", proc.stderr)  # -v gives a skip's reason

    def test_the_current_folder_by_default(self) -> None:
        proc = self.harness("--list")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout.split(), [
            "test_small.TestRanks.test_rank_is_known",
            "test_small.TestSmall.test_adds",
            "test_small.TestSmall.test_needs_a_widget",
        ])

    def test_bad_input_is_one_line(self) -> None:
        proc = self.harness("tests/nope")
        self.assertEqual(proc.returncode, 2)
        self.assertEqual(proc.stderr.strip(),
                         "python -m harness: error: unknown test module 'tests/nope'")

    def test_run_all_main_without_test_cases_is_one_line(self) -> None:
        proc = subprocess.run(
            [sys.executable, "-c", "import sys; from harness.runner.cli import run_all_main;"
             " sys.exit(run_all_main([]))"],
            cwd=self.project, env=self.env, capture_output=True, text=True, timeout=300,
        )
        self.assertEqual(proc.returncode, 2)
        self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)
        self.assertIn("python -m harness PATHS", proc.stderr)

    def test_a_scripts_list_ids_are_what_it_takes(self) -> None:
        script = self.project / "tests" / "unit" / "test_small.py"
        listed = subprocess.run(
            [sys.executable, str(script), "--list"], cwd=self.project, env=self.env,
            capture_output=True, text=True, timeout=300,
        )
        self.assertEqual(listed.stdout.split()[0], "TestRanks.test_rank_is_known")
        again = subprocess.run(
            [sys.executable, str(script), listed.stdout.split()[0]], cwd=self.project,
            env=self.env, capture_output=True, text=True, timeout=300,
        )
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertIn("Ran 1 test", again.stderr)


if __name__ == "__main__":
    unittest.main()
