"""MultiProcContinuousTest / FSDPTestContinuous: upstream's class API on shared processes.

The bases must give a test what upstream's do (one default group for the class, there before
each test, `rank`, `world_size`, `pg`/`process_group`, `backend_str()`, `device_type()`,
`_init_pg` overrides, device-type instantiation) and, beyond upstream, let a failing test
fail alone. The fault cases of the shared mode are in tests/test_shared_ranks.py.
"""

from __future__ import annotations

import os
import unittest
from datetime import timedelta
from typing import Any, List
from unittest import mock

import pytest
import torch
import torch.distributed as dist

from harness import settings
from harness.kit.fsdp import FSDPTestContinuous
from harness.process.continuous import MultiProcContinuousTest, class_device_type
from harness.requirements.decorators import accelerators_suffice, skip_if_lt_x_gpu
from harness.single_process.device_type import instantiate_device_type_tests
from tests.test_fsdp import UPSTREAM_STYLE, run_script

# What a 2-rank FSDPTestContinuous test that allows the CPU ends as here: run on CPU or with a
# GPU per rank, skipped before its ranks start on a machine with fewer GPUs than ranks.
FSDP_2_RANKS = "passed" if settings.device_type() == "cpu" or accelerators_suffice(2) else "skipped"


@pytest.mark.slow
class TestContinuousGroup(MultiProcContinuousTest):
    world_size = 2
    seen: List[Any] = []  # in a rank: (pid, group) of each test it ran

    def test_1_default_group_before_the_test(self) -> None:
        cls = type(self)
        self.assertTrue(dist.is_initialized())
        self.assertEqual((cls.rank, cls.world_size), (self.rank, 2))
        self.assertIs(cls.pg, dist.group.WORLD)
        self.assertEqual(dist.get_rank(cls.pg), self.rank)
        self.assertEqual(os.environ["LOCAL_RANK"], str(self.rank))
        self.assertTrue(os.path.exists(cls.rdvz_file))
        value = torch.full((2,), float(self.rank))  # CPU: the class's backend has gloo for it
        dist.all_reduce(value)
        self.assertEqual(value, torch.ones(2))

        self.seen.append((os.getpid(), cls.pg))

    def test_2_same_processes_and_group(self) -> None:
        self.assertIs(dist.group.WORLD, type(self).pg, "the class's group ended with a test")
        self.assertEqual([(os.getpid(), type(self).pg)], self.seen)


@pytest.mark.slow
class TestContinuousOverrides(MultiProcContinuousTest):
    """Upstream subclasses override backend_str/opts/_init_pg and give timedelta timeouts."""

    world_size = 2
    timeout = timedelta(seconds=90)
    init_calls: List[Any] = []

    @classmethod
    def backend_str(cls) -> str:
        return "gloo"

    @classmethod
    def _init_pg(cls, rank: int, world_size: int, rdvz_file: str) -> None:
        cls.init_calls.append((rank, world_size, rdvz_file))
        super()._init_pg(rank, world_size, rdvz_file)

    def test_overrides_are_used(self) -> None:
        self.assertEqual(timedelta(seconds=90), type(self).timeout)
        self.assertEqual([(self.rank, 2, type(self).rdvz_file)], self.init_calls)
        self.assertEqual("gloo", dist.get_backend())
        value = torch.ones(1)
        dist.all_reduce(value)
        self.assertEqual(2.0, value.item())


@pytest.mark.slow
class TestFSDPContinuousGroup(FSDPTestContinuous):
    world_size = 2

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_device_backend_and_process_group(self) -> None:
        self.assertEqual(settings.rank_device(self.rank), self.device)
        self.assertEqual(settings.backend_for(settings.device_type()), dist.get_backend())
        self.assertIs(self.process_group, type(self).pg)
        value = torch.full((1,), float(self.rank), device=self.device)
        dist.all_reduce(value, group=self.process_group)
        self.assertEqual(1.0, value.item())


@pytest.mark.slow
class TestFSDPContinuousDeviceType(FSDPTestContinuous):
    """Device-type instantiation over the shared-process base (upstream's lazy start)."""

    world_size = 2

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_on_device(self, device: str) -> None:
        self.assertEqual(torch.device(device).type, class_device_type(type(self)))
        value = torch.ones(1, device=device)
        dist.all_reduce(value)
        self.assertEqual(2.0, value.item())


instantiate_device_type_tests(TestFSDPContinuousDeviceType, globals(), only_for=("cpu", "cuda"))


