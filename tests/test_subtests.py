"""harness.single_process.subtests: grids inside one test, as upstream's run_subtests plus every
failing point.

Upstream resets dynamo around every grid point and puts a barrier after each; here the same,
and a failing point does not end the grid.
"""

import unittest
from unittest import mock

import pytest
import torch
import torch.distributed as dist

from harness import TestCase, run_subtests
from harness.launch.context import RankContext
from harness.outcome.rank_record import RankRecord, RecordSink, ReportingResult
from tests.upstream_probe import compare


class RunSubtestsTest(unittest.TestCase):
    def _run(self, body, context=None):
        """Run `body` as a test; with a RankContext, as a rank of a multi-rank test."""

        class Case(TestCase):
            def test_grid(self):
                body(self)

        result = unittest.TestResult()
        case = Case("test_grid")
        case.rank_context = context
        case.run(result)
        return case, result

    def test_cartesian_product_in_dict_order_with_extra_args(self):
        seen = []

        def fn(prefix, a, b, suffix):
            seen.append((prefix, a, b, suffix))

        case, result = self._run(
            lambda self: run_subtests(self, {"a": [1, 2], "b": ["x", "y"]}, fn, "p", suffix="s")
        )
        self.assertTrue(result.wasSuccessful())
        self.assertEqual(
            seen, [("p", 1, "x", "s"), ("p", 1, "y", "s"), ("p", 2, "x", "s"), ("p", 2, "y", "s")]
        )

    def test_failing_point_is_reported_with_params_and_the_rest_still_run(self):
        seen = []

        def fn(self_, a, b):
            seen.append((a, b))
            self_.assertNotEqual((a, b), (2, "x"))

        _, result = self._run(
            lambda self: self.run_subtests({"a": [1, 2, 3], "b": ["x"]}, fn, self)
        )
        self.assertFalse(result.wasSuccessful())
        self.assertEqual(seen, [(1, "x"), (2, "x"), (3, "x")])
        self.assertEqual(len(result.failures), 1)
        self.assertIn("(a=2, b='x')", str(result.failures[0][0]))

    def test_skipped_point_is_not_a_failure(self):
        def fn(self_, a):
            if a == 1:
                self_.skipTest("not this one")

        _, result = self._run(lambda self: self.run_subtests({"a": [1, 2]}, fn, self))
        self.assertTrue(result.wasSuccessful())
        self.assertEqual([reason for _, reason in result.skipped], ["not this one"])

    def test_in_a_rank_each_point_is_counted_and_synchronised(self):
        synced = []

        def grid_sync(params, passed):
            synced.append((params, passed))
            return True

        context = RankContext(0, 2, ReportingResult(RecordSink(RankRecord(0))), grid_sync=grid_sync)

        def fn(a):
            assert a != 2

        self._run(lambda self: self.run_subtests({"a": [1, 2, 3]}, fn), context=context)
        self.assertEqual(synced, [({"a": 1}, True), ({"a": 2}, False), ({"a": 3}, True)])
        self.assertEqual(context.grid_points, 3)

    def test_ranks_out_of_step_stop_the_grid(self):
        seen = []
        context = RankContext(
            0, 2, ReportingResult(RecordSink(RankRecord(0))),
            grid_sync=lambda params, passed: passed,
        )

        def fn(a):
            seen.append(a)
            assert a != 2

        _, result = self._run(lambda self: self.run_subtests({"a": [1, 2, 3]}, fn), context=context)
        self.assertEqual(seen, [1, 2])
        self.assertEqual(context.grid_points, 2)
        self.assertTrue(any("could not stay in step" in text for _, text in result.failures))

    def test_bad_grids_name_the_problem(self):
        case = TestCase()
        with self.assertRaisesRegex(TypeError, "must be a dict.*got list"):
            run_subtests(case, [("a", [1])], print)
        with self.assertRaisesRegex(ValueError, r"grid\['b'\] is an empty list"):
            run_subtests(case, {"a": [1], "b": []}, print)
        with self.assertRaisesRegex(TypeError, r"grid\['a'\] must be a list"):
            run_subtests(case, {"a": 3}, print)



def _counted_compiles(calls):
    """A torch.compile backend that counts the graphs it is given and runs them eagerly."""

    def backend(graph_module, example_inputs):
        calls.append(1)
        return graph_module.forward

    return backend


def _double(x):
    return x * 2


class UpstreamGridSemanticsTest(unittest.TestCase):
    def test_each_point_compiles_afresh(self):
        # upstream resets dynamo at each point: a compile counter sees one compile per point
        calls = []
        compiled = torch.compile(_double, backend=_counted_compiles(calls))

        class Case(TestCase):
            def test_grid(self):
                self.run_subtests({"n": [1, 2, 3]}, lambda n: compiled(torch.ones(2) * n))

        result = unittest.TestResult()
        Case("test_grid").run(result)
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertEqual(len(calls), 3)

    def test_a_barrier_follows_each_point_where_a_group_is_initialised(self):
        seen = []

        class Case(TestCase):
            def test_grid(self):
                self.run_subtests({"a": [1, 2]}, lambda a: seen.append(a))

        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
        try:
            with mock.patch.object(dist, "barrier", wraps=dist.barrier) as barrier:
                result = unittest.TestResult()
                Case("test_grid").run(result)
        finally:
            dist.destroy_process_group()
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertEqual(seen, [1, 2])
        self.assertEqual(barrier.call_count, 2)

    def test_no_barrier_without_a_group(self):
        class Case(TestCase):
            def test_grid(self):
                self.run_subtests({"a": [1, 2]}, lambda a: None)

        with mock.patch.object(dist, "barrier") as barrier:
            result = unittest.TestResult()
            Case("test_grid").run(result)
        self.assertTrue(result.wasSuccessful())
        barrier.assert_not_called()


GRID_PROBE = """
import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase, run_subtests
from torch.testing._internal.common_utils import run_tests


class TestGrid(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _init(self):
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size,
                                init_method=f"file://{self.file_name}")

    def test_each_point_compiles_once(self):
        self._init()
        compiles = []

        def backend(graph_module, example_inputs):
            compiles.append(1)
            return graph_module.forward

        compiled = torch.compile(lambda x: x * 2, backend=backend)

        def point(n):
            before = len(compiles)
            compiled(torch.ones(2) * n)
            self.assertEqual(len(compiles), before + 1)

        run_subtests(self, {"n": [1, 2, 3]}, point)
        dist.destroy_process_group()

    def test_a_failing_point(self):
        self._init()
        run_subtests(self, {"n": [1, 2]}, lambda n: self.assertEqual(n, 1))


if __name__ == "__main__":
    run_tests()
"""


@pytest.mark.slow
class GridMatchesUpstreamTest(unittest.TestCase):
    """Differential: a compile-counter grid in rank processes under both harnesses."""

    def test_same_outcome_per_test_id(self) -> None:
        theirs, ours, shown = compare(GRID_PROBE)
        self.assertEqual(theirs["TestGrid.test_each_point_compiles_once"], "passed", shown)
        # A rank's failure is an error upstream, a failure here (AssertionError): both fail.
        failed = {"failure", "error"}
        self.assertIn(theirs.pop("TestGrid.test_a_failing_point"), failed, shown)
        self.assertIn(ours.pop("TestGrid.test_a_failing_point"), failed, shown)
        self.assertEqual(ours, theirs, shown)


if __name__ == "__main__":
    unittest.main()
