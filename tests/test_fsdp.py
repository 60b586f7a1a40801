"""FSDPTest: each rank runs the test inside an initialised default group on its own device;
upstream's parity helpers (`_test_fsdp_parity`, ...) pass on healthy FSDP and fail on broken
FSDP, run from upstream-style files as a user would run them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ElementTree
from typing import Dict, List, Tuple
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from harness import settings
from harness.kit.fsdp import FSDPTest
from harness.kit.fsdp_helpers import get_full_params
from harness.kit.models import DEVICEInitMode, FSDPInitMode, NestedWrappedModule
from harness.process.multiprocess_case import MAIN_PROCESS_RANK
from harness.requirements.decorators import skip_if_lt_x_gpu
from harness.single_process.parametrize import instantiate_parametrized_tests, parametrize


@pytest.mark.slow
@skip_if_lt_x_gpu(2, allow_cpu=True)  # FSDPTest skips on CPU unless allowed
class TestFSDPTestBase(FSDPTest):
    @property
    def world_size(self) -> int:
        return 2

    def test_default_group_is_ready_on_the_rank_device(self) -> None:
        self.assertTrue(dist.is_initialized())
        self.assertEqual((dist.get_rank(), dist.get_world_size()), (self.rank, 2))
        self.assertEqual(dist.get_backend(), settings.backend_for(settings.device_type()))
        self.assertEqual(self.device, settings.rank_device(self.rank))
        self.assertEqual(self.device_type, settings.device_type())
        value = torch.tensor([float(self.rank)], device=self.device)
        dist.all_reduce(value, group=self.process_group)
        self.assertEqual(value.item(), 1.0)

    def test_process_group_is_the_default_group(self) -> None:
        self.assertEqual(dist.get_world_size(self.process_group), 2)
        self.assertEqual(dist.get_process_group_ranks(self.process_group), [0, 1])

    def rank_tear_down(self) -> None:  # each rank, after the test (tearDown: the parent's)
        super().rank_tear_down()
        self.assertFalse(dist.is_initialized(), "the group outlived the test")


@pytest.mark.slow
@instantiate_parametrized_tests
class TestFSDPTestParametrized(FSDPTest):
    """The suites' pattern: device-generic skip decorator over generated tests."""

    @property
    def world_size(self) -> int:
        return 2

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    @parametrize("scale", [1.0, 2.0])
    def test_generated(self, scale: float) -> None:
        value = torch.full((1,), scale, device=self.device)
        dist.all_reduce(value)
        self.assertEqual(value.item(), 2 * scale)


@pytest.mark.slow
@skip_if_lt_x_gpu(2, allow_cpu=True)  # FSDPTest skips on CPU unless allowed
class TestFSDPTestOverrides(FSDPTest):
    """Upstream suites override these properties; the base must not fight that."""

    @property
    def world_size(self) -> int:
        return 2

    @property
    def process_group(self) -> str:
        return "overridden"

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def test_overridden_properties_are_used(self) -> None:
        self.assertEqual(self.process_group, "overridden")
        self.assertEqual(self.device, torch.device("cpu"))
        self.assertTrue(dist.is_initialized())


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UPSTREAM_STYLE = os.path.join(ROOT, "tests", "upstream_style")


