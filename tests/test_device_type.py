"""harness.single_process.device_type: per-device classes and ids as upstream's, over every
harness base."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, List
from unittest import mock

import pytest
import torch

from harness import (
    MultiProcessTestCase,
    MultiThreadedTestCase,
    TestCase,
    deviceCountAtLeast,
    dtypes,
    instantiate_device_type_tests,
    onlyAccelerator,
    onlyCUDA,
    parametrize,
    settings,
    skipCPUIf,
)
from harness.single_process.device_type import device_types_to_instantiate
from tests.fixtures import REPO, child_env
from tests.upstream_style.ids_declarations import declare, upstream_declarations

STYLE_DIR = REPO / "tests" / "upstream_style"

# Where each name these upstream-style files import lives upstream.
UPSTREAM_HOME = {
    "DTensorTestBase": "distributed._tensor.common_dtensor",
    "with_comms": "distributed._tensor.common_dtensor",
    "FSDPTest": "common_fsdp",
    "FSDPTestMultiThread": "common_fsdp",
    "MultiProcessTestCase": "common_distributed",
    "skip_if_lt_x_gpu": "common_distributed",
    "dtypes": "common_device_type",
    "instantiate_device_type_tests": "common_device_type",
    "onlyCPU": "common_device_type",
    "onlyCUDA": "common_device_type",
    "parametrize": "common_utils",
    "run_tests": "common_utils",
    "subtest": "common_utils",
}

FSDP_STYLE_IDS = {
    "TestFSDPStyleCPU.test_all_reduce_cpu": "pass",
    "TestFSDPStyleCPU.test_broadcast_cpu_float32": "pass",
    "TestFSDPStyleCPU.test_broadcast_cpu_float64": "pass",
    "TestFSDPStyleCPU.test_fsdp_train_sharding_strategy0_cpu": "pass",
    "TestFSDPStyleCPU.test_fsdp_train_sharding_strategy1_cpu": "pass",
    "TestFSDPStyleCPU.test_fsdp_train_sharding_strategy2_cpu": "pass",
    "TestFSDPStyleCPU.test_needs_cuda_cpu": "skip",
    "TestFSDPStyleCPU.test_reduce_maximum_cpu": "pass",
    "TestFSDPStyleCPU.test_reduce_reduce_sum_cpu": "pass",
    "TestFSDPThreadStyleCPU.test_all_gather_size_4_src_0_cpu": "pass",
    "TestFSDPThreadStyleCPU.test_all_gather_small_from_1_cpu": "pass",
    "TestFSDPThreadStyleCPU.test_fsdp_train_use_orig_params_False_sharding_strategy0_cpu": "pass",
    "TestFSDPThreadStyleCPU.test_fsdp_train_use_orig_params_False_sharding_strategy1_cpu": "pass",
    "TestFSDPThreadStyleCPU.test_fsdp_train_use_orig_params_True_sharding_strategy0_cpu": "pass",
    "TestFSDPThreadStyleCPU.test_fsdp_train_use_orig_params_True_sharding_strategy1_cpu": "pass",
}

DTENSOR_STYLE_IDS = {
    "DTensorStyleTestCPU.test_distribute_and_gather_shard_dim_0_cpu": "pass",
    "DTensorStyleTestCPU.test_distribute_and_gather_shard_dim_1_cpu": "pass",
    "DTensorStyleTestCPU.test_redistribute_rows4_cpu": "pass",
    "DTensorStyleTestCPU.test_redistribute_sharded_cpu": "pass",
    "ProcessGroupStyleTestCPU.test_all_reduce_op0_expected_3_0_cpu": "pass",
    "ProcessGroupStyleTestCPU.test_all_reduce_op1_expected_2_0_cpu": "pass",
    "ProcessGroupStyleTestCPU.test_broadcast_object_from_last_cpu": "pass",
    "ProcessGroupStyleTestCPU.test_broadcast_object_src_0_cpu": "pass",
}


def _test_names(cls: type) -> List[str]:
    return sorted(unittest.defaultTestLoader.getTestCaseNames(cls))


def _run(case: unittest.TestCase) -> unittest.TestResult:
    result = unittest.TestResult()
    case.run(result)
    return result


@pytest.mark.slow
class DifferentialIdsTest(unittest.TestCase):
    """The same device-type declarations under upstream's installed harness and this one."""

    def test_classes_ids_kwargs_and_outcomes_match_upstream(self) -> None:
        ours = {k: v for k, v in declare("harness").items() if k.startswith("device_")}
        theirs = {k: v for k, v in upstream_declarations().items() if k.startswith("device_")}
        self.assertGreater(len(theirs), 40)
        self.assertEqual(sorted(ours), sorted(theirs))
        for key in theirs:
            self.assertEqual(ours[key], theirs[key], key)


