"""harness.requirements.flags: every flag has upstream's value on this machine; device queries
wait for first use (a test module's import must not initialise CUDA)."""

from __future__ import annotations

import importlib
import unittest
from unittest import mock

import pytest
import torch

from harness.requirements import flags

# flag -> the upstream module that defines it
UPSTREAM_HOME = {
    "IS_SANDCASTLE": "common_utils", "IS_CI": "common_utils", "IS_WINDOWS": "common_utils",
    "TEST_MULTIACCELERATOR": "common_utils", "TEST_CUDA_GRAPH": "common_utils",
    "MI200_ARCH": "common_utils", "MI300_ARCH": "common_utils", "MI350_ARCH": "common_utils",
    "NAVI_ARCH": "common_utils", "FILE_SCHEMA": "common_utils",
    "HAS_ACCELERATOR": "common_distributed", "PLATFORM_SUPPORTS_SYMM_MEM": "common_distributed",
    "SM80OrLater": "common_cuda", "SM89OrLater": "common_cuda", "SM90OrLater": "common_cuda",
    "SM100OrLater": "common_cuda", "PLATFORM_SUPPORTS_FP8": "common_cuda",
    "PLATFORM_SUPPORTS_FLASH_ATTENTION": "common_cuda",
    "PLATFORM_SUPPORTS_MEM_EFF_ATTENTION": "common_cuda",
    "PLATFORM_SUPPORTS_CUDNN_ATTENTION": "common_cuda",
    "PLATFORM_SUPPORTS_FUSED_ATTENTION": "common_cuda",
    "e4m3_type": "common_device_type", "E4M3_MAX_POS": "common_device_type",
    "HAS_GPU": "inductor_utils", "GPU_TYPE": "inductor_utils", "IS_H100": "inductor_utils",
    "HAS_TRITON": "inductor_utils", "HAS_CUDA_AND_TRITON": "inductor_utils",
}


@pytest.mark.slow  # imports upstream's testing modules
class UpstreamValuesTest(unittest.TestCase):
    def test_every_flag_has_upstreams_value_here(self) -> None:
        import harness

        for name, module in UPSTREAM_HOME.items():
            with self.subTest(flag=name):
                upstream = importlib.import_module(f"torch.testing._internal.{module}")
                ours = getattr(harness, name)
                self.assertEqual(bool(ours) if isinstance(ours, flags.LazyFlag) else ours,
                                 bool(getattr(upstream, name))
                                 if type(getattr(upstream, name)).__name__ == "LazyVal"
                                 else getattr(upstream, name))

    def test_rocm_version_reads_as_upstream(self) -> None:
        from torch.testing._internal.common_cuda import _get_torch_rocm_version

        self.assertEqual(flags._get_torch_rocm_version(), _get_torch_rocm_version())


class LazyFlagTest(unittest.TestCase):
    def test_device_query_waits_for_first_use_and_runs_once(self) -> None:
        calls = []
        flag = flags.LazyFlag(lambda: calls.append(1) or True)
        self.assertEqual(calls, [])
        self.assertTrue(flag)
        self.assertTrue(flag == True)  # noqa: E712 - the comparison is what is tested
        self.assertEqual(repr(flag), "True")
        self.assertEqual(calls, [1])

    def test_capability_flags_on_a_present_gpu(self) -> None:
        with (mock.patch.object(torch.cuda, "is_available", return_value=True),
              mock.patch.object(torch.cuda, "get_device_capability", return_value=(9, 0))):
            self.assertTrue(flags._capability_at_least(8, 9))
            self.assertTrue(flags._capability_at_least(9, 0))
            self.assertFalse(flags._capability_at_least(10, 0))

    def test_sandcastle_and_ci_follow_the_environment_at_import(self) -> None:
        with mock.patch.dict("os.environ", {"SANDCASTLE": "1", "CI": "true"}):
            reloaded = importlib.reload(flags)
            self.assertEqual((reloaded.IS_SANDCASTLE, reloaded.IS_CI), (True, True))
        importlib.reload(flags)


if __name__ == "__main__":
    unittest.main()
