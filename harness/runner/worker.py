"""A worker of a parallel run (`-j`): runs the units of tests its controller sends, one at a time.

Started by harness/runner/parallel.py (a `python -c` calling `main`), it reads units from
stdin, one JSON line each (`{"module", "ids", "cores"}`, plus `path` for a script the
controller runs as `__main__`), and writes what happens to the pipe
whose fd WORKER_FD_ENV names, one JSON line per message: `start` (a test began), `report`
(a finished test's TestReport, or a class/module fixture's, as `TestReport.to_data`),
`done` (the unit is finished).
It runs a unit the way the serial engine runs a module (unittest's suite, the same
Collector), so reports, fixtures and shared-process classes behave as in a serial run; its
rank processes come from its own forkserver. Stdout and stderr are the run's, as in serial.
A worker stops when stdin closes; interrupted (SIGINT/SIGTERM) it stops its ranks and exits.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import signal
import sys
import unittest
from typing import Any, Dict, List, TextIO, Tuple

import torch

from harness import settings
from harness.compat import unittest_internals
from harness.outcome.report import TestReport
from harness.process import forkserver
from harness.runner import lifecycle
from harness.runner.loader import load_module, resolve_modules
from harness.runner.results import Collector

WORKER_FD_ENV = "HARNESS_WORKER_FD"
PRELOAD_ENV = "HARNESS_WORKER_PRELOAD"  # the run's suite modules, comma-separated
_PR_SET_PDEATHSIG = 1
PATH_ENV = "HARNESS_WORKER_PATH"  # the controller's sys.path: where it found the test files


class _Reporter:
    """Writes the worker's messages to the controller, one JSON line each; ids of a script's
    tests (imported here under its module name) under the controller's `__main__` again."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.renamed: Tuple[str, str] = ("", "")  # (module here, module at the controller)

    def _id(self, test_id: str) -> str:
        here, there = self.renamed
        return there + test_id[len(here):] if here and test_id.startswith(here + ".") else test_id

    def send(self, kind: str, **fields: Any) -> None:
        self.stream.write(json.dumps({"kind": kind, **fields}) + "\n")
        self.stream.flush()

    def started(self, test: unittest.TestCase) -> None:
        self.send("start", id=self._id(test.id()))

    def reported(self, test: Any, report: TestReport) -> None:
        report = dataclasses.replace(report, test_id=self._id(report.test_id))
        self.send("report", report=report.to_data(),
                  is_test=isinstance(test, unittest.TestCase) and not hasattr(test, "stand_in"))


class _Tests:
    """The tests of each module, by id; a fresh instance for each time an id is run."""

    def __init__(self) -> None:
        self._by_module: Dict[str, Dict[str, unittest.TestCase]] = {}

    def take(self, module: str, ids: List[str]) -> List[unittest.TestCase]:
        known = self._by_module.get(module)
        if known is None:
            known = self._by_module[module] = {t.id(): t for t in load_module(module)}
        return [type(known[i])(unittest_internals.method_name(known[i])) for i in ids]


def serve(units: TextIO, reporter: _Reporter) -> None:
    """Run each unit read from `units` until it closes."""
    tests = _Tests()
    collector = Collector(reporter.started, reporter.reported)
    for line in units:
        unit = json.loads(line)
        cores = int(unit["cores"])
        os.environ[settings.CORE_BUDGET_ENV] = str(cores)  # read when its ranks start
        torch.set_num_threads(cores)  # what tests in this process use
        module, ids = unit["module"], unit["ids"]
        collector.suite = module
        if unit.get("path"):  # a script run as __main__ by the controller: import it by path
            here = resolve_modules([unit["path"]])[0]
            reporter.renamed = (here, module)
            module, ids = here, [here + i[len(unit["module"]):] for i in ids]
        unittest.TestSuite(tests.take(module, ids)).run(collector)
        reporter.send("done")


def _die_with_controller() -> None:
    """SIGTERM when the controller dies (even by SIGKILL): the worker then stops its ranks."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def main() -> int:
    """The worker's life: exit 0 when its controller closed stdin, 128+N when stopped by
    signal N; nothing it started outlives it."""
    _die_with_controller()
    reporter = _Reporter(os.fdopen(int(os.environ.pop(WORKER_FD_ENV)), "w"))
    modules = [m for m in os.environ.pop(PRELOAD_ENV, "").split(",") if m]
    paths = os.environ.pop(PATH_ENV, "").split(os.pathsep)
    sys.path[:0] = [path for path in paths if path and path not in sys.path]
    with lifecycle.run_scope():
        try:
            if settings.start_method() == "forkserver":
                forkserver.preload(*modules)
            serve(sys.stdin, reporter)
        except KeyboardInterrupt as stop:
            return lifecycle.exit_code(lifecycle.signal_of(stop))
    return 0

