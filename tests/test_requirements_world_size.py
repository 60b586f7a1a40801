"""harness.requirements.world_size: how many ranks a test runs with, for every base; upstream's
defaults."""

from __future__ import annotations

import os
import textwrap
import unittest
from unittest import mock

import pytest
import torch

from harness import (
    DistributedTestBase,
    DTensorOpTestBase,
    DTensorTestBase,
    FSDPTest,
    FSDPTestContinuous,
    FSDPTestMultiThread,
    MultiProcContinuousTest,
    MultiProcessTestCase,
    MultiThreadedTestCase,
)
from harness.launch.context import RankContext
from harness.outcome.rank_record import RankRecord, RecordSink, ReportingResult
from harness.requirements.world_size import fix_world_size, world_size_of
from tests.fixtures import upstream_diff
from tests.fixtures import world_size_cases as cases


def knobs(**values: str) -> mock._patch:
    """The world-size knobs cleared, then `values` set (the accelerators are `gpus` below)."""
    cleared = {name: "" for name in ("HARNESS_WORLD_SIZE", "HARNESS_ALLOW_CPU", "HARNESS_DEVICE")}
    return mock.patch.dict(os.environ, {**cleared, **values})


def gpus(count: int) -> list:
    return [
        mock.patch.object(torch.cuda, "is_available", return_value=count > 0),
        mock.patch.object(torch.cuda, "device_count", return_value=count),
    ]


def context(rank: int, world_size: int) -> RankContext:
    return RankContext(rank, world_size, ReportingResult(RecordSink(RankRecord(rank))))


class WorldSizeTest(unittest.TestCase):
    def setUp(self) -> None:
        patch = knobs()
        patch.start()
        self.addCleanup(patch.stop)
        self.use_gpus(0)  # the same answers on a machine with GPUs (found on an H100)

    def use_gpus(self, count: int) -> None:
        for patch in gpus(count):
            patch.start()
            self.addCleanup(patch.stop)

    def test_upstream_defaults_on_cpu(self) -> None:
        expected = {
            MultiProcessTestCase: 4, MultiThreadedTestCase: 4, DistributedTestBase: 4,
            DTensorTestBase: 4, DTensorOpTestBase: 4, FSDPTest: 1, FSDPTestMultiThread: 1,
            FSDPTestContinuous: 1, MultiProcContinuousTest: 1,
        }
        for base, size in expected.items():
            self.assertEqual(world_size_of(base()), size, base.__name__)

    def test_fsdp_bases_follow_the_accelerator_count(self) -> None:
        self.use_gpus(2)
        for base in (FSDPTest, FSDPTestMultiThread, FSDPTestContinuous, MultiProcContinuousTest):
            self.assertEqual(world_size_of(base()), 2, base.__name__)
        self.assertEqual(world_size_of(MultiProcessTestCase()), 4)

    def test_class_first_then_env_then_default(self) -> None:
        os.environ["HARNESS_WORLD_SIZE"] = "3"
        self.assertEqual(world_size_of(MultiProcessTestCase()), 3)
        self.assertEqual(world_size_of(FSDPTest()), 3)
        self.assertEqual(world_size_of(cases.FixedFour("test_gated")), 4)
        self.assertEqual(MultiProcContinuousTest.world_size, 3)  # at class level too

    def test_gate_raises_the_world_size_only_where_the_cpu_stands_in(self) -> None:
        self.assertEqual(world_size_of(cases.FromDeviceCount("test_gated")), 0)  # a skip, later
        os.environ["HARNESS_ALLOW_CPU"] = "1"
        self.assertEqual(world_size_of(cases.FromDeviceCount("test_gated")), 2)
        self.assertEqual(world_size_of(cases.FromDeviceCount("test_ungated")), 0)
        self.assertEqual(world_size_of(cases.FixedFour("test_gated")), 4)  # max(class, n)

    def test_a_tests_own_allow_cpu_raises_it_too(self) -> None:
        self.assertEqual(world_size_of(cases.AllowsCpu("test_gated")), 2)
        self.use_gpus(2)  # real accelerators: the class's number, as written
        os.environ["HARNESS_ALLOW_CPU"] = "1"
        self.assertEqual(world_size_of(cases.AllowsCpu("test_gated")), 1)

    def test_the_decided_number_is_what_self_world_size_reads(self) -> None:
        os.environ["HARNESS_ALLOW_CPU"] = "1"
        parent = cases.FromDeviceCount("test_gated")
        fix_world_size(parent, world_size_of(parent))
        self.assertEqual(parent.world_size, 2)  # not the property's 0
        rank = cases.FromDeviceCount("test_gated")
        rank.attach_rank(context(1, 2))
        self.assertEqual((rank.rank, rank.world_size), (1, 2))

    def test_a_mixins_world_size_is_the_classs_and_can_be_fixed(self) -> None:
        case = cases.WithMixin("test_a")
        self.assertEqual(world_size_of(case), 3)
        case.world_size = 5  # upstream's shared ranks assign it
        self.assertEqual(case.world_size, 5)
        self.assertEqual(cases.WithMixin("test_a").world_size, 3)


