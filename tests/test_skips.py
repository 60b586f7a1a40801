"""harness.skips: upstream skip codes, skip_if_lt_x_gpu, decisions before any rank starts."""

import os
import subprocess
import sys
import unittest
from unittest import mock

import torch

from harness import TEST_SKIPS, TestCase, skip_if_lt_x_gpu
from harness.skips import SKIP_BY_EXIT_CODE, check_requirements


def gpus(count):
    """Pretend `count` CUDA devices exist (and HARNESS_DEVICE is unset)."""
    patches = [
        mock.patch.dict(os.environ, {"HARNESS_DEVICE": ""}),
        mock.patch.object(torch.cuda, "is_available", return_value=count > 0),
        mock.patch.object(torch.cuda, "device_count", return_value=count),
    ]
    for patch in patches:
        patch.start()
    return patches


class SkipsTest(unittest.TestCase):
    def use_gpus(self, count):
        for patch in gpus(count):
            self.addCleanup(patch.stop)

    def test_upstream_names_and_codes(self):
        self.assertEqual(TEST_SKIPS["multi-gpu-2"].exit_code, 77)
        self.assertEqual(TEST_SKIPS["no_cuda"].exit_code, 74)
        self.assertEqual(TEST_SKIPS["generic"].exit_code, 86)
        self.assertEqual(TEST_SKIPS["backend_unavailable"].exit_code, 72)
        for n in range(1, 9):
            self.assertIn(f"multi-gpu-{n}", TEST_SKIPS)
        self.assertEqual(len(SKIP_BY_EXIT_CODE), len(TEST_SKIPS), "exit codes must be unique")

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

    def test_dev_dbg_asan_flag_is_read_from_the_upstream_variable(self):
        code = "import harness; print(harness.TEST_WITH_DEV_DBG_ASAN)"
        for value, expected in (("1", "True"), ("0", "False")):
            env = dict(os.environ, PYTORCH_TEST_WITH_DEV_DBG_ASAN=value)
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                 text=True, check=True).stdout.strip()
            self.assertEqual(out, expected)

    def test_bad_count(self):
        for bad in (0, -1, "2", True):
            with self.assertRaisesRegex(ValueError, "skip_if_lt_x_gpu: n must be a positive int"):
                skip_if_lt_x_gpu(bad)


if __name__ == "__main__":
    unittest.main()
