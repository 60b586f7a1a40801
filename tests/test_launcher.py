"""harness.launch: a new way of running ranks needs only a Launcher; the base does the rest.

`FakeRanks` below is a complete launch mode in a few lines: it starts nothing, and `join`
hands back records it made up. RankedTestCase must validate the class before asking for it,
call start/join/close in order, and report the verdict of those records (grid points
replayed as subtests). RankContext and the in-process runner are checked here too.
"""

from __future__ import annotations

import ast
import os
import unittest
from typing import Any, List, Optional, Tuple
from unittest import mock

from harness.launch.context import RankContext
from harness.launch.in_process import SimulatedRanks, run_rank_here
from harness.launch.job import Job, timeout_before
from harness.launch.launcher import Launcher, RankSetup
from harness.launch.ranked_case import SUPERVISOR_RANK, RankedTestCase
from harness.outcome.rank_record import Event, RankRecord, RecordSink, ReportingResult
from harness.requirements.decorators import skip_if_lt_x_gpu
from harness.settings import HarnessConfigError
from tests.fixtures.events import rank_failure

CALLS: List[str] = []
HARNESS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "harness")


class FakeRanks(Launcher):
    """A launch mode that runs nothing: its records are whatever the case class says."""

    def __init__(self, records: List[RankRecord], timed_out_after: Optional[float]) -> None:
        self.records, self.timed_out_after = records, timed_out_after

    def start(self, job: Job) -> RankSetup:
        CALLS.append(f"start {job.world_size}")
        return RankSetup()

    def join(self, job: Job) -> Tuple[List[RankRecord], Optional[float]]:
        CALLS.append("join")
        return self.records, self.timed_out_after

    def close(self) -> None:
        CALLS.append("close")


def finished(rank: int, *events: Event) -> RankRecord:
    return RankRecord(rank, events=[*events, Event("done")], exitcode=0)


def faked(**attrs: Any) -> type:
    """A case class whose launcher is FakeRanks (made here so that loaders do not collect it)."""

    class Faked(RankedTestCase):
        world_size = 2
        records: List[RankRecord] = []
        timed_out_after: Optional[float] = None

        def make_launcher(self) -> Launcher:
            return FakeRanks(self.records, self.timed_out_after)

        def test_body(self) -> None:
            raise AssertionError("a faked test's body never runs in the supervisor")

    for name, value in attrs.items():
        setattr(Faked, name, value)
    return Faked


def run(records: List[RankRecord], timed_out_after: Optional[float] = None, **attrs: Any
        ) -> Tuple[unittest.TestResult, RankedTestCase]:
    cls = faked(records=records, timed_out_after=timed_out_after, **attrs)
    CALLS.clear()
    case = cls("test_body")
    result = unittest.TestResult()
    case.run(result)
    return result, case