PARENT_PROBE = textwrap.dedent('''
    import unittest


    class Report:
        """Reports the world size the parent sees, as a skip reason: no rank starts."""

        def setUp(self):
            raise unittest.SkipTest(f"world_size={self.world_size}")

        def test_world_size(self):
            pass


    class Processes(Report, MultiProcessTestCase):
        pass


    class Threads(Report, MultiThreadedTestCase):
        pass


    class Distributed(Report, DistributedTestBase):
        pass


    class FSDP(Report, FSDPTest):
        pass


    class FSDPThreads(Report, FSDPTestMultiThread):
        pass


    class FSDPContinuous(Report, FSDPTestContinuous):
        pass


    class DTensor(Report, DTensorTestBase):
        pass


    class DTensorOp(Report, DTensorOpTestBase):
        pass


    class Own(Report, MultiProcessTestCase):
        @property
        def world_size(self):
            return 3


    class Continuous(MultiProcContinuousTest):
        def test_world_size(self):
            assert self.world_size == 1, self.world_size


    class FSDPRanks(FSDPTest):
        def test_runs(self):
            pass


    if __name__ == "__main__":
        run_tests()
''')

PARENT_NAMES = {
    "common_distributed": [
        "DistributedTestBase", "MultiProcContinuousTest", "MultiProcessTestCase",
        "MultiThreadedTestCase",
    ],
    "common_fsdp": ["FSDPTest", "FSDPTestContinuous", "FSDPTestMultiThread"],
    "distributed._tensor.common_dtensor": ["DTensorOpTestBase", "DTensorTestBase"],
    "common_utils": ["run_tests"],
}


@pytest.mark.slow
class UpstreamDifferentialTest(unittest.TestCase):
    """The same probe under torch's installed harness and this one, on this CPU machine."""

    def test_default_world_sizes_match_upstream(self) -> None:
        """Every base's default as the parent reads it, a shared-process rank's, and FSDPTest
        skipping on CPU (upstream's ranks check the accelerator count)."""
        theirs = upstream_diff.outcomes(PARENT_PROBE, PARENT_NAMES, upstream=True)
        ours = upstream_diff.outcomes(PARENT_PROBE, PARENT_NAMES, upstream=False)
        self.assertEqual(set(ours), set(theirs))
        for test_id, outcome in theirs.items():
            if test_id == "FSDPRanks.test_runs":  # both skip; the reasons' wording differs
                self.assertTrue(ours[test_id].startswith("skipped"), ours[test_id])
                self.assertTrue(outcome.startswith("skipped"), outcome)
            else:
                self.assertEqual(ours[test_id], outcome, test_id)
        self.assertEqual(ours["Processes.test_world_size"], "skipped: world_size=4")
        self.assertEqual(ours["FSDP.test_world_size"], "skipped: world_size=1")


GATED_PROBE = textwrap.dedent('''
    import torch
    import torch.distributed as dist


    class Gated(FSDPTest):
        @property
        def world_size(self):
            return min(4, torch.get_device_module("cuda").device_count())

        @skip_if_lt_x_gpu(2)
        def test_two_ranks(self):
            assert self.world_size == 2, self.world_size
            assert dist.get_world_size() == 2, dist.get_world_size()

        @skip_if_lt_x_gpu(3)
        def test_three_ranks(self):
            assert self.world_size == dist.get_world_size() == 3, self.world_size

        def test_ungated(self):
            pass


    class Default(FSDPTest):
        def test_one_rank(self):
            assert self.world_size == dist.get_world_size() == 1, self.world_size


    if __name__ == "__main__":
        run_tests()
''')


@pytest.mark.slow
class AllowCpuWorldSizeTest(unittest.TestCase):
    """Under HARNESS_ALLOW_CPU, a gated test runs with max(class world size, n) ranks and every
    rank reads that number. Upstream cannot be forced onto CPU here (its FSDPTest ranks exit
    with a skip code wherever there are fewer accelerators than ranks), so this runs ours."""

    def test_gated_tests_run_with_the_gates_ranks(self) -> None:
        names = {"common_fsdp": ["FSDPTest"], "common_distributed": ["skip_if_lt_x_gpu"],
                 "common_utils": ["run_tests"]}
        ours = upstream_diff.outcomes(GATED_PROBE, names, upstream=False,
                                      env={"HARNESS_ALLOW_CPU": "1"})
        self.assertEqual(ours, {
            "Gated.test_two_ranks": "passed",
            "Gated.test_three_ranks": "passed",
            "Gated.test_ungated": "skipped: Gated.world_size is 0: no ranks to start "
                                  "(0 accelerators found)",
            "Default.test_one_rank": "passed",
        })
