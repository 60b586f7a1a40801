"""A unittest-based multi-rank test harness for PyTorch, on public torch APIs.

Every public name is importable from here (`from harness import FSDPTest`); CONTRIBUTING.md's
module map says where each one lives. Names are looked up on first use (PEP 562), so that
importing one submodule, or one name, imports only what it needs: the outcome model and
run_all's command line load without torch and the kits.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any, Dict, List, Tuple

__version__ = "0.1.0"  # the one place: pyproject.toml reads it (tool.setuptools.dynamic)

if "pytest" in sys.modules:  # pytest loads us as its plugin: our own modules need no
    from harness.compat import pytest_internals  # assert rewriting (0.7 s a session)

    pytest_internals.leave_unrewritten(__name__)

# Each public name, under the module that defines it. A new export is one entry here.
_HOMES: Dict[str, Tuple[str, ...]] = {
    "harness.settings": (
        "TEST_CUDA", "TEST_MULTIGPU", "TIMEOUT_DEFAULT", "TIMEOUT_OVERRIDE", "HarnessConfigError",
    ),
    "harness.requirements.decorators": (
        "IS_FBCODE", "TEST_HPU", "TEST_WITH_DEV_DBG_ASAN", "TEST_WITH_ROCM", "TEST_XPU",
        "at_least_x_gpu", "requires_accelerator_dist_backend", "requires_gloo",
        "skip_but_pass_in_sandcastle_if", "skip_if_lt_x_gpu", "skip_if_no_gpu",
        "skip_if_rocm_multiprocess", "skipIfHpu", "skipIfRocm",
    ),
    "harness.requirements.flags": (
        "E4M3_MAX_POS", "GPU_TYPE", "HAS_ACCELERATOR", "HAS_CUDA_AND_TRITON", "HAS_GPU",
        "HAS_TRITON", "IS_CI", "IS_H100", "IS_SANDCASTLE", "IS_WINDOWS", "MI200_ARCH", "MI300_ARCH",
        "MI350_ARCH", "NAVI_ARCH", "PLATFORM_SUPPORTS_CUDNN_ATTENTION",
        "PLATFORM_SUPPORTS_FLASH_ATTENTION", "PLATFORM_SUPPORTS_FP8",
        "PLATFORM_SUPPORTS_FUSED_ATTENTION", "PLATFORM_SUPPORTS_MEM_EFF_ATTENTION",
        "PLATFORM_SUPPORTS_SYMM_MEM", "TEST_CUDA_GRAPH", "TEST_MULTIACCELERATOR", "LazyFlag",
        "SM80OrLater", "SM89OrLater", "SM90OrLater", "SM100OrLater", "_get_torch_rocm_version",
        "e4m3_type", "rocm_arch_any_of",
    ),
    "harness.requirements.platform": (
        "TEST_WITH_TORCHDYNAMO", "get_required_world_size", "import_transformers_or_skip",
        "require_n_gpus_for_nccl_backend", "requires_cuda", "requires_cuda_and_triton",
        "requires_cuda_p2p_access", "requires_gpu", "requires_multicast_support", "requires_nccl",
        "requires_nccl_shrink", "requires_nccl_version", "requires_triton", "requires_ucc",
        "requires_world_size", "runOnRocmArch", "skip_but_pass_in_sandcastle",
        "skip_if_rocm_arch_multiprocess", "skip_if_rocm_ver_lessthan_multiprocess", "skip_if_win32",
        "skipIfRocmArch", "skipIfRocmVersionLessThan", "skipIfTorchDynamo", "skipIfXpu",
        "sm_is_or_higher_than", "tf32_off", "with_nccl_blocking_wait", "with_tf32_off", "xfailIf",
        "xfailIfSM100OrLater", "xfailIfTorchDynamo",
    ),
    "harness.requirements.skip_codes": (
        "TEST_SKIPS",
    ),
    "harness.single_process.device_type": (
        "DeviceTypeTestBase", "deviceCountAtLeast", "dtypes", "dtypesIfCPU", "dtypesIfCUDA",
        "instantiate_device_type_tests", "onlyAccelerator", "onlyCPU", "onlyCUDA",
        "onlyNativeDeviceTypes", "onlyOn", "skipCPUIf", "skipCUDAIf", "skipMeta", "skipMetaIf",
        "skipXPUIf",
    ),
    "harness.single_process.parametrize": (
        "instantiate_parametrized_tests", "parametrize", "subtest",
    ),
    "harness.single_process.subtests": (
        "run_subtests",
    ),
    "harness.single_process.testcase": (
        "SEED", "TestCase",
    ),
    "harness.upstream.dist_utils": (
        "captured_output", "with_dist_debug_levels",
    ),
    "harness.upstream.grad_checks": (
        "_assertGradAndGradgradChecks", "dtype2prec_DONTUSE", "gradcheck", "gradgradcheck",
    ),
    "harness.upstream.network": (
        "ADDRESS_IN_USE", "CONNECT_TIMEOUT", "FILE_SCHEMA", "create_device", "create_tcp_store",
        "find_free_port", "retry_on_connect_failures", "tp_transports",
    ),
    "harness.upstream.test_helpers": (
        "NoTest", "check_leaked_tensors", "get_cycles_per_ms", "load_tests", "wrapSwapTensorsTest",
    ),
    "harness.pytest_plugin.fixtures": (
        "rank_fixture",
    ),
    "harness.pytest_plugin.pool": (
        "RankPool",
    ),
    "harness.pytest_plugin.deepspeed": (
        "DistributedTest",
    ),
    "harness.kit.two_tensor": (
        "TwoTensor",
    ),
    "harness.kit.logging_case": (
        "LoggingTestCase",
    ),
    "harness.kit.checkpoint": (
        "Rot13Example", "get_test_extension_registry", "with_checkpoint_logging",
    ),
    "harness.kit.composable_models": (
        "CompositeModel", "CompositeParamModel", "FakeSequential", "NestedSequentialModel",
        "UnitModule", "UnitParamModule",
    ),
    "harness.kit.ddp_helpers": (
        "SaveForwardInputsModel", "SaveForwardInputsModule", "get_timeout", "init_multigpu_helper",
        "logger", "requires_ddp_rank", "simple_sparse_reduce_tests", "verify_ddp_error_logged",
    ),
    "harness.kit.dtensor": (
        "DEVICE_TYPE", "NUM_DEVICES", "PG_BACKEND", "DTensorContinuousTestBase", "DTensorConverter",
        "DTensorOpTestBase", "DTensorTestBase", "LocalDTensorContinuousTestBase",
        "LocalDTensorOpTestBase", "LocalDTensorTestBase", "create_local_tensor_test_class",
        "generate_shard_orders", "make_full_tensor", "map_local_for_rank",
        "map_local_tensor_for_rank", "op_strategy_context", "patched_distribute_tensor",
        "redistribute", "reduce_local_int", "shard_order_to_placement", "skip_unless_torch_gpu",
        "validate_sharding_rule_sample", "validate_sharding_rule_sample_backward", "with_comms",
        "with_temp_dir",
    ),
    "harness.kit.dtensor_models": (
        "Attention", "ExpertLayer", "ExpertParallel", "ExpertParallelWithTP", "Experts",
        "FeedForward", "MLPModule", "MLPStacked", "ModelArgs", "RMSNormPython",
        "TensorParallelForExpert", "Transformer", "TransformerBlock",
    ),
    "harness.kit.dynamo_dist": (
        "DynamoDistributedMultiProcTestCase", "DynamoDistributedSingleProcTestCase",
        "_dynamo_dist_per_rank_init",
    ),
    "harness.kit.fake_pg": (
        "FakeProcessGroup", "FakeStore",
    ),
    "harness.kit.fsdp": (
        "FSDPTest", "FSDPTestContinuous", "FSDPTestMixin", "FSDPTestMultiThread",
    ),
    "harness.kit.fsdp1_grads": (
        "assert_fsdp1_grads_equal", "fsdp1_full_grads", "named_grads",
    ),
    "harness.kit.fsdp_helpers": (
        "DummyProcessGroup", "_assert_module_states", "_broadcast_state_dict", "_get_state_dict",
        "_maybe_wrap_fsdp", "_move_to_device", "_zero_model", "assert_module_states",
        "check_sharded_parity", "compiled_fsdp_test", "get_devtype", "get_full_params",
        "patch_all_gather", "patch_all_reduce", "patch_foreach_all_gather", "patch_foreach_reduce",
        "patch_post_backward", "patch_reduce_scatter", "patch_register_post_backward_hook_backward",
        "patch_reshard", "patch_unshard", "reduce_scatter_with_assert", "subtest_name",
    ),
    "harness.kit.mock_pg": (
        "MockProcessGroup", "mock_init_dist", "with_dist", "with_fake_comms",
    ),
    "harness.kit.models": (
        "MLP", "AlwaysWrapNestedWrappedModule", "CUDAInitMode", "DEVICEInitMode", "DoubleLinear",
        "DummyDDP", "FSDPInitMode", "FSDPTestModel", "MixtureOfExperts", "MLPStack",
        "ModuleWithDelay", "NestedLinear", "NestedWrappedModule", "NestedWrappedModuleWithDelay",
        "NonUniformReqGradNWM", "SkipModel", "SkipModule", "TransformerWithSharedParams",
    ),
    "harness.kit.sharded_tensor": (
        "DEFAULT_GPU_NUM", "PLACEMENTS", "TEST_GPU_NUM", "MyShardedModel1", "MyShardedModel2",
        "ShardedTensorTestBase", "SimpleMegatronLM", "_chunk_sharding_specs_list_for_test",
        "clone_module_parameter", "gen_binary_op_func", "generate_chunk_sharding_specs_for_test",
        "generate_enumerable_sharding_specs_for_test",
        "generate_local_weight_sharding_params_for_test",
    ),
    "harness.kit.state_dict": (
        "FusionEmbedding", "FusionEmbeddingWithHook", "FusionEmbeddingWithModifier",
        "VerifyStateDictMixin",
    ),
    "harness.process.multiprocess_case": (
        "MAIN_PROCESS_RANK", "DistributedTestBase", "MultiProcessTestCase",
    ),
    "harness.process.continuous": (
        "MultiProcContinuousTest",
    ),
    "harness.runner.main": (
        "run_tests",
    ),
    "harness.threads.multithreaded_case": (
        "MultiThreadedTestCase",
    ),
    "harness.threads.spawn": (
        "spawn_threads_and_init_comms",
    ),
}

_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted(_HOME_OF)


def __getattr__(name: str) -> Any:
    """Import a public name's module when the name is first asked for; a submodule otherwise."""
    home = _HOME_OF.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # later look-ups are plain attribute reads
        return value
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as error:
        if error.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_HOME_OF))


# Values of home modules replaced through the package, restored when the name is deleted.
_REPLACED: Dict[str, Any] = {}


class _Package(types.ModuleType):
    """A public name wins over a submodule of the same name, should a module bearing a public
    name ever sit at the top of harness/ (as harness/parametrize.py did before it moved to
    harness/single_process/): importing the submodule must not replace the name bound here.

    Assigning a public name through the package also assigns it in the module that defines
    it, so that module state a client sets reaches the code that reads it, as assigning an
    upstream module's global does: a file migrated to `import harness as common_utils` that
    sets `common_utils.SEED = 99` seeds its tests with 99 (harness.single_process.testcase reads
    its SEED).
    Deleting the name (as `mock.patch` does on exit) restores the defining module's value."""

    def __setattr__(self, name: str, value: Any) -> None:
        home = _HOME_OF.get(name)
        if home is not None:
            if isinstance(value, types.ModuleType):
                return
            module = importlib.import_module(home)
            if name not in _REPLACED:
                _REPLACED[name] = getattr(module, name)
            setattr(module, name, value)
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        super().__delattr__(name)
        if name in _REPLACED:
            setattr(importlib.import_module(_HOME_OF[name]), name, _REPLACED.pop(name))


sys.modules[__name__].__class__ = _Package