class NewModeNeedsOnlyALauncher(unittest.TestCase):
    def test_passing_records_pass_and_the_launcher_is_used_in_order(self) -> None:
        records = [finished(0, Event("success")), finished(1, Event("success"))]
        result, case = run(records)
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertEqual(CALLS, ["start 2", "join", "close", "close"])  # close is idempotent
        self.assertEqual(case.rank_records, records)
        self.assertEqual(case.rank, SUPERVISOR_RANK)

    def test_a_failing_rank_fails_the_test_with_its_traceback(self) -> None:
        result, _ = run([finished(0), finished(1, rank_failure("Traceback\nValueError: x"))])
        self.assertEqual(len(result.failures), 1)
        self.assertIn("rank 1 raised:\nTraceback\nValueError: x", result.failures[0][1])

    def test_the_launchers_timeout_is_reported(self) -> None:
        stuck = RankRecord(1, stopped=True, stack="File x, in wait")
        result, _ = run([finished(0), stuck], timed_out_after=7.0)
        self.assertEqual(result.failures, [])  # an error, as upstream's timeouts
        self.assertIn("timed out after 7 s with rank 1 still running", result.errors[0][1])

    def test_grid_points_are_replayed_as_subtests(self) -> None:
        point = rank_failure("Traceback\nAssertionError: p", "subtest", "fail", {"x": 1})
        result, _ = run([finished(0, point), finished(1)])
        self.assertEqual(len(result.failures), 1)
        self.assertIn("(x=1)", str(result.failures[0][0]))

    def test_skips_of_every_rank_skip(self) -> None:
        result, _ = run([finished(0, Event("skip", "why")), finished(1, Event("skip", "why"))])
        self.assertEqual([reason for _, reason in result.skipped], ["why"])

    def test_the_class_is_checked_before_the_launcher_is_asked(self) -> None:
        result, _ = run([], world_size=0)
        self.assertEqual(len(result.skipped), 1)
        self.assertEqual(CALLS, [])
        result, _ = run([], world_size=-1)
        self.assertIn("Faked.world_size must be a positive int, got -1", result.errors[0][1])
        self.assertEqual(CALLS, [])
        result, _ = run([], timeout=0)
        self.assertIn("Faked.timeout must be a positive number", result.errors[0][1])
        self.assertEqual(CALLS, [])

    def test_a_requirement_skips_before_the_launcher_is_asked(self) -> None:
        result, _ = run([], test_body=skip_if_lt_x_gpu(64)(faked().test_body))
        self.assertIn("Need at least 64 CUDA devices", result.skipped[0][1])
        self.assertEqual(CALLS, [])

    def test_requirements_are_checked_once_per_test(self) -> None:
        checked: List[str] = []

        def count(case: Any) -> None:
            checked.append(case.id())

        records = [finished(0, Event("success")), finished(1, Event("success"))]
        with mock.patch("harness.single_process.testcase.check_case_requirements", count), \
                mock.patch("harness.launch.ranked_case.check_case_requirements", count):
            result, _ = run(records)
            self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
            self.assertEqual(len(checked), 1)
            checked.clear()
            run(records, setUp=lambda self: None)  # a setUp that skips ours: checked at start
            self.assertEqual(len(checked), 1)

    def test_a_setup_that_fails_after_start_still_closes(self) -> None:
        def set_up(self: RankedTestCase) -> None:
            RankedTestCase.setUp(self)
            self.start_ranks()  # what upstream's _spawn_processes() in a setUp does
            raise RuntimeError("later part of setUp")

        result, _ = run([], setUp=set_up)
        self.assertIn("later part of setUp", result.errors[0][1])
        self.assertEqual(CALLS, ["start 2", "close"])

    def test_ranks_start_after_a_set_up_that_does_not_start_them(self) -> None:
        def set_up(self: RankedTestCase) -> None:
            CALLS.append("setUp")

        records = [finished(0, Event("success")), finished(1, Event("success"))]
        result, _ = run(records, setUp=set_up)
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertEqual(CALLS, ["setUp", "start 2", "join", "close", "close"])

    def test_a_mode_must_name_its_launcher(self) -> None:
        class Unnamed(RankedTestCase):
            def test_body(self) -> None:
                raise AssertionError("never runs")

        result = unittest.TestResult()
        Unnamed("test_body").run(result)
        self.assertIn("Unnamed does not say how its ranks run", result.errors[0][1])

    def test_a_configuration_error_is_one_line(self) -> None:
        case = faked(world_size="two")("test_body")
        with self.assertRaisesRegex(HarnessConfigError, "^Faked.world_size must be a positive"):
            case.checked_rank_settings()


class RunnersDeadline(unittest.TestCase):
    """A runner's deadline (pytest-timeout's) leaves the ranks most of the time: a test well
    inside `--timeout 10` passes, and the hang report still comes before the runner's."""

    def test_the_ranks_get_all_but_a_margin_of_about_a_quarter(self) -> None:
        self.assertEqual(timeout_before(10.0), 7.5)  # 2.5 s: enough to stop and report
        self.assertEqual(timeout_before(16.0), 12.0)  # a quarter
        self.assertEqual(timeout_before(60.0), 55.0)  # at most 5 s

    def test_a_short_deadline_still_leaves_the_ranks_time(self) -> None:
        self.assertEqual(timeout_before(3.0), 1.2)  # 60% of it at most for the margin
        self.assertEqual(timeout_before(0.05), 0.1)  # never below the least timeout


