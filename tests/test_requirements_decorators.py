"""harness.requirements.decorators: upstream skip codes and decorators, decided before any rank
starts."""

import os
import subprocess
import sys
import unittest
from unittest import mock

import pytest
import torch
import torch.distributed as dist

from harness import (
    TEST_SKIPS,
    TestCase,
    at_least_x_gpu,
    requires_accelerator_dist_backend,
    requires_gloo,
    requires_nccl,
    settings,
    skip_but_pass_in_sandcastle_if,
    skip_if_lt_x_gpu,
    skip_if_no_gpu,
    skip_if_rocm_multiprocess,
    skipIfHpu,
    skipIfRocm,
)
from harness.requirements import decorators
from harness.requirements.decorators import check_requirements
from harness.requirements.skip_codes import SKIP_BY_EXIT_CODE
from harness.settings import HarnessConfigError


def gpus(count):
    """Pretend `count` CUDA devices exist (and HARNESS_DEVICE, HARNESS_ALLOW_CPU are unset)."""
    patches = [
        mock.patch.dict(os.environ, {"HARNESS_DEVICE": "", "HARNESS_ALLOW_CPU": ""}),
        mock.patch.object(torch.cuda, "is_available", return_value=count > 0),
        mock.patch.object(torch.cuda, "device_count", return_value=count),
    ]
    for patch in patches:
        patch.start()
    return patches


class PerRank(unittest.TestCase):
    """A case whose requirements the FSDP-style checks read."""

    __test__ = False

    def test_plain(self):
        pass

    @skip_if_lt_x_gpu(3)
    def test_gated(self):
        pass

    @skip_if_lt_x_gpu(2, allow_cpu=True)
    def test_allows_cpu(self):
        pass


