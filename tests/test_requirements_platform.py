"""harness.requirements.platform (and the decorators and context managers of
harness.upstream.network, harness.upstream.test_helpers, harness.kit.mock_pg,
harness.kit.checkpoint, harness.single_process.device_type that upstream files import with them):
outcomes and reasons as upstream's, per test id, on the same file; the logic for hardware this
machine lacks with the device query patched."""

from __future__ import annotations

import unittest
from typing import Callable
from unittest import mock

import pytest
import torch

from harness.requirements import platform
from tests.differential import both

DECORATED = '''
import logging
import os
import unittest
import warnings

import torch
import torch.distributed as dist
from torch.testing._internal.common_cuda import with_tf32_off, xfailIfSM100OrLater
from torch.testing._internal.common_device_type import (
    instantiate_device_type_tests,
    skipMeta,
    skipXPUIf,
)
from torch.testing._internal.common_distributed import (
    get_required_world_size,
    requires_multicast_support,
    requires_nccl_shrink,
    requires_nccl_version,
    requires_ucc,
    requires_world_size,
    skip_if_rocm_arch_multiprocess,
    skip_if_rocm_ver_lessthan_multiprocess,
    skip_if_win32,
    with_nccl_blocking_wait,
)
from torch.testing._internal.common_utils import (
    check_leaked_tensors,
    get_cycles_per_ms,
    load_tests,
    MI300_ARCH,
    NoTest,
    requires_cuda,
    requires_cuda_p2p_access,
    retry_on_connect_failures,
    runOnRocmArch,
    skip_but_pass_in_sandcastle,
    skipIfRocmArch,
    skipIfRocmVersionLessThan,
    skipIfTorchDynamo,
    skipIfXpu,
    TestCase,
    wrapSwapTensorsTest,
    xfailIf,
    xfailIfTorchDynamo,
)
from torch.testing._internal.distributed.checkpoint_utils import with_checkpoint_logging
from torch.testing._internal.distributed.distributed_utils import with_dist, with_fake_comms
from torch.testing._internal.inductor_utils import requires_triton
from torch.testing._internal.triton_utils import requires_cuda_and_triton, requires_gpu

calls = []


class Decorated(TestCase):
    @xfailIf(True)
    def test_xfail_if_true_failing(self):
        raise AssertionError("expected")

    @xfailIf(True)
    def test_xfail_if_true_passing(self):
        pass

    @xfailIf(False)
    def test_xfail_if_false(self):
        pass

    @xfailIfTorchDynamo
    def test_xfail_if_dynamo(self):
        pass

    @skipIfTorchDynamo("not with dynamo")
    def test_skip_if_dynamo(self):
        pass

    @skip_but_pass_in_sandcastle("a reason")
    def test_skip_but_pass_in_sandcastle(self):
        pass

    @requires_cuda
    def test_requires_cuda(self):
        pass

    @requires_cuda_p2p_access()
    def test_requires_p2p(self):
        pass

    @skipIfRocmArch(MI300_ARCH)
    def test_skip_if_rocm_arch(self):
        pass

    @runOnRocmArch(MI300_ARCH)
    def test_run_on_rocm_arch(self):
        pass

    @skipIfRocmVersionLessThan((6, 0))
    def test_skip_if_rocm_version(self):
        pass

    @skipIfXpu
    def test_skip_if_xpu(self):
        pass

    @skipIfXpu(msg="no xpu")
    def test_skip_if_xpu_msg(self):
        pass

    @requires_nccl_version((2, 27), "needs it")
    def test_requires_nccl_version(self):
        pass

    @requires_nccl_shrink()
    def test_requires_nccl_shrink(self):
        pass

    @requires_ucc()
    def test_requires_ucc(self):
        pass

    @requires_multicast_support()
    def test_requires_multicast(self):
        pass

    @skip_if_win32()
    def test_skip_if_win32(self):
        pass

    @skip_if_rocm_arch_multiprocess(MI300_ARCH)
    def test_skip_if_rocm_arch_multiprocess(self):
        pass

    @skip_if_rocm_ver_lessthan_multiprocess((6, 0))
    def test_skip_if_rocm_version_multiprocess(self):
        pass

    @requires_world_size(3)
    def test_requires_world_size(self):
        pass

    def test_required_world_size_default(self):
        self.assertEqual(get_required_world_size(self, 7), 7)

    @with_nccl_blocking_wait
    def test_nccl_blocking_wait(self):
        self.assertEqual(os.environ["TORCH_NCCL_BLOCKING_WAIT"], "1")
        self.assertNotIn("TORCH_NCCL_ASYNC_ERROR_HANDLING", os.environ)

    def test_nccl_blocking_wait_restores(self):
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "3"
        with_nccl_blocking_wait(lambda: None)()
        self.assertEqual(os.environ.pop("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "3")
        self.assertEqual(os.environ.pop("TORCH_NCCL_BLOCKING_WAIT"), "1")

    @with_tf32_off
    def test_tf32_off(self):
        self.assertFalse(torch.backends.cuda.matmul.allow_tf32)

    @xfailIfSM100OrLater
    def test_xfail_sm100(self):
        pass

    @requires_triton()
    def test_requires_triton(self):
        pass

    @requires_gpu
    def test_requires_gpu(self):
        pass

    @requires_cuda_and_triton
    def test_requires_cuda_and_triton(self):
        pass

    def test_retry_until_the_port_is_free(self):
        @retry_on_connect_failures
        def bind():
            calls.append(1)
            if len(calls) < 3:
                raise RuntimeError("Address already in use")
            return len(calls)

        self.assertEqual(bind(), 3)

    def test_retry_passes_other_errors_on(self):
        @retry_on_connect_failures(connect_errors=("timed out",))
        def bind():
            raise RuntimeError("boom")

        bind()

    def test_swap_tensors(self):
        before = torch.__future__.get_swap_module_params_on_conversion()
        seen = []
        wrapSwapTensorsTest(True)(
            lambda: seen.append(torch.__future__.get_swap_module_params_on_conversion()))()
        self.assertEqual(seen, [True])
        self.assertEqual(torch.__future__.get_swap_module_params_on_conversion(), before)

    def test_leaked_tensors(self):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with check_leaked_tensors() as garbage:
                a = [torch.ones(2)]
                a.append(a)
                del a
        self.assertEqual(len(garbage), 1)
        self.assertIn("1 tensors were found in the garbage", str(caught[0].message))

    @with_fake_comms
    def test_fake_comms(self):
        self.assertEqual((dist.get_rank(), dist.get_world_size()), (0, 2))

    @with_fake_comms(rank=3, world_size=8)
    def test_fake_comms_args(self):
        self.assertEqual((dist.get_rank(), dist.get_world_size()), (3, 8))

    def test_with_dist(self):
        with with_dist(rank=1, world_size=4):
            self.assertEqual(dist.get_world_size(), 4)
        self.assertFalse(dist.is_initialized())

    @with_checkpoint_logging
    def test_checkpoint_logging(self):
        logger = logging.getLogger("torch.distributed.checkpoint")
        self.assertEqual(logger.level, logging.INFO)

    def test_cycles_per_ms(self):
        self.assertGreater(get_cycles_per_ms("cpu"), 0)

    def test_no_test(self):
        self.assertFalse(NoTest.__test__)


class DeviceThing(TestCase):
    @skipXPUIf(True, "not on xpu")
    def test_skip_xpu(self, device):
        pass

    @skipMeta
    def test_skip_meta(self, device):
        pass


instantiate_device_type_tests(DeviceThing, globals(), only_for="cpu")
'''