class InstantiateTest(unittest.TestCase):
    def test_generic_class_leaves_the_scope_and_keeps_no_tests(self) -> None:
        class TestThing(TestCase):
            def test_a(self, device):
                self.assertEqual(device, "cpu")

        scope = {"TestThing": TestThing}
        with mock.patch.dict(os.environ, {"HARNESS_DEVICE": "cpu"}):
            instantiate_device_type_tests(TestThing, scope)
        self.assertEqual(sorted(scope), ["TestThingCPU"])
        made = scope["TestThingCPU"]
        self.assertEqual((made.__name__, made.__qualname__, made.__module__),
                         ("TestThingCPU", "TestThingCPU", __name__))
        self.assertEqual(made.device_type, "cpu")
        self.assertEqual(_test_names(made), ["test_a_cpu"])
        self.assertEqual(_test_names(TestThing), [])
        self.assertTrue(_run(made("test_a_cpu")).wasSuccessful())

    def test_bad_arguments_name_the_problem(self) -> None:
        class TestThing(TestCase):
            def test_a(self):
                pass

        with self.assertRaisesRegex(ValueError, "TestThing is not in the scope given"):
            instantiate_device_type_tests(TestThing, {})
        with self.assertRaisesRegex(TypeError, "scope must be a dict"):
            instantiate_device_type_tests(TestThing, [TestThing])
        with self.assertRaisesRegex(TypeError, "only_for must be a device type string"):
            instantiate_device_type_tests(TestThing, {"TestThing": TestThing}, only_for=3)
        with self.assertRaisesRegex(ValueError, r"\['cpu'\] appear in both"):
            device_types_to_instantiate(except_for="cpu", only_for=("cpu", "cuda"))
        with self.assertRaisesRegex(TypeError, "expected torch.dtype values"):
            dtypes("float32")

    def test_one_function_decides_the_device_types(self) -> None:
        with (
            mock.patch.dict(os.environ, {"HARNESS_ALLOW_CPU": ""}),
            mock.patch.object(settings, "accelerator_count", return_value=2),
        ):
            self.assertEqual(device_types_to_instantiate(), ["cpu", "cuda"])
            self.assertEqual(device_types_to_instantiate(only_for=("cuda", "hpu")), ["cuda"])
            self.assertEqual(device_types_to_instantiate(except_for=["cuda"]), ["cpu"])
            with mock.patch.dict(os.environ, {"PYTORCH_TESTING_DEVICE_EXCEPT_FOR": "cpu"}):
                self.assertEqual(device_types_to_instantiate(), ["cuda"])
        with (
            mock.patch.dict(os.environ, {"HARNESS_ALLOW_CPU": ""}),
            mock.patch.object(settings, "accelerator_count", return_value=0),
        ):
            self.assertEqual(device_types_to_instantiate(), ["cpu"])
            self.assertEqual(device_types_to_instantiate(only_for=("cuda", "hpu")), [])

    def test_allow_cpu_switch_makes_the_cpu_class_for_accelerators(self) -> None:
        """HARNESS_ALLOW_CPU=1 without accelerators: only_for naming accelerators adds "cpu"."""
        count = "harness.settings.accelerator_count"
        with mock.patch(count, return_value=0):
            with mock.patch.dict(os.environ, {"HARNESS_ALLOW_CPU": "1"}):
                for only_for in (("cuda", "hpu"), "cuda", "xpu", ["hpu"], "cpu"):
                    self.assertEqual(device_types_to_instantiate(only_for=only_for), ["cpu"])
                self.assertEqual(device_types_to_instantiate(), ["cpu"])
                self.assertEqual(device_types_to_instantiate(only_for="meta"), [])
                self.assertEqual(
                    device_types_to_instantiate(only_for="cuda", except_for="cpu"), []
                )
                with mock.patch.dict(os.environ, {"PYTORCH_TESTING_DEVICE_ONLY_FOR": "cuda"}):
                    self.assertEqual(device_types_to_instantiate(), ["cpu"])
            with mock.patch.dict(os.environ, {"HARNESS_ALLOW_CPU": "0"}):
                self.assertEqual(device_types_to_instantiate(only_for=("cuda", "hpu")), [])
        with (
            mock.patch(count, return_value=2),
            mock.patch.dict(os.environ, {"HARNESS_ALLOW_CPU": "1"}),
        ):
            self.assertEqual(device_types_to_instantiate(only_for=("cuda", "hpu")), ["cuda"])

    def test_allow_cpu_switch_lets_accelerator_only_tests_run_on_cpu(self) -> None:
        def declare() -> Dict[str, type]:
            class TestThing(TestCase):
                @onlyCUDA
                def test_cuda(self, device):
                    self.assertEqual(device, "cpu")

                @onlyAccelerator
                def test_accelerator(self, device):
                    self.assertEqual(device, "cpu")

            scope = {"TestThing": TestThing}
            instantiate_device_type_tests(TestThing, scope, only_for=("cuda", "cpu"))
            return scope

        count = "harness.settings.accelerator_count"
        names = ["test_accelerator_cpu", "test_cuda_cpu"]
        with mock.patch(count, return_value=0):
            with mock.patch.dict(os.environ, {"HARNESS_ALLOW_CPU": "1"}):
                made = declare()["TestThingCPU"]
                for name in names:
                    result = _run(made(name))
                    self.assertEqual((result.skipped, result.errors, result.failures), ([], [], []))
            with mock.patch.dict(os.environ, {"HARNESS_ALLOW_CPU": ""}):
                made = declare()["TestThingCPU"]
                reasons = [r for name in names for _, r in _run(made(name)).skipped]
                self.assertEqual(
                    reasons,
                    ["onlyAccelerator: doesn't run on CPU or meta devices", "Only runs on cuda"],
                )

    def test_cuda_class_takes_the_current_cuda_device(self) -> None:
        class TestThing(TestCase):
            @deviceCountAtLeast(2)
            def test_many(self, devices):
                pass

            @dtypes(torch.float16)
            def test_one(self, device, dtype):
                pass

        scope = {"TestThing": TestThing}
        with mock.patch.object(settings, "accelerator_count", return_value=2):
            instantiate_device_type_tests(TestThing, scope, only_for="cuda")
        made = scope["TestThingCUDA"]
        self.assertEqual(_test_names(made), ["test_many_cuda", "test_one_cuda_float16"])
        self.assertEqual(made.get_primary_device(), "cuda:0")
        with mock.patch.object(settings, "accelerator_count", return_value=2):
            self.assertEqual(made.get_all_devices(), ["cuda:0", "cuda:1"])

    def test_device_restrictions_skip_before_any_rank_starts(self) -> None:
        for base in (globals()["ProcessRanksCPU"], globals()["ThreadRanksCPU"]):
            with self.subTest(base=base.__name__):
                self.assertEqual(
                    _test_names(base), ["test_cuda_only_x_1_cpu", "test_skipped_on_cpu_cpu"]
                )
                for name, reason in (("test_cuda_only_x_1_cpu", "Only runs on cuda"),
                                     ("test_skipped_on_cpu_cpu", "not on cpu")):
                    with mock.patch.object(base, "setUp") as set_up:  # where ranks start
                        result = _run(base(name))
                    self.assertEqual([r for _, r in result.skipped], [reason])
                    set_up.assert_not_called()