class Context(unittest.TestCase):
    def context(self, **fields: Any) -> RankContext:
        return RankContext(1, 2, ReportingResult(RecordSink(RankRecord(1))), **fields)

    def test_grid_point_done_counts_then_synchronises(self) -> None:
        seen = []

        def grid_sync(params: Any, passed: bool) -> bool:
            seen.append((params, passed, context.grid_points))
            return passed

        context = self.context(grid_sync=grid_sync)
        self.assertTrue(context.grid_point_done({"a": 1}, True))
        self.assertFalse(context.grid_point_done({"a": 2}, False))
        self.assertEqual(seen, [({"a": 1}, True, 1), ({"a": 2}, False, 2)])
        self.assertEqual(context.grid_points, 2)

    def test_without_a_grid_sync_every_point_goes_on(self) -> None:
        context = self.context()
        self.assertTrue(context.grid_point_done({}, False))
        self.assertEqual(context.grid_points, 1)

    def test_failed_follows_the_result(self) -> None:
        context = self.context()
        self.assertFalse(context.failed)
        context.result.addFailure(unittest.TestCase(), (ValueError, ValueError("x"), None))
        self.assertTrue(context.failed)


SEEN: List[Tuple[Any, ...]] = []


def simulated() -> type:
    """A case class whose ranks are simulated here (made here so that loaders do not collect
    it); its grid's second point fails."""

    class Simulated(RankedTestCase):
        world_size = 3

        def make_launcher(self) -> Launcher:
            return SimulatedRanks()

        def test_grid(self) -> None:
            assert self.rank_context is not None
            SEEN.append((os.getpid(), self.rank, self.rank_context.world_size))

            def point(x: int) -> None:
                self.assertNotEqual(x, 2)

            self.run_subtests({"x": [1, 2]}, point)

    SEEN.clear()
    return Simulated


class InProcess(unittest.TestCase):
    def test_run_rank_here_records_the_rank_of_a_second_instance(self) -> None:
        record = run_rank_here(simulated()("test_grid").job(), 1, 3, init_method="x://")
        self.assertEqual(SEEN, [(os.getpid(), 1, 3)])
        self.assertEqual((record.rank, record.pid, record.grid_points), (1, os.getpid(), 2))
        self.assertEqual([(e.kind, e.params, e.status) for e in record.events[:2]],
                         [("subtest", {"x": 1}, "pass"), ("subtest", {"x": 2}, "fail")])
        self.assertGreater(record.duration, 0.0)

    def test_simulated_ranks_run_the_test_once_here(self) -> None:
        case = simulated()("test_grid")
        result = unittest.TestResult()
        case.run(result)
        self.assertEqual(SEEN, [(os.getpid(), 0, 3)])
        self.assertEqual(len(result.failures), 1)
        self.assertIn("(x=2)", str(result.failures[0][0]))
        self.assertIn("rank 0 failed this grid point", result.failures[0][1])

    def test_a_case_that_cannot_become_a_rank_is_a_failure(self) -> None:
        class Refuses(simulated()):  # type: ignore[misc]
            def attach_rank(self, context: RankContext) -> None:
                raise RuntimeError("no rank for me")

        record = run_rank_here(Refuses("test_grid").job(), 0, 1)
        self.assertEqual([e.kind for e in record.events], ["failure", "done"])
        self.assertIn("RuntimeError: no rank for me", record.events[0].text)


def harness_imports(package: str) -> List[Tuple[str, str]]:
    """(module file, imported harness module) for every import in harness/<package>/."""
    found = []
    folder = os.path.join(HARNESS_DIR, package)
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(folder, name)) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            found += [(name, m) for m in modules if m.startswith("harness.")]
    return found


class Layering(unittest.TestCase):
    """One record below both modes: neither mode imports the other, the shared layer neither."""

    def assert_imports_none_of(self, package: str, *forbidden: str) -> None:
        bad = [(f, m) for f, m in harness_imports(package) if m.startswith(forbidden)]
        self.assertEqual(bad, [], f"harness/{package} imports {forbidden}")

    def test_threads_do_not_import_processes(self) -> None:
        self.assert_imports_none_of("threads", "harness.process")

    def test_processes_do_not_import_threads(self) -> None:
        self.assert_imports_none_of("process", "harness.threads")

    def test_the_shared_layer_imports_no_mode(self) -> None:
        self.assert_imports_none_of("launch", "harness.process", "harness.threads",
                                    "harness.runner", "harness.kit")

    def test_the_check_sees_imports(self) -> None:
        self.assertIn(("launchers.py", "harness.process.supervisor"), harness_imports("process"))


if __name__ == "__main__":
    unittest.main()
