"""Differential runs: the same small test file under upstream's installed harness and ours.

A file is written with upstream's imports (`torch.testing._internal...`); its harness twin is
that file after `python -m harness.migrate`. Each runs in a fresh interpreter, its tests
collected by unittest's loader, and reports per test id the outcome (pass, skip, fail, error,
xfail, xpass) and, for skips, the reason. Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from tests.fixtures import REPO, child_env, upstream_env

RUNNER = r'''
import json, sys, unittest
sys.path.insert(0, sys.argv[1])
module = __import__(sys.argv[2])
suite = unittest.defaultTestLoader.loadTestsFromModule(module)
outcomes = {}

class Result(unittest.TestResult):
    def _put(self, test, outcome, reason=None):
        outcomes[test.id().split(".", 1)[1]] = [outcome, reason]
    def addSuccess(self, test): self._put(test, "pass")
    def addSkip(self, test, reason): self._put(test, "skip", reason)
    def addFailure(self, test, err): self._put(test, "fail", self._text(err, test))
    def addError(self, test, err):
        if isinstance(test, unittest.TestCase):
            self._put(test, "error", self._text(err, test))
        else:
            outcomes[str(test)] = ["error", self._text(err, test)]
    def _text(self, err, test): return self._exc_info_to_string(err, test)[-600:]
    def addExpectedFailure(self, test, err): self._put(test, "xfail")
    def addUnexpectedSuccess(self, test): self._put(test, "xpass")

suite.run(Result())
print("OUTCOMES " + json.dumps(outcomes, sort_keys=True))
'''

Outcomes = Dict[str, List[Optional[str]]]


def run_file(folder: Path, module: str, env: Optional[Dict[str, str]] = None,
             timeout: float = 600, upstream: bool = False) -> Outcomes:
    """Per test id of `folder/module.py`, [outcome, skip reason or failure text]; `upstream`:
    the file imports upstream's harness (its ranks start from tests/upstream_site's server)."""
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(folder), module], cwd=folder,
                          capture_output=True, text=True, timeout=timeout,
                          env=(upstream_env if upstream else child_env)(env))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("OUTCOMES ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"running {module} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("OUTCOMES "):])


def both(upstream_source: str, env: Optional[Dict[str, str]] = None) -> Tuple[Outcomes, Outcomes]:
    """(upstream's outcomes, ours) for a test file written with upstream's imports; ours run
    the file `python -m harness.migrate` made of it (which must leave nothing private)."""
    with tempfile.TemporaryDirectory(prefix="differential.") as tmp:
        folder = Path(tmp)
        (folder / "upstream_file.py").write_text(upstream_source)
        (folder / "harness_file.py").write_text(upstream_source)
        migrate = subprocess.run(
            [sys.executable, "-m", "harness.migrate", str(folder / "harness_file.py")],
            capture_output=True, text=True, env=child_env(), cwd=REPO, timeout=300)
        if migrate.returncode != 0:
            raise AssertionError(f"migrate left private imports:\n{migrate.stdout}")
        return (run_file(folder, "upstream_file", env, upstream=True),
                run_file(folder, "harness_file", env))