class TestClassAPI(unittest.TestCase):
    """What a class says about itself, in the parent (no rank starts)."""

    def test_upstream_defaults(self) -> None:
        self.assertIsNone(MultiProcContinuousTest.backend_str())
        self.assertIsNone(MultiProcContinuousTest.opts())
        self.assertEqual(settings.device_type(), MultiProcContinuousTest.device_type())
        self.assertFalse(MultiProcContinuousTest.poison_pill)
        self.assertEqual(
            settings.backend_for(settings.device_type()), FSDPTestContinuous.backend_str()
        )
        with mock.patch.dict(os.environ, {settings.WORLD_SIZE_ENV: "3"}):
            self.assertEqual(3, MultiProcContinuousTest.world_size)
            self.assertEqual(3, FSDPTestContinuous("run").world_size)
        self.assertEqual(2, TestContinuousGroup.world_size)

    def test_timeout_is_the_groups_not_the_tests(self) -> None:
        """As upstream: a class's `timeout` is its group's timedelta (120 s by default); a
        test's limit is every base's (TIMEOUT_OVERRIDE, the env knobs, 300 s)."""
        self.assertEqual(timedelta(seconds=120), MultiProcContinuousTest.timeout)
        self.assertEqual(timedelta(seconds=90), TestContinuousOverrides.timeout)
        case = TestContinuousOverrides("test_overrides_are_used")
        unset = {settings.TIMEOUT_ENV: "", settings.UPSTREAM_TIMEOUT_ENV: ""}
        with mock.patch.dict(os.environ, unset):
            self.assertEqual(300.0, settings.test_timeout(case))

    def test_class_device_type_reads_every_declaration(self) -> None:
        class AsString(FSDPTestContinuous):
            device_type = "cuda"  # type: ignore[assignment]

        class AsProperty(FSDPTestContinuous):
            @property
            def device_type(self) -> str:  # type: ignore[override]
                return "meta"

        self.assertEqual(settings.device_type(), class_device_type(FSDPTestContinuous))
        self.assertEqual("cuda", class_device_type(AsString))
        self.assertEqual("nccl", AsString.backend_str())
        self.assertEqual("meta", class_device_type(AsProperty))
        self.assertEqual("cpu", class_device_type(TestFSDPContinuousDeviceTypeCPU))  # noqa: F821

    def test_too_few_accelerators_skip_before_any_rank_starts(self) -> None:
        class TooManyGPUs(FSDPTestContinuous):
            device_type = "cuda"  # type: ignore[assignment]
            world_size = settings.accelerator_count() + 1

            def test_never_runs(self) -> None:
                raise AssertionError("must not run")

        case = TooManyGPUs("test_never_runs")
        result = unittest.TestResult()
        with mock.patch("harness.process.supervisor.RankGroup.start") as start:
            case.run(result)
        self.assertEqual([], result.errors + result.failures)
        self.assertEqual(1, len(result.skipped))
        self.assertRegex(result.skipped[0][1], r"^Need at least \d+ CUDA devices? \(\d+ found\)$")
        start.assert_not_called()

    def test_world_size_zero_is_a_skip(self) -> None:
        class NoRanks(MultiProcContinuousTest):
            world_size = 0

            def test_never_runs(self) -> None:
                raise AssertionError("must not run")

        case = NoRanks("test_never_runs")
        result = unittest.TestResult()
        case.run(result)
        self.assertEqual([], result.errors + result.failures)
        self.assertEqual(1, len(result.skipped))
        self.assertIn("world_size is 0", result.skipped[0][1])


@pytest.mark.slow
class TestAsScripts(unittest.TestCase):
    def test_a_failing_test_fails_alone(self) -> None:
        results = run_script(os.path.join(UPSTREAM_STYLE, "fsdp_continuous_isolation.py"))
        outcomes = {test_id: outcome for test_id, (outcome, _) in results.items()}
        # A RuntimeError is unittest's "error"; the harness may report a rank's as a failure.
        raised = outcomes.pop("TestIsolationFSDP.test_1_fails_in_one_rank", None)
        self.assertIn(raised, ("error", "failed") if FSDP_2_RANKS == "passed" else ("skipped",))
        self.assertEqual(
            {
                "TestIsolation.test_1_fails": "failed",
                "TestIsolation.test_2_runs_after_a_failure": "passed",
                "TestIsolationFSDP.test_2_runs_after_a_failure": FSDP_2_RANKS,
            },
            outcomes,
        )
        self.assertIn("deliberate failure", results["TestIsolation.test_1_fails"][1])
        if FSDP_2_RANKS == "passed":
            message = results["TestIsolationFSDP.test_1_fails_in_one_rank"][1]
            self.assertIn("rank 1 breaks", message)

    def test_upstream_style_fsdp_test_continuous_file(self) -> None:
        results = run_script(os.path.join(UPSTREAM_STYLE, "fsdp_parity.py"), "TestParityContinuous")
        self.assertEqual(
            {
                f"TestParityContinuous.{name}": FSDP_2_RANKS
                for name in ("test_class_api", "test_nested_wrapped_model_use_orig_params_False",
                             "test_nested_wrapped_model_use_orig_params_True")
            },
            {test_id: outcome for test_id, (outcome, _) in results.items()},
            "\n".join(message for _, message in results.values()),
        )


if __name__ == "__main__":
    unittest.main()
