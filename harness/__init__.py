"""A unittest-based multi-rank test harness for PyTorch, on public torch APIs.

Every public name is importable from here (`from harness import FSDPTest`). Names are
resolved on first use, so `import harness` stays cheap and a suite pulls in only the
parts it uses.
"""

from importlib import import_module
from typing import Any, Dict, List

# Imported eagerly: the module `harness.parametrize` would otherwise shadow the function.
from harness.parametrize import (  # noqa: F401 - re-exported
    instantiate_parametrized_tests,
    parametrize,
    run_subtests,
)

_PUBLIC: Dict[str, List[str]] = {
    "harness.testcase": ["TestCase"],
    "harness.parametrize": ["parametrize", "instantiate_parametrized_tests", "run_subtests"],
    "harness.skips": ["skip_if_lt_x_gpu", "TEST_SKIPS", "TEST_WITH_DEV_DBG_ASAN"],
    "harness.devices": ["HarnessConfigError"],
    "harness.multiprocess": ["MultiProcessTestCase", "MAIN_PROCESS_RANK"],
    "harness.multithread": ["MultiThreadedTestCase"],
    "harness.fsdp": ["FSDPTest", "FSDPTestMultiThread"],
    "harness.dtensor": ["DTensorTestBase", "with_comms", "with_temp_dir"],
    "harness.runner": ["run_tests"],
    "harness.models": [
        "FSDPInitMode",
        "DEVICEInitMode",
        "CUDAInitMode",
        "NestedWrappedModule",
        "TransformerWithSharedParams",
        "MLP",
    ],
    "harness.fsdp_helpers": [
        "assert_module_states",
        "_assert_module_states",
        "check_sharded_parity",
        "patch_reduce_scatter",
        "patch_register_post_backward_hook_backward",
        "reduce_scatter_with_assert",
    ],
}

_MODULE_OF = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))