class SkipsTest(unittest.TestCase):
    def use_gpus(self, count):
        for patch in gpus(count):
            self.addCleanup(patch.stop)

    def test_a_test_sure_to_skip_before_its_ranks_start(self):
        self.use_gpus(0)
        sure = decorators.skips_before_it_starts
        self.assertTrue(sure(PerRank, PerRank.test_gated))  # 3 GPUs, none here
        self.assertFalse(sure(PerRank, PerRank.test_allows_cpu))  # runs on CPU
        self.assertFalse(sure(PerRank, PerRank.test_plain))
        self.assertTrue(sure(PerRank, unittest.skip("why")(PerRank.test_plain)))
        self.assertTrue(sure(unittest.skip("why")(type("Skipped", (PerRank,), {})), None))
        self.use_gpus(3)
        self.assertFalse(sure(PerRank, PerRank.test_gated))

    def test_upstream_names_and_codes(self):
        self.assertEqual(TEST_SKIPS["multi-gpu-2"].exit_code, 77)
        self.assertEqual(TEST_SKIPS["no_cuda"].exit_code, 74)
        self.assertEqual(TEST_SKIPS["generic"].exit_code, 86)
        self.assertEqual(TEST_SKIPS["backend_unavailable"].exit_code, 72)
        for n in range(1, 9):
            self.assertIn(f"multi-gpu-{n}", TEST_SKIPS)
        self.assertEqual(len(SKIP_BY_EXIT_CODE), len(TEST_SKIPS), "exit codes must be unique")

    def test_one_accelerator_per_rank(self):
        """FSDP's bases: one accelerator per rank, on CPU too (upstream's ranks exit with a
        skip code), unless the CPU is allowed: HARNESS_ALLOW_CPU=1 or the test's allow_cpu."""
        case = PerRank("test_plain")
        self.use_gpus(1)
        message = r"^Need at least 2 CUDA devices \(1 found\)$"
        with self.assertRaisesRegex(unittest.SkipTest, message):
            decorators.require_accelerator_per_rank(case, 2)
        decorators.require_accelerator_per_rank(case, 1)  # enough: no skip
        self.use_gpus(0)
        with self.assertRaisesRegex(unittest.SkipTest, r"^Need at least 1 CUDA device \(0 found"):
            decorators.require_accelerator_per_rank(case, 1)
        decorators.require_accelerator_per_rank(PerRank("test_allows_cpu"), 2)
        with mock.patch.dict(os.environ, {"HARNESS_ALLOW_CPU": "1"}):
            decorators.require_accelerator_per_rank(case, 2)

    def test_cpu_gate_is_the_count_the_cpu_stands_in_for(self):
        self.use_gpus(0)
        self.assertEqual(decorators.cpu_gate(PerRank("test_plain")), 0)
        self.assertEqual(decorators.cpu_gate(PerRank("test_gated")), 0)  # would skip: no gate
        self.assertEqual(decorators.cpu_gate(PerRank("test_allows_cpu")), 2)
        with mock.patch.dict(os.environ, {"HARNESS_ALLOW_CPU": "1"}):
            self.assertEqual(decorators.cpu_gate(PerRank("test_gated")), 3)
            self.assertEqual(decorators.cpu_gate(PerRank("test_plain")), 0)
        self.use_gpus(4)
        self.assertEqual(decorators.cpu_gate(PerRank("test_allows_cpu")), 0)

    def test_skips_on_cpu_with_a_reason_that_says_accelerator(self):
        self.use_gpus(0)

        @skip_if_lt_x_gpu(2)
        def needs_two():
            return "ran"

        with self.assertRaisesRegex(unittest.SkipTest, "Need at least 2 CUDA devices.*accelerator"):
            needs_two()

    def test_allow_cpu_runs_where_no_accelerator_exists(self):
        self.use_gpus(0)

        @skip_if_lt_x_gpu(2, allow_cpu=True)
        def generic():
            return "ran"

        self.assertEqual(generic(), "ran")
        check_requirements(generic)

    def test_allow_cpu_still_skips_with_too_few_gpus(self):
        self.use_gpus(1)

        @skip_if_lt_x_gpu(2, allow_cpu=True)
        def generic():
            return "ran"

        with self.assertRaisesRegex(unittest.SkipTest, "found 1"):
            check_requirements(generic)

    def test_enough_gpus_run(self):
        self.use_gpus(2)

        @skip_if_lt_x_gpu(2)
        def needs_two():
            return "ran"

        self.assertEqual(needs_two(), "ran")

    def test_forced_cpu_counts_no_accelerator(self):
        self.use_gpus(4)
        os.environ["HARNESS_DEVICE"] = "cpu"

        @skip_if_lt_x_gpu(1)
        def needs_one():
            return "ran"

        with self.assertRaises(unittest.SkipTest):
            check_requirements(needs_one)

    def test_check_requirements_on_bound_methods_before_the_body(self):
        self.use_gpus(0)
        ran = []

        class Case(TestCase):
            def setUp(self):
                check_requirements(getattr(self, self._testMethodName))

            @skip_if_lt_x_gpu(2)
            def test_x(self):
                ran.append(1)

        result = unittest.TestResult()
        Case("test_x").run(result)
        self.assertEqual(ran, [])
        self.assertEqual(len(result.skipped), 1)
        self.assertIn("Need at least 2 CUDA devices", result.skipped[0][1])

    def test_skip_if_no_gpu_needs_one_accelerator_per_rank(self):
        ran = []

        class Case(TestCase):
            world_size = 2

            @skip_if_no_gpu
            def test_x(self):
                ran.append(1)

        for count, reason in (
            (0, "CUDA is not available. This test needs one accelerator for each of its 2 ranks "
                "and none is available"),
            (1, "Need at least 2 CUDA devices, found 1"),
            (2, None),
        ):
            self.use_gpus(count)
            result = unittest.TestResult()
            Case("test_x").run(result)
            self.assertEqual([r for _, r in result.skipped], [reason] if reason else [])
            self.assertEqual(ran, [] if reason else [1])
        self.assertTrue(result.wasSuccessful())

    def test_requires_nccl_and_accelerator_backends(self):
        def body():
            return "ran"

        with mock.patch.object(dist, "is_nccl_available", return_value=False):
            with self.assertRaises(unittest.SkipTest) as caught:
                requires_nccl()(body)()
            self.assertEqual(str(caught.exception), "c10d was not compiled with the NCCL backend")
            with self.assertRaises(unittest.SkipTest) as caught:
                requires_accelerator_dist_backend()(body)()
            self.assertEqual(
                str(caught.exception),
                "No accelerator communication backend available among ['nccl', 'xccl', 'hccl']",
            )
            with self.assertRaisesRegex(unittest.SkipTest, r"among \['nccl'\]$"):
                requires_accelerator_dist_backend(["nccl"])(body)()
        with mock.patch.object(dist, "is_nccl_available", return_value=True):
            self.assertEqual(requires_nccl()(body)(), "ran")
            self.assertEqual(requires_accelerator_dist_backend(["nccl"])(body)(), "ran")
            self.assertEqual(requires_accelerator_dist_backend()(body)(), "ran")

    def test_requirement_on_a_class_skips_each_test_before_setup_ends(self):
        ran = []

        @requires_nccl()
        class Case(TestCase):
            def setUp(self):
                super().setUp()
                ran.append("setUp")

            def test_a(self):
                ran.append("a")

        with mock.patch.object(dist, "is_nccl_available", return_value=False):
            result = unittest.TestResult()
            Case("test_a").run(result)
        self.assertEqual(ran, [])
        self.assertEqual(result.skipped[0][1], "c10d was not compiled with the NCCL backend")
        with mock.patch.object(dist, "is_nccl_available", return_value=True):
            result = unittest.TestResult()
            Case("test_a").run(result)
        self.assertEqual((ran, result.skipped), (["setUp", "a"], []))

    def test_at_least_x_gpu(self):
        self.use_gpus(0)
        self.assertFalse(at_least_x_gpu(1))
        self.use_gpus(2)
        self.assertTrue(at_least_x_gpu(2))
        self.assertFalse(at_least_x_gpu(3))

    def test_every_accelerator_requirement_asks_one_rule(self):
        """Issue 12's CPU switch changes accelerators_suffice only: nothing else decides."""
        self.use_gpus(0)

        class Case(TestCase):
            world_size = 4

        def body(case):
            return "ran"

        decorated = [
            skip_if_lt_x_gpu(8)(body), skip_if_no_gpu(body), requires_nccl()(body),
            requires_accelerator_dist_backend()(body),
        ]
        with mock.patch.object(dist, "is_nccl_available", return_value=False):
            for fn in decorated:
                with self.assertRaises(unittest.SkipTest):
                    fn(Case())
            self.assertFalse(at_least_x_gpu(1))
            with mock.patch.object(decorators, "accelerators_suffice", return_value=True) as rule:
                self.assertEqual([fn(Case()) for fn in decorated], ["ran"] * 4)
                for fn in decorated:
                    check_requirements(fn, 4)
                self.assertTrue(at_least_x_gpu(1))
            self.assertEqual(rule.call_count, 9)

    def test_allow_cpu_switch_runs_every_requirement_on_cpu(self):
        """HARNESS_ALLOW_CPU=1 without accelerators: every requirement is met (CPU, gloo)."""
        self.use_gpus(0)

        class Case(TestCase):
            world_size = 4

        def body(case):
            return "ran"

        decorated = [
            skip_if_lt_x_gpu(8)(body), skip_if_no_gpu(body), requires_nccl()(body),
            requires_accelerator_dist_backend()(body),
        ]
        with mock.patch.object(dist, "is_nccl_available", return_value=False):
            with mock.patch.dict(os.environ, {"HARNESS_ALLOW_CPU": "1"}):
                self.assertEqual([fn(Case()) for fn in decorated], ["ran"] * 4)
                for fn in decorated:
                    check_requirements(fn, 4)
                self.assertTrue(at_least_x_gpu(2))
            with mock.patch.dict(os.environ, {"HARNESS_ALLOW_CPU": "0"}):
                for fn in decorated:
                    with self.assertRaises(unittest.SkipTest):
                        fn(Case())
                self.assertFalse(at_least_x_gpu(2))

    def test_allow_cpu_switch_changes_nothing_where_accelerators_exist(self):
        self.use_gpus(1)

        @skip_if_lt_x_gpu(2)
        def needs_two():
            return "ran"

        with mock.patch.dict(os.environ, {"HARNESS_ALLOW_CPU": "1"}):
            with self.assertRaisesRegex(unittest.SkipTest, "found 1"):
                needs_two()
            self.assertFalse(at_least_x_gpu(2))

    def test_allow_cpu_switch_bad_value_names_it(self):
        self.use_gpus(0)
        with mock.patch.dict(os.environ, {"HARNESS_ALLOW_CPU": "maybe"}):
            with self.assertRaisesRegex(HarnessConfigError, "HARNESS_ALLOW_CPU='maybe' is not"):
                at_least_x_gpu(1)

    def test_skip_but_pass_in_sandcastle_if_marks_functions_and_classes(self):
        def fn():
            return "ran"

        class Case(unittest.TestCase):
            def test_x(self):
                pass

        self.assertIs(skip_but_pass_in_sandcastle_if(False, "no")(fn), fn)
        self.assertFalse(hasattr(fn, "__unittest_skip__"))
        for target in (fn, Case):
            skip_but_pass_in_sandcastle_if(True, "not here")(target)
            self.assertTrue(target.__unittest_skip__)
            self.assertEqual(target.__unittest_skip_why__, "not here")
        result = unittest.TestResult()
        Case("test_x").run(result)
        self.assertEqual(result.skipped[0][1], "not here")

    def test_requires_gloo(self):
        def fn():
            return "ran"

        requires_gloo()(fn)
        self.assertFalse(hasattr(fn, "__unittest_skip__"))
        with mock.patch.object(dist, "is_gloo_available", return_value=False):
            requires_gloo()(fn)
        self.assertEqual(fn.__unittest_skip_why__, "c10d was not compiled with the Gloo backend")

    def test_rocm_and_hpu_skips(self):
        def fn():
            return "ran"

        self.assertEqual(decorators.TEST_HPU,
                         bool(hasattr(torch, "hpu") and torch.hpu.is_available()))
        self.assertEqual(decorators.TEST_XPU, torch.xpu.is_available())
        if decorators.TEST_WITH_ROCM or decorators.TEST_HPU:
            self.skipTest("checks what runs off ROCm and HPU")
        self.assertEqual(skipIfRocm(fn)(), "ran")
        self.assertEqual(skipIfRocm(msg="flaky")(fn)(), "ran")
        self.assertEqual(skipIfHpu(fn)(), "ran")
        self.assertFalse(hasattr(skip_if_rocm_multiprocess(fn), "__unittest_skip_why__"))
        with mock.patch.object(decorators, "TEST_WITH_ROCM", True), \
                mock.patch.object(decorators, "TEST_HPU", True):
            with self.assertRaises(unittest.SkipTest) as caught:
                skipIfRocm(fn)()
            self.assertEqual(
                str(caught.exception), "skipIfRocm: test doesn't currently work on the ROCm stack"
            )
            with self.assertRaisesRegex(unittest.SkipTest, "^skipIfRocm: flaky$"):
                skipIfRocm(msg="flaky")(fn)()
            with self.assertRaisesRegex(unittest.SkipTest, "^test doesn't currently work with HPU"):
                skipIfHpu(fn)()

            class Case(unittest.TestCase):
                def test_x(self):
                    pass

            self.assertEqual(skipIfRocm(Case).__unittest_skip_why__,
                             "skipIfRocm: test doesn't currently work on the ROCm stack")
            self.assertEqual(skip_if_rocm_multiprocess(fn).__unittest_skip_why__,
                             TEST_SKIPS["skipIfRocm"].message)

    @pytest.mark.slow
    def test_flags_are_read_from_the_upstream_variables(self):
        code = (
            "import harness; "
            "print(harness.TEST_WITH_DEV_DBG_ASAN, harness.TEST_WITH_ROCM, harness.IS_FBCODE)"
        )
        rocm = torch.version.hip is not None
        for value, expected in (("1", "True True True"), ("0", f"False {rocm} False")):
            env = dict(os.environ, PYTORCH_TEST_WITH_DEV_DBG_ASAN=value,
                       PYTORCH_TEST_WITH_ROCM=value, PYTORCH_TEST_FBCODE=value)
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                 text=True, check=True).stdout.strip()
            self.assertEqual(out, expected)

    def test_bad_count(self):
        for bad in (0, -1, "2", True):
            with self.assertRaisesRegex(ValueError, "skip_if_lt_x_gpu: n must be a positive int"):
                skip_if_lt_x_gpu(bad)


