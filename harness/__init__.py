"""A unittest-based multi-rank test harness for PyTorch, on public torch APIs.

Every public name is importable from here (`from harness import FSDPTest`); the README's
module map says where each one lives.
"""

from harness.devices import HarnessConfigError
from harness.dtensor import DTensorTestBase, with_comms, with_temp_dir
from harness.fsdp import FSDPTest, FSDPTestMultiThread
from harness.fsdp_helpers import (
    _assert_module_states,
    assert_module_states,
    check_sharded_parity,
    patch_reduce_scatter,
    patch_register_post_backward_hook_backward,
    reduce_scatter_with_assert,
)
from harness.models import (
    MLP,
    CUDAInitMode,
    DEVICEInitMode,
    FSDPInitMode,
    NestedWrappedModule,
    TransformerWithSharedParams,
)
from harness.multiprocess import MAIN_PROCESS_RANK, MultiProcessTestCase
from harness.multithread import MultiThreadedTestCase
from harness.parametrize import instantiate_parametrized_tests, parametrize, run_subtests
from harness.runner import run_tests
from harness.skips import TEST_SKIPS, TEST_WITH_DEV_DBG_ASAN, skip_if_lt_x_gpu
from harness.testcase import TestCase

__all__ = [
    "CUDAInitMode",
    "DEVICEInitMode",
    "DTensorTestBase",
    "FSDPInitMode",
    "FSDPTest",
    "FSDPTestMultiThread",
    "HarnessConfigError",
    "MAIN_PROCESS_RANK",
    "MLP",
    "MultiProcessTestCase",
    "MultiThreadedTestCase",
    "NestedWrappedModule",
    "TEST_SKIPS",
    "TEST_WITH_DEV_DBG_ASAN",
    "TestCase",
    "TransformerWithSharedParams",
    "_assert_module_states",
    "assert_module_states",
    "check_sharded_parity",
    "instantiate_parametrized_tests",
    "parametrize",
    "patch_reduce_scatter",
    "patch_register_post_backward_hook_backward",
    "reduce_scatter_with_assert",
    "run_subtests",
    "run_tests",
    "skip_if_lt_x_gpu",
    "with_comms",
    "with_temp_dir",
]
