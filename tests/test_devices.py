"""harness.devices: env knobs for device, world size, timeout, start method, torchrun."""

import os
import subprocess
import sys
import unittest
from unittest import mock

import pytest
import torch

from harness import devices
from harness.devices import HarnessConfigError


def env(**values):
    """Patch os.environ with `values` (None removes a variable)."""
    patch = mock.patch.dict(os.environ)
    patch.start()
    for key, value in values.items():
        os.environ.pop(key, None)
        if value is not None:
            os.environ[key] = value
    return patch


class DevicesTest(unittest.TestCase):
    def setUp(self):
        self.patch = env(
            HARNESS_DEVICE=None,
            HARNESS_WORLD_SIZE=None,
            HARNESS_TIMEOUT=None,
            HARNESS_START_METHOD=None,
            HARNESS_ALLOW_CPU=None,
            RANK=None,
            WORLD_SIZE=None,
            MASTER_ADDR=None,
        )
        self.addCleanup(self.patch.stop)

    def test_cpu_without_accelerators(self):
        with mock.patch.object(torch.cuda, "is_available", return_value=False):
            self.assertEqual(devices.accelerator_count(), 0)
            self.assertEqual(devices.device_type(), "cpu")
            self.assertEqual(devices.backend_for(devices.device_type()), "gloo")
            self.assertEqual(devices.rank_device(1), torch.device("cpu"))
            self.assertEqual(devices.default_world_size(), 2)

    def test_allow_cpu_switch(self):
        """HARNESS_ALLOW_CPU: off unless 1; the CPU stands in only where no accelerator exists;
        the devices still describe the machine."""
        with mock.patch.object(torch.cuda, "is_available", return_value=False):
            self.assertFalse(devices.allow_cpu())
            self.assertFalse(devices.cpu_stands_in())
            for off in ("", "0"):
                os.environ["HARNESS_ALLOW_CPU"] = off
                self.assertFalse(devices.cpu_stands_in())
            os.environ["HARNESS_ALLOW_CPU"] = "1"
            self.assertTrue(devices.cpu_stands_in())
            self.assertEqual(devices.device_type(), "cpu")
            self.assertEqual(devices.rank_device(1), torch.device("cpu"))
        with (
            mock.patch.object(torch.cuda, "is_available", return_value=True),
            mock.patch.object(torch.cuda, "device_count", return_value=2),
        ):
            self.assertTrue(devices.allow_cpu())
            self.assertFalse(devices.cpu_stands_in())
        os.environ["HARNESS_ALLOW_CPU"] = "true"
        with self.assertRaisesRegex(HarnessConfigError, "HARNESS_ALLOW_CPU='true' must be 1"):
            devices.allow_cpu()

    def test_one_process_per_gpu_with_nccl(self):
        with (
            mock.patch.object(torch.cuda, "is_available", return_value=True),
            mock.patch.object(torch.cuda, "device_count", return_value=4),
        ):
            self.assertEqual(devices.device_type(), "cuda")
            self.assertEqual(devices.backend_for("cuda"), "nccl")
            self.assertEqual(devices.default_world_size(), 4)
            self.assertEqual(devices.rank_device(5), torch.device("cuda", 1))
            os.environ["HARNESS_DEVICE"] = "cpu"
            self.assertEqual(devices.device_type(), "cpu")
            self.assertEqual(devices.default_world_size(), 2)

    def test_forcing_cuda_without_cuda_is_an_error(self):
        os.environ["HARNESS_DEVICE"] = "cuda"
        with mock.patch.object(torch.cuda, "is_available", return_value=False):
            with self.assertRaisesRegex(HarnessConfigError, "no CUDA device"):
                devices.device_type()

    def test_unknown_device_names_the_value(self):
        os.environ["HARNESS_DEVICE"] = "tpu"
        with self.assertRaisesRegex(
            HarnessConfigError, r"HARNESS_DEVICE='tpu' is not one of: cpu, cuda"
        ):
            devices.device_type()
        with self.assertRaisesRegex(HarnessConfigError, "'tpu'"):
            devices.backend_for("tpu")

    def test_world_size_from_env(self):
        os.environ["HARNESS_WORLD_SIZE"] = "3"
        self.assertEqual(devices.default_world_size(), 3)
        for bad in ("two", "1.5", "0"):
            os.environ["HARNESS_WORLD_SIZE"] = bad
            with self.assertRaisesRegex(HarnessConfigError, f"HARNESS_WORLD_SIZE='{bad}'"):
                devices.default_world_size()

    def test_timeout(self):
        self.assertEqual(devices.default_timeout(), 300.0)
        os.environ["HARNESS_TIMEOUT"] = "2.5"
        self.assertEqual(devices.default_timeout(), 2.5)
        os.environ["HARNESS_TIMEOUT"] = "soon"
        with self.assertRaisesRegex(HarnessConfigError, "HARNESS_TIMEOUT='soon'"):
            devices.default_timeout()

    def test_default_timeout_is_read_when_used(self):
        class Case:
            timeout = devices.DefaultTimeout()

        os.environ["HARNESS_TIMEOUT"] = "7"
        self.assertEqual(Case.timeout, 7.0)
        os.environ["HARNESS_TIMEOUT"] = "9"
        self.assertEqual(Case().timeout, 9.0)

    def test_checked_rank_settings_name_the_bad_attribute(self):
        class Case:
            world_size, timeout = 2, 5.0

        self.assertEqual(devices.checked_rank_settings(Case()), (2, 5.0))
        for world_size in (-1, True, False, "2", 2.0, None):
            Case.world_size = world_size
            with self.assertRaisesRegex(
                HarnessConfigError, r"Case.world_size must be a positive int"
            ):
                devices.checked_rank_settings(Case())
        Case.world_size, Case.timeout = 2, 0
        with self.assertRaisesRegex(HarnessConfigError, r"Case.timeout must be a positive number"):
            devices.checked_rank_settings(Case())

    def test_world_size_zero_is_a_skip_saying_why(self):
        class Case:
            world_size, timeout = 0, 5.0

        with mock.patch.object(torch.cuda, "device_count", return_value=0):
            with self.assertRaises(unittest.SkipTest) as caught:
                devices.checked_rank_settings(Case())
        self.assertEqual(
            str(caught.exception),
            "Case.world_size is 0: no ranks to start (0 accelerators found)",
        )

    @pytest.mark.slow
    def test_upstream_cuda_flags_follow_the_machine_and_forced_cpu(self):
        code = "import harness; print(harness.TEST_CUDA, harness.TEST_MULTIGPU)"
        cuda = torch.cuda.is_available()
        for forced, expected in (("", f"{cuda} {cuda and torch.cuda.device_count() >= 2}"),
                                 ("cpu", "False False")):
            out = subprocess.run(
                [sys.executable, "-c", code], env=dict(os.environ, HARNESS_DEVICE=forced),
                capture_output=True, text=True, check=True,
            ).stdout.strip()
            self.assertEqual(out, expected)

    def test_start_method(self):
        self.assertEqual(devices.start_method(), "forkserver")
        os.environ["HARNESS_START_METHOD"] = "spawn"
        self.assertEqual(devices.start_method(), "spawn")
        os.environ["HARNESS_START_METHOD"] = "thread"
        with self.assertRaisesRegex(HarnessConfigError, "HARNESS_START_METHOD='thread'"):
            devices.start_method()

    def test_torchrun_env(self):
        self.assertIsNone(devices.torchrun_env())
        os.environ.update(RANK="1", WORLD_SIZE="4", MASTER_ADDR="127.0.0.1")
        self.assertEqual(devices.torchrun_env(), (1, 4))
        os.environ["RANK"] = "one"
        with self.assertRaisesRegex(HarnessConfigError, "RANK='one'"):
            devices.torchrun_env()

    def test_intra_op_threads_share_the_cores(self):
        with mock.patch.object(os, "sched_getaffinity", return_value={0, 1, 2, 3}, create=True):
            self.assertEqual(devices.intra_op_threads(2), 2)
            self.assertEqual(devices.intra_op_threads(8), 1)


if __name__ == "__main__":
    unittest.main()
