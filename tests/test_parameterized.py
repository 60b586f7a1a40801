"""Tests written with the `parameterized` package (`@parameterized.expand`) keep working on every
multi-rank base (processes, threads, FSDPTest, DTensorTestBase), under unittest and pytest,
with parameterized's own test ids; each rank runs the case's own arguments.

The suite is tests/fixtures/parameterized_cases.py: per base, `test_sum_0_small` passes and
`test_sum_1_large` fails on rank 1 with a message naming its argument.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, Tuple

import pytest

from tests.fixtures import REPO, child_env

SUITE = REPO / "tests" / "fixtures" / "parameterized_cases.py"
CLASSES = ("TestDTensor", "TestFSDP", "TestProcesses", "TestThreads")
WAIT_S = 600
EXPECTED = {
    (cls, name): outcome
    for cls in CLASSES
    for name, outcome in (("test_sum_0_small", "passed"), ("test_sum_1_large", "failed"))
}


def outcomes(folder: Path) -> Tuple[Dict[Tuple[str, str], str], Dict[Tuple[str, str], str]]:
    """(class, test name) -> passed/failed/skipped, and -> the failure's text, from JUnit XML."""
    found, texts = {}, {}
    for path in folder.rglob("*.xml"):
        for case in ET.parse(path).getroot().iter("testcase"):
            key = (case.get("classname").rpartition(".")[2], case.get("name"))
            failure = case.find("failure")
            if failure is None:
                failure = case.find("error")
            skipped = case.find("skipped") is not None
            found[key] = "failed" if failure is not None else "skipped" if skipped else "passed"
            texts[key] = "" if failure is None else f"{failure.get('message')}\n{failure.text}"
    return found, texts


@pytest.mark.slow
@unittest.skipIf(importlib.util.find_spec("parameterized") is None,
                 "the parameterized package is not installed (pip install parameterized)")
class ParameterizedOnEveryBase(unittest.TestCase):
    def run_suite(self, args: list) -> Path:
        folder = Path(tempfile.mkdtemp())
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", str(folder)], check=True))
        proc = subprocess.run(
            [sys.executable, *args], cwd=folder, env=child_env(), capture_output=True,
            text=True, timeout=WAIT_S,
        )
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)  # the planned failures
        return folder

    def check(self, folder: Path) -> None:
        found, texts = outcomes(folder)
        self.assertEqual(found, EXPECTED)
        for cls in CLASSES:
            with self.subTest(cls=cls):
                self.assertIn("rank 1 summed 3", texts[(cls, "test_sum_1_large")])

    def test_under_unittest(self) -> None:
        self.check(self.run_suite([str(SUITE), "--save-xml", "xml"]))

    def test_under_pytest(self) -> None:
        folder = self.run_suite(["-m", "pytest", "-p", "no:cacheprovider", "-q",
                                 str(SUITE), "--junitxml", "xml/pytest.xml"])
        self.check(folder)