@pytest.mark.slow
class DifferentialTest(unittest.TestCase):
    def test_outcomes_and_reasons_match_upstream(self) -> None:
        theirs, ours = both(DECORATED)
        self.assertGreater(len(theirs), 40)
        self.assertEqual(sorted(ours), sorted(theirs))
        for test_id, (outcome, detail) in theirs.items():
            with self.subTest(test=test_id):
                self.assertEqual(ours[test_id][0], outcome, ours[test_id][1])
                if outcome == "skip":
                    self.assertEqual(ours[test_id][1], detail)


class _Case(unittest.TestCase):
    def test(self) -> None:
        pass


def _outcome(decorated: object) -> str:
    """`pass` or the skip reason of one test decorated as given."""
    case = type("Probe", (_Case,), {"test": decorated})("test")
    result = unittest.TestResult()
    case.run(result)
    return result.skipped[0][1] if result.skipped else "pass"


def _test() -> Callable[[unittest.TestCase], None]:
    """A fresh test function (skip decorators may mark the function they are given)."""

    def test(self: unittest.TestCase) -> None:
        pass

    return test


class PresentDeviceLogicTest(unittest.TestCase):
    """Decorators for hardware this machine lacks, with the device query patched."""

    def test_nccl_version_on_a_cuda_machine(self) -> None:
        with (mock.patch.object(platform, "cuda_available", return_value=True),
              mock.patch.object(platform.dist, "is_nccl_available", return_value=True),
              mock.patch.object(platform, "nccl_version", return_value=(2, 21, 5))):
            self.assertEqual(
                _outcome(platform.requires_nccl_version((2, 27), "shrink")(_test())),
                "Requires NCCL version greater than or equal to: (2, 27), found: (2, 21, 5), "
                "reason: shrink")
            self.assertEqual(
                _outcome(platform.requires_nccl_version((2, 20), "old")(_test())), "pass")
        with (mock.patch.object(platform, "cuda_available", return_value=True),
              mock.patch.object(platform.dist, "is_nccl_available", return_value=False)):
            self.assertEqual(_outcome(platform.requires_nccl_shrink()(_test())),
                             "c10d was not compiled with the NCCL backend")

    def test_p2p_and_multicast_on_a_cuda_machine(self) -> None:
        with (mock.patch.object(platform, "cuda_available", return_value=True),
              mock.patch.object(platform, "peer_access_ok", return_value=True)):
            self.assertEqual(_outcome(platform.requires_cuda_p2p_access()(_test())), "pass")
        with (mock.patch.object(platform, "cuda_device_count", return_value=4),
              mock.patch.object(torch.cuda, "get_device_capability", return_value=(9, 0)),
              mock.patch.object(torch.cuda, "can_device_access_peer",
                                side_effect=lambda i, j: (i, j) != (1, 3))):
            self.assertFalse(platform.peer_access_ok())
        with mock.patch.object(platform, "multicast_supported", return_value=True):
            self.assertEqual(_outcome(platform.requires_multicast_support()(_test())), "pass")

    def test_sm_level(self) -> None:
        cuda = torch.device("cuda", 0)
        with mock.patch.object(platform, "device_capability", return_value=(9, 0)):
            self.assertTrue(platform.sm_is_or_higher_than(cuda, 8, 0))
            self.assertTrue(platform.sm_is_or_higher_than(cuda, 9, 0))
            self.assertFalse(platform.sm_is_or_higher_than(cuda, 10, 0))
            with mock.patch.object(torch.version, "hip", "6.2.0"):
                self.assertFalse(platform.sm_is_or_higher_than(cuda, 8, 0))
        self.assertTrue(platform.sm_is_or_higher_than(torch.device("cpu"), 99, 0))

    def test_rocm_architectures(self) -> None:
        with (mock.patch.object(platform.flags, "TEST_WITH_ROCM", True),
              mock.patch.object(torch.version, "hip", "6.2.41133-abc"),
              mock.patch.object(platform, "rocm_arch_name",
                                return_value="gfx942:sramecc+:xnack-")):
            self.assertEqual(_outcome(platform.skipIfRocmArch(("gfx942",))(_test())),
                             "skipIfRocm: test skipped on ('gfx942',)")
            self.assertEqual(_outcome(platform.skipIfRocmArch(("gfx90a",))(_test())), "pass")
            self.assertEqual(_outcome(platform.runOnRocmArch(("gfx90a",))(_test())),
                             "skipIfRocm: test only runs on ('gfx90a',)")
            self.assertEqual(
                _outcome(platform.skip_if_rocm_arch_multiprocess(("gfx942",))(_test())),
                "skip_if_rocm_arch_multiprocess: test skipped on ('gfx942',)")
            self.assertEqual(
                _outcome(platform.skip_if_rocm_ver_lessthan_multiprocess((7, 0))(_test())),
                "skip_if_rocm_ver_lessthan_multiprocess: ROCm (6, 2, 41133) is available but "
                "(7, 0) required")
            self.assertEqual(
                _outcome(platform.skipIfRocmVersionLessThan((7, 0))(_test())),
                "ROCm version less than (7, 0) required")
            self.assertEqual(
                _outcome(platform.skipIfRocmVersionLessThan((6, 1))(_test())), "pass")

    def test_gpu_counts(self) -> None:
        with mock.patch.object(platform, "cuda_device_count", return_value=2):
            self.assertEqual(
                _outcome(platform.require_n_gpus_for_nccl_backend(4, "nccl")(_test())),
                "Need at least 4 CUDA devices")
            self.assertEqual(
                _outcome(platform.require_n_gpus_for_nccl_backend(2, "nccl")(_test())),
                "pass")
            self.assertEqual(_outcome(platform.requires_world_size(2)(_test())), "pass")
        self.assertEqual(
            _outcome(platform.require_n_gpus_for_nccl_backend(4, "gloo")(_test())), "pass")

    def test_dynamo_switch(self) -> None:
        with mock.patch.object(platform, "TEST_WITH_TORCHDYNAMO", True):
            self.assertEqual(_outcome(platform.skipIfTorchDynamo("no")(_test())), "no")
        with self.assertRaisesRegex(AssertionError, "skipIfTorchDynamo correctly"):
            platform.skipIfTorchDynamo(_test())  # type: ignore[arg-type]


if __name__ == "__main__":
    unittest.main()