@onlyCUDA
@parametrize("x", [1])
def _cuda_only(self, device, x):
    raise AssertionError("must not run on CPU")


@skipCPUIf(True, "not on cpu")
def _skipped_on_cpu(self, device):
    raise AssertionError("must not run on CPU")


class ProcessRanks(MultiProcessTestCase):
    __test__ = False  # run by InstantiateTest, which checks they skip before starting ranks
    world_size = 2
    test_cuda_only = _cuda_only
    test_skipped_on_cpu = _skipped_on_cpu


class ThreadRanks(MultiThreadedTestCase):
    __test__ = False  # run by InstantiateTest, which checks they skip before starting ranks
    world_size = 2
    test_cuda_only = _cuda_only
    test_skipped_on_cpu = _skipped_on_cpu


instantiate_device_type_tests(ProcessRanks, globals(), only_for="cpu")
instantiate_device_type_tests(ThreadRanks, globals(), only_for="cpu")


def _ran(xml_dir: str) -> Dict[str, str]:
    """`Class.test` -> pass / skip / fail for each test in the JUnit XML of a run."""
    outcomes = {}
    for path in Path(xml_dir).glob("*.xml"):
        for case in ET.parse(path).getroot().iter("testcase"):
            kinds = {child.tag for child in case}
            outcome = ("fail" if kinds & {"failure", "error"}
                       else "skip" if "skipped" in kinds else "pass")
            outcomes[f"{case.get('classname').split('.')[-1]}.{case.get('name')}"] = outcome
    return outcomes


