"""`-j N|auto`: tests side by side, as many at once as fit a budget of cores.

The plan is cut into units that must run whole in one process: a shared-process class, any
class with its own class fixtures (setUpClass/tearDownClass), any module with module fixtures;
every other test is a unit of its own. A unit costs the cores it keeps busy: its widest
test's rank count (1 for a test without ranks). Worker processes (harness/runner/worker.py)
run one unit at a time; the controller hands the next unit, in plan order, to an idle worker
once its cost fits beside the units running (a unit wider than the budget runs alone). Each
test's intra-op threads follow its unit's cost, not the machine.

On accelerators a unit costs devices instead, and each worker owns a fixed, disjoint set of
them (CUDA_VISIBLE_DEVICES) as wide as the widest unit, so tests running at once never
share a device.

Workers stream one TestReport per finished test (its JSON form); the controller feeds them to
the engine's own collector callbacks, so progress, the table, the closing line and the XML are
built as in a serial run (the engine sorts failures and XML entries back into plan order). A
worker that dies fails only the test it was running (the rest of its unit goes to a new
worker); a test that outlives the harness timeout by TIMEOUT_GRACE_S has its worker stopped
and fails alone.
When the budget holds no two typical units (2-rank tests on 2 cores), the engine runs the
plan serially in-process instead: workers would only add their start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import unittest
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Callable, Dict, List, Optional, Tuple

from harness import settings
from harness.launch.ranked_case import RankedTestCase
from harness.outcome.fold import fold
from harness.outcome.report import ERROR, Outcome, TestReport
from harness.requirements.world_size import world_size_of
from harness.runner.loader import Plan
from harness.runner.worker import PATH_ENV, PRELOAD_ENV, WORKER_FD_ENV

# Not `-m harness.runner.worker`: the package imports the module before runpy would run it.
WORKER_COMMAND = "import sys; from harness.runner.worker import main; sys.exit(main())"
TIMEOUT_GRACE_S = 60.0  # past the harness timeout, a test's worker is stopped (a rank-less hang)
MAX_LOST_WORKERS = 2  # workers a unit may lose before its first test before that test fails
STOP_WAIT_S = 10.0  # how long a stopped worker may take to clean up before it is killed


@dataclass
class Unit:
    """Tests that run together in one worker, in order."""

    index: int  # position in the plan: results are reported in this order
    module: str
    tests: List[unittest.TestCase]
    cost: int
    lost_workers: int = 0  # workers that died before beginning any of its tests


def parse_jobs(text: str) -> int:
    """`-j`'s value: a positive number of cores, or `auto` (the machine's)."""
    if text == "auto":
        return settings.machine_cores()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{text!r} is neither a positive integer nor 'auto'")
    return int(text)


def test_cost(test: unittest.TestCase) -> int:
    """The cores (or devices) a test keeps busy: its ranks, 1 without ranks."""
    if not isinstance(test, RankedTestCase):
        return 1
    try:
        return max(1, int(world_size_of(test)))  # the ranks it will run with
    except Exception:  # noqa: BLE001 - a world size that cannot be read fails in the test itself
        return 1


def _own_fixture(cls: type, name: str) -> bool:
    return getattr(cls, name).__func__ is not getattr(unittest.TestCase, name).__func__


def _whole(test: unittest.TestCase) -> Any:
    """What a test must run with in one process: its module (module fixtures), its class
    (class fixtures: shared-process classes stop their ranks in tearDownClass), or itself."""
    cls = type(test)
    module = sys.modules.get(cls.__module__)
    if module is not None and (hasattr(module, "setUpModule") or hasattr(module, "tearDownModule")):
        return cls.__module__
    if _own_fixture(cls, "setUpClass") or _own_fixture(cls, "tearDownClass"):
        return cls
    return None


def units_of(plan: Plan, budget: int) -> List[Unit]:
    """The plan cut into units, in plan order; a unit's cost is capped at `budget`."""
    units: List[Unit] = []
    for module, tests in plan:
        previous: Any = None
        for test in tests:
            whole = _whole(test)
            if whole is None or whole != previous or units[-1].module != module:
                units.append(Unit(len(units), module, [], 0))
            units[-1].tests.append(test)
            units[-1].cost = min(budget, max(units[-1].cost, test_cost(test)))
            previous = whole
    return units