def run_script(path: str, *selection: str) -> Dict[str, Tuple[str, str]]:
    """Run a test file as a user would (`python FILE [TESTS]`) and read its JUnit XML.

    Returns `Class.test -> (outcome, message)`, outcome one of passed/failed/error/skipped;
    a test reported through its grid points (`test (param=...)`) gets its worst point's.
    """
    rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
    with tempfile.TemporaryDirectory() as xml_dir:
        proc = subprocess.run(
            [sys.executable, path, f"--save-xml={xml_dir}", *selection],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
        results: Dict[str, Tuple[str, str]] = {}
        for name in sorted(os.listdir(xml_dir)):
            for case in ElementTree.parse(os.path.join(xml_dir, name)).iter("testcase"):
                outcome, message = "passed", ""
                for tag in ("failure", "error", "skipped"):
                    element = case.find(tag)
                    if element is not None:
                        outcome = "failed" if tag == "failure" else tag
                        message = (element.get("message") or "") + (element.text or "")
                        break
                name = (case.get("name") or "").split(" (", 1)[0]
                test_id = f"{case.get('classname')}.{name}"
                if rank[outcome] >= rank[results.get(test_id, ("passed", ""))[0]]:
                    results[test_id] = (outcome, message)
    if not results:
        raise AssertionError(f"{path} reported no tests:\n{proc.stdout}\n{proc.stderr}")
    return results


# Upstream's modules for each name the upstream-style files import from harness.
UPSTREAM_MODULES = {
    "torch.testing._internal.common_fsdp": [
        "AlwaysWrapNestedWrappedModule", "DEVICEInitMode", "DummyDDP", "FSDPInitMode",
        "FSDPTest", "FSDPTestContinuous", "MixtureOfExperts", "NestedWrappedModule",
        "NestedWrappedModuleWithDelay", "NonUniformReqGradNWM", "TransformerWithSharedParams",
        "get_devtype", "subtest_name",
    ],
    "torch.testing._internal.common_utils": [
        "instantiate_parametrized_tests", "parametrize", "run_tests",
    ],
    "torch.testing._internal.common_distributed": ["skip_if_lt_x_gpu"],
}

LIST_IDS = """
import importlib.util, sys, unittest
spec = importlib.util.spec_from_file_location("migrated", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
for test in unittest.TestLoader().loadTestsFromModule(module):
    for case in test:
        print(case.id().split(".", 1)[1])
"""


def list_ids(path: str) -> List[str]:
    """The test ids (`Class.test`) unittest's loader finds in a file."""
    proc = subprocess.run(
        [sys.executable, "-c", LIST_IDS, path], cwd=ROOT, capture_output=True, text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise AssertionError(f"listing {path} failed:\n{proc.stderr}")
    return sorted(proc.stdout.split())


def as_upstream(source: str) -> str:
    """An upstream-style file's text with its harness imports pointed back at upstream."""
    imports = "\n".join(
        f"from {module} import {', '.join(names)}" for module, names in UPSTREAM_MODULES.items()
    )
    source, count = re.subn(r"from harness import \(.*?\)\n", imports + "\n", source, flags=re.S)
    if count != 1:
        raise AssertionError("expected one `from harness import (...)` block")
    # Upstream's skip_if_lt_x_gpu has no allow_cpu: only the ids are compared.
    return source.replace("skip_if_lt_x_gpu(2, allow_cpu=True)", "skip_if_lt_x_gpu(2)")


PARITY_IDS = [
    "TestParityWithDDP.test_always_wrap_nested_wrapped_model",
    "TestParityWithDDP.test_delayed_reduce_scatter",
    "TestParityWithDDP.test_fsdp_attributes_are_checked",
    "TestParityWithDDP.test_mixed_precision_and_grad_scaler",
    "TestParityWithDDP.test_mixture_of_experts",
    "TestParityWithDDP.test_nested_wrapped_model_offload_false_no_shard",
    "TestParityWithDDP.test_nested_wrapped_model_offload_false_none",
    "TestParityWithDDP.test_nested_wrapped_model_offload_false_shard_grad_op",
    "TestParityWithDDP.test_nested_wrapped_model_offload_true_no_shard",
    "TestParityWithDDP.test_nested_wrapped_model_offload_true_none",
    "TestParityWithDDP.test_nested_wrapped_model_offload_true_shard_grad_op",
    "TestParityWithDDP.test_nested_wrapped_model_prefetch",
    "TestParityWithDDP.test_nonuniform_requires_grad",
    "TestParityWithDDP.test_transformer",
]


@pytest.mark.slow
class TestUpstreamStyleParity(unittest.TestCase):
    """tests/upstream_style/fsdp_parity.py and fsdp_parity_broken.py, run as scripts."""

    def test_ids_are_upstreams(self) -> None:
        path = os.path.join(UPSTREAM_STYLE, "fsdp_parity.py")
        ours = list_ids(path)
        with open(path) as f:
            migrated_back = as_upstream(f.read())
        with tempfile.TemporaryDirectory() as tmp:
            upstream_path = os.path.join(tmp, "fsdp_parity_upstream.py")
            with open(upstream_path, "w") as f:
                f.write(migrated_back)
            upstream = list_ids(upstream_path)
        self.assertEqual(upstream, ours)
        self.assertEqual(PARITY_IDS, [i for i in ours if i.startswith("TestParityWithDDP.")])

    def test_parity_passes_for_every_model(self) -> None:
        results = run_script(os.path.join(UPSTREAM_STYLE, "fsdp_parity.py"), "TestParityWithDDP")
        self.assertEqual(PARITY_IDS, sorted(results))
        on_cpu = settings.device_type() == "cpu"
        for test_id, (outcome, message) in results.items():
            with self.subTest(test=test_id):
                if on_cpu and "offload_true" in test_id:
                    # FSDP1 pins offloaded parameters: it needs an accelerator for that.
                    self.assertEqual("skipped", outcome, message)
                    self.assertIn("pins memory, which needs an accelerator", message)
                else:
                    self.assertEqual("passed", outcome, message)

    def test_parity_fails_when_fsdp_or_the_reference_is_broken(self) -> None:
        results = run_script(os.path.join(UPSTREAM_STYLE, "fsdp_parity_broken.py"))
        expected = {
            # one step: equal losses, so the parameter comparison must catch it
            "test_reduce_scatter_sums_instead_of_averaging": "FSDP did not match DDP",
            "test_no_shard_gradients_not_all_reduced": "Scalars are not close",
            "test_reference_without_gradient_averaging": "Scalars are not close",
            "test_reference_with_other_initial_weights": "Scalars are not close",
        }
        self.assertEqual(
            sorted(f"TestParityDetectsBreakage.{name}" for name in expected), sorted(results)
        )
        for name, needle in expected.items():
            with self.subTest(test=name):
                outcome, message = results[f"TestParityDetectsBreakage.{name}"]
                self.assertEqual("failed", outcome, message)
                self.assertIn(needle, message)
                self.assertIn("_test_fsdp_parity", message)


@pytest.mark.slow
@skip_if_lt_x_gpu(2, allow_cpu=True)  # FSDPTest skips on CPU unless allowed
class TestFSDPTestMixinHelpers(FSDPTest):
    @property
    def world_size(self) -> int:
        return 2

    def test_parity_needs_an_fsdp_init_mode(self) -> None:
        with self.assertRaisesRegex(ValueError, "needs an fsdp_init_mode that wraps"):
            self._test_fsdp_parity(
                NestedWrappedModule, FSDPInitMode.NO_FSDP, DEVICEInitMode.DEVICE_BEFORE
            )

    def test_train_for_several_steps_trains_and_round_trips(self) -> None:
        model = NestedWrappedModule.init(
            self.process_group,
            FSDPInitMode.RECURSIVE,
            DEVICEInitMode.DEVICE_BEFORE,
            deterministic=True,
        )
        fsdp_model = FSDP(model, self.process_group, device_id=self.device)
        before = [p.clone() for p in get_full_params(fsdp_model)]
        first = self._train_for_several_steps(fsdp_model, 1, autocast=False)
        loss = self._train_for_several_steps(fsdp_model, 2, autocast=False, save_model=True)
        self.assertEqual((torch.float32, 0), (loss.dtype, loss.dim()))
        self.assertFalse(loss.requires_grad)
        self.assertNotEqual(first, loss)
        after = get_full_params(fsdp_model)
        # save_model zeroes the model and loads the state dict back: the training survives
        self.assertTrue(all(a.abs().sum() > 0 for a in after))
        self.assertNotEqual(before, after)


class TestFSDPTestInParent(unittest.TestCase):
    def test_parent_does_not_join_a_group(self) -> None:
        case = TestFSDPTestBase("test_process_group_is_the_default_group")
        self.assertEqual(case.rank, MAIN_PROCESS_RANK)
        self.assertFalse(dist.is_initialized())

    def test_more_ranks_than_accelerators_skip_before_any_rank_starts(self) -> None:
        """As upstream's FSDP ranks do (multi-gpu-N), rather than two ranks on one GPU failing
        in the backend; seen on a 1-GPU machine with a world size 2 class."""
        with mock.patch.object(settings, "accelerator_count", return_value=1), \
                mock.patch.object(TooFewAccelerators, "device_type", "cuda"), \
                mock.patch("harness.process.supervisor.RankGroup.start") as start:
            result = unittest.TestResult()
            TooFewAccelerators("never_runs").run(result)
        self.assertEqual([], result.errors + result.failures)
        self.assertEqual([(result.skipped[0][0].id(), "Need at least 2 CUDA devices (1 found)")],
                         [(t.id(), reason) for t, reason in result.skipped])
        start.assert_not_called()

    def test_on_cpu_without_a_decorator_it_skips_unless_the_cpu_is_allowed(self) -> None:
        """Upstream's FSDPTest ranks skip where there are fewer accelerators than ranks, CPU
        machines included (world size 1 there); HARNESS_ALLOW_CPU=1 runs them on CPU."""
        knobs = {"HARNESS_ALLOW_CPU": "", "HARNESS_WORLD_SIZE": "", "HARNESS_DEVICE": ""}
        with mock.patch.object(settings, "accelerator_count", return_value=0), \
                mock.patch.dict(os.environ, knobs), \
                mock.patch("harness.process.supervisor.RankGroup.start") as start:
            result = unittest.TestResult()
            OnAnyMachine("never_runs").run(result)
            self.assertEqual([], result.errors + result.failures)
            self.assertEqual(["Need at least 1 CUDA device (0 found)"],
                             [reason for _, reason in result.skipped])
            start.assert_not_called()
            os.environ["HARNESS_ALLOW_CPU"] = "1"
            case = OnAnyMachine("never_runs")
            self.assertEqual((1, "gloo"), (case.world_size, settings.backend_for(case.device)))
            case.checked_rank_settings()  # no skip: the CPU stands in


class OnAnyMachine(FSDPTest):
    """Run only by TestFSDPTestInParent: an FSDPTest without any skip decorator."""

    def never_runs(self) -> None:
        raise AssertionError("must not run")


class TooFewAccelerators(FSDPTest):
    """Run only by TestFSDPTestInParent, with one accelerator faked (its method is not named
    test_*, so no loader runs it on its own)."""

    world_size = 2

    def never_runs(self) -> None:
        raise AssertionError("must not run: the machine has too few accelerators")


if __name__ == "__main__":
    unittest.main()