def _upstream_ids(style_file: Path, work_dir: str) -> List[str]:
    """The ids upstream's harness gives the same file (its imports pointed back upstream)."""
    source = style_file.read_text().replace(", allow_cpu=True", "")
    block = source[source.index("from harness import ("):]
    block = block[: block.index(")\n") + 2]
    names = [n.strip() for n in block[block.index("(") + 1: -2].split(",") if n.strip()]
    lines = [f"from torch.testing._internal.{UPSTREAM_HOME[n]} import {n}" for n in names]
    (Path(work_dir) / "upstream_copy.py").write_text(source.replace(block, "\n".join(lines) + "\n"))
    lister = (
        "import json, sys, unittest; sys.path.insert(0, sys.argv[1]); import upstream_copy as m; "
        "suite = unittest.defaultTestLoader.loadTestsFromModule(m); "
        "flat = lambda s: [t for x in s for t in (flat(x) if isinstance(x, unittest.TestSuite) "
        "else [x])]; print(json.dumps(sorted(t.id().split('.', 1)[1] for t in flat(suite))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", lister, work_dir], cwd=work_dir, capture_output=True, text=True,
        env=child_env({"PYTORCH_TESTING_DEVICE_EXCEPT_FOR": "cuda"}), timeout=600,
    )
    if proc.returncode != 0:
        raise AssertionError(f"listing under upstream failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
class UpstreamStyleFilesTest(unittest.TestCase):
    """Upstream-style files run as scripts on CPU: upstream's ids, every test passed."""

    def check_file(self, name: str, expected: Dict[str, str]) -> None:
        style_file = STYLE_DIR / name
        with tempfile.TemporaryDirectory() as xml_dir:
            proc = subprocess.run(
                [sys.executable, str(style_file), f"--save-xml={xml_dir}"],
                cwd=REPO, env=child_env({"HARNESS_DEVICE": "cpu"}), capture_output=True,
                text=True, timeout=900,
            )
            self.assertEqual(proc.returncode, 0, proc.stderr[-5000:])
            self.assertEqual(_ran(xml_dir), expected)
            self.assertEqual(_upstream_ids(style_file, xml_dir), sorted(expected))

    def test_fsdp_process_and_thread_bases(self) -> None:
        self.check_file("ids_fsdp_style.py", FSDP_STYLE_IDS)

    def test_dtensor_and_multiprocess_bases(self) -> None:
        self.check_file("ids_dtensor_style.py", DTENSOR_STYLE_IDS)


if __name__ == "__main__":
    unittest.main()