class OneRuleTest(unittest.TestCase):
    """The requirement decorators and the pytest marker's placement ask one rule whether the
    CPU stands in for accelerators (`cpu_stands_in_for`): only on a machine without any; with
    some, but fewer than the ranks, both skip."""

    def setUp(self):
        from harness.pytest_plugin.functions import place
        from harness.pytest_plugin.marker import Ranks

        self.place, self.ranks = place, Ranks

    def outcomes(self, count, own_allow, env_allow):
        """(the decorator's, the marker's) outcome for 2 ranks on `count` faked accelerators."""
        patches = gpus(count)
        if env_allow:
            patches.append(mock.patch.dict(os.environ, {"HARNESS_ALLOW_CPU": "1"}))
            patches[-1].start()
        try:
            @skip_if_lt_x_gpu(2, allow_cpu=own_allow)
            def body():
                return "ran"

            try:
                decorated = "cpu" if decorators.cpu_stands_in_for(
                    settings.accelerator_count(), own_allow or settings.allow_cpu()
                ) else "cuda"
                body()
            except unittest.SkipTest:
                decorated = "skip"
            where = self.place(self.ranks((2,), device="cuda", allow_cpu=own_allow), 2)
            marked = "skip" if where.skip is not None else where.device_type
            return decorated, marked
        finally:
            for patch in reversed(patches):
                patch.stop()

    def test_one_accelerator_for_two_ranks_skips_in_both(self):
        for own_allow, env_allow in ((True, False), (False, True), (False, False)):
            with self.subTest(own_allow=own_allow, env_allow=env_allow):
                self.assertEqual(self.outcomes(1, own_allow, env_allow), ("skip", "skip"))

    def test_both_agree_without_accelerators_and_with_enough(self):
        self.assertEqual(self.outcomes(0, True, False), ("cpu", "cpu"))
        self.assertEqual(self.outcomes(0, False, True), ("cpu", "cpu"))
        self.assertEqual(self.outcomes(0, False, False), ("skip", "skip"))
        self.assertEqual(self.outcomes(2, True, True), ("cuda", "cuda"))

    def test_the_marker_names_what_is_missing(self):
        patches = gpus(1)
        self.addCleanup(lambda: [patch.stop() for patch in reversed(patches)])
        where = self.place(self.ranks((2,), device="cuda", allow_cpu=True), 2)
        self.assertEqual(where.skip, "needs 2 CUDA device(s), 1 available here")


if __name__ == "__main__":
    unittest.main()