def pool_size(units: List[Unit], budget: int) -> int:
    """How many workers: as many typical units (the median cost) as fit in the budget, at
    most one per unit. Sized by the typical unit, not the cheapest: a worker costs a start
    (an interpreter importing torch and the suites), which a few cheap units would not repay."""
    if not units:
        return 0
    costs = sorted(unit.cost for unit in units)
    return min(len(units), max(1, budget // costs[len(costs) // 2]))


class _Worker:
    """One worker process, the unit it runs and the test of it that is running."""

    def __init__(self, env: Dict[str, str]) -> None:
        read_fd, write_fd = os.pipe()
        env = {**env, WORKER_FD_ENV: str(write_fd)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER_COMMAND], stdin=subprocess.PIPE,
            pass_fds=(write_fd,), env=env, text=True,
        )
        os.close(write_fd)
        self.messages = read_fd
        self._partial = b""
        self.unit: Optional[Unit] = None
        self.started: List[str] = []  # ids of the unit's tests begun, in order
        self.finished = 0  # how many of the unit's tests have a report
        self.running_since = 0.0

    def receive(self) -> Optional[List[Dict[str, Any]]]:
        """The messages that arrived (the fd was readable); None at EOF (the worker died)."""
        data = os.read(self.messages, 1 << 16)
        if not data:
            return None
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        return [json.loads(line) for line in lines]

    def send(self, unit: Unit) -> None:
        self.unit, self.started, self.finished = unit, [], 0
        ids = [test.id() for test in unit.tests]
        assert self.process.stdin is not None
        message: Dict[str, Any] = {"module": unit.module, "ids": ids, "cores": unit.cost}
        if unit.module == "__main__":  # run_tests() of a script: the worker imports it by path
            message["path"] = os.path.abspath(sys.modules["__main__"].__file__ or "")
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        """Ask the worker to stop its ranks and exit (SIGTERM), kill it if it does not."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.close()

    def close(self) -> None:
        if self.process.stdin is not None and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except BrokenPipeError:
                pass
        self.process.wait()
        if self.messages >= 0:
            os.close(self.messages)
            self.messages = -1


@dataclass
class Hooks:
    """What the controller tells the engine: a test began, a report arrived (with its place in
    plan order), a unit finished (its module and wall time); whether to stop."""

    started: Callable[[str], None]
    recorded: Callable[[Optional[unittest.TestCase], TestReport, Tuple[int, int]], None]
    unit_done: Callable[[str, float], None]
    should_stop: Callable[[], bool]
    timeout: float = field(default_factory=settings.default_timeout)


class Controller:
    """Runs the units on `workers` worker processes within `budget` cores (or devices)."""

    def __init__(self, units: List[Unit], workers: int, budget: int, hooks: Hooks) -> None:
        self.pending = list(units)
        self.budget = budget
        self.hooks = hooks
        self.tests: Dict[str, unittest.TestCase] = {
            test.id(): test for unit in units for test in unit.tests
        }
        self.modules = sorted({u.module for u in units if u.module in sys.modules})
        self.slots = self._device_slots(workers, max((u.cost for u in units), default=1))
        self.workers: List[Optional[_Worker]] = [None] * len(self.slots)
        self.began: Dict[int, float] = {}
        self.reports_of: Dict[int, int] = {}  # unit index -> reports it sent so far

    @staticmethod
    def _device_slots(workers: int, widest: int) -> List[Optional[str]]:
        """Each worker's CUDA_VISIBLE_DEVICES (None on CPU): disjoint, `widest` devices each."""
        if settings.device_type() == "cpu":
            return [None] * workers
        count = settings.accelerator_count()
        per = max(1, min(widest, count))
        return [",".join(map(str, range(i * per, (i + 1) * per)))
                for i in range(max(1, min(workers, count // per)))]

    def _start(self, slot: int) -> _Worker:
        env = {**os.environ, PRELOAD_ENV: ",".join(self.modules),
               PATH_ENV: os.pathsep.join(sys.path)}
        visible = self.slots[slot]
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        worker = self.workers[slot] = _Worker(env)
        return worker

    def _used(self) -> int:
        return sum(w.unit.cost for w in self.workers if w is not None and w.unit is not None)

    def _next_unit(self) -> Optional[Unit]:
        """The first pending unit that fits beside those running (any, when none runs); on
        devices, the next one: each worker's devices are its own."""
        if self.slots[0] is not None:
            return self.pending.pop(0) if self.pending else None
        used = self._used()
        for i, unit in enumerate(self.pending):
            if used == 0 or used + unit.cost <= self.budget:
                return self.pending.pop(i)
        return None

    def _dispatch(self) -> None:
        for slot, worker in enumerate(self.workers):
            if worker is not None and worker.unit is not None:
                continue
            unit = self._next_unit()
            if unit is None:
                return
            if worker is None or worker.process.poll() is not None:
                worker = self._start(slot)
            worker.send(unit)
            self.began[unit.index] = time.monotonic()

    def run(self) -> None:
        """Until every unit ran, or the engine says stop; stops every worker either way."""
        try:
            self._dispatch()
            while any(w is not None and w.unit is not None for w in self.workers):
                if self.hooks.should_stop():
                    break
                self._wait_once()
                if not self.hooks.should_stop():
                    self._dispatch()
        finally:
            self._stop_all()

    def _stop_all(self) -> None:
        for worker in self.workers:
            if worker is not None and worker.unit is None and worker.process.poll() is None:
                worker.close()  # idle: closing stdin ends it
        for worker in self.workers:
            if worker is not None and worker.process.returncode is None:
                worker.stop()

    def _wait_once(self) -> None:
        busy = [w for w in self.workers if w is not None and w.unit is not None]
        ready = wait([w.messages for w in busy], timeout=1.0)
        for worker in busy:
            if worker.messages in ready:
                messages = worker.receive()
                if messages is None:
                    self._lost(worker, f"its worker exited with code {worker.process.wait()}")
                for message in messages or []:
                    self._handle(worker, message)
            elif worker.started and time.monotonic() - worker.running_since > self._limit():
                worker.stop()
                self._lost(worker, f"timed out after {self._limit():g} s (its worker was stopped)")

    def _limit(self) -> float:
        return self.hooks.timeout + TIMEOUT_GRACE_S

    def _handle(self, worker: _Worker, message: Dict[str, Any]) -> None:
        unit = worker.unit
        assert unit is not None
        if message["kind"] == "start":
            if not worker.started:  # the unit's time, from its first test (not the worker's start)
                self.began[unit.index] = time.monotonic()
            worker.started.append(message["id"])
            worker.running_since = time.monotonic()
            self.hooks.started(message["id"])
        elif message["kind"] == "report":
            report = TestReport.from_data(message["report"])
            if message["is_test"]:
                worker.finished += 1
            test = self.tests.get(report.test_id) if message["is_test"] else None
            self.hooks.recorded(test, report, self._place(unit))
        elif message["kind"] == "done":
            self.hooks.unit_done(unit.module, time.monotonic() - self.began[unit.index])
            worker.unit = None

    def _place(self, unit: Unit) -> Tuple[int, int]:
        """Where a unit's next report goes in plan order: its unit, then its arrival."""
        self.reports_of[unit.index] = self.reports_of.get(unit.index, 0) + 1
        return unit.index, self.reports_of[unit.index]

    def _lost(self, worker: _Worker, why: str) -> None:
        """The worker died (or was stopped) inside its unit: the test it was running fails,
        the unit's tests it never began go back to the front of the queue."""
        unit = worker.unit
        assert unit is not None
        worker.unit = None
        if worker.process.returncode is None:
            worker.stop()
        else:
            worker.close()
        slot = self.workers.index(worker)
        self.workers[slot] = None
        begun = len(worker.started)
        if not begun:  # died before its first test: once may be bad luck, twice is the test's
            unit.lost_workers += 1
            if unit.lost_workers >= MAX_LOST_WORKERS:
                worker.started, begun = [unit.tests[0].id()], 1
        if begun > worker.finished:
            test_id = worker.started[-1]
            lost = Outcome(ERROR, f"{test_id}: {why}", f"{why} while running {test_id}",
                           "WorkerLost")
            report = fold(test_id, [], lost, unit.module)
            self.hooks.recorded(self.tests.get(test_id), report, self._place(unit))
        left = unit.tests[begun:]
        self.hooks.unit_done(unit.module, time.monotonic() - self.began[unit.index])
        if left:
            lost = unit.lost_workers if not worker.started else 0
            self.pending.insert(0, Unit(unit.index, unit.module, left, unit.cost, lost))
