"""Strictness of test_cases/test_misc.py: break FSDP on purpose, the suite must fail.

Each fault below replaces one piece of FSDP with a broken version (gradients reduced
to the wrong value, sync_module_states doing nothing, ...). A test runs selected
test_misc tests in a fresh interpreter with the fault installed and asserts that they
fail, for the reason the fault causes. Rank processes start from a clean interpreter
(forkserver or spawn), so a patch made in this process would never reach them; the
fault is installed instead by a generated ``sitecustomize.py`` on ``PYTHONPATH``, which
every interpreter of the run (the runner, the forkserver, each rank) executes first.

Run by hand: ``python -m unittest tests.test_strictness_misc -v``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Any, Callable, Dict, List

FAULT_ENV = "HARNESS_MISC_FAULT"
REPO_ROOT = Path(__file__).resolve().parent.parent
SUITE = "test_cases.test_misc"
RUN_TIMEOUT_S = 600

_SITECUSTOMIZE = """\
import importlib.util
import os

_spec = importlib.util.spec_from_file_location("_harness_misc_faults", {path!r})
_faults = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_faults)
_faults.install_fault(os.environ[{env!r}])
"""


def _no_sync_module_states() -> None:
    """``sync_module_states=True`` neither checks nor broadcasts anything."""
    from torch.distributed.fsdp import _init_utils

    _init_utils._sync_module_params_and_buffers = lambda *args, **kwargs: None


class _FaultyReductionDist:
    """``torch.distributed`` as FSDP's runtime module sees it, except for the two calls
    that reduce gradients (``reduce_scatter_single`` and ``all_reduce``), which
    ``mode`` breaks: ``"sum"`` sums instead of averaging (results scaled by the group
    size), ``"local"`` does not communicate (each rank keeps its own gradient)."""

    def __init__(self, mode: str) -> None:
        import torch.distributed

        self._dist = torch.distributed
        self._mode = mode

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dist, name)

    def reduce_scatter_single(self, output: Any, input: Any, *args: Any, **kwargs: Any) -> None:
        group = kwargs.get("group")
        if self._mode == "local":
            rank, size = self._dist.get_rank(group), self._dist.get_world_size(group)
            output.copy_(input.view(size, -1)[rank])
            return
        self._wait(self._dist.reduce_scatter_single(output, input, *args, **kwargs))
        output.mul_(self._dist.get_world_size(group))

    def all_reduce(self, tensor: Any, *args: Any, **kwargs: Any) -> None:
        if self._mode == "local":
            return
        self._wait(self._dist.all_reduce(tensor, *args, **kwargs))
        tensor.mul_(self._dist.get_world_size(kwargs.get("group")))

    @staticmethod
    def _wait(work: Any) -> None:
        if work is not None:
            work.wait()


def _gradient_sum_not_mean() -> None:
    from torch.distributed.fsdp import _runtime_utils

    _runtime_utils.dist = _FaultyReductionDist("sum")


def _gradient_not_reduced() -> None:
    from torch.distributed.fsdp import _runtime_utils

    _runtime_utils.dist = _FaultyReductionDist("local")


def _no_homogeneous_check() -> None:
    """Nested FSDP instances with different homogeneous attributes are accepted."""
    from torch.distributed.fsdp import _runtime_utils

    original = _runtime_utils._share_state_and_init_handle_attrs

    def share_without_check(root_state: Any, root_module: Any) -> None:
        try:
            original(root_state, root_module)
        except ValueError as error:
            if "homogeneous" not in str(error):
                raise

    _runtime_utils._share_state_and_init_handle_attrs = share_without_check


def _no_pre_backward_hooks() -> None:
    """FSDP registers no pre-backward hooks on forward outputs."""
    from torch.distributed.fsdp import _runtime_utils

    _runtime_utils._register_pre_backward_hooks = lambda state, module, outputs, handle: outputs


def _ignored_modules_not_ignored() -> None:
    """``ignored_modules`` is dropped: FSDP manages (flattens, moves) those modules too."""
    from torch.distributed.fsdp import _init_utils

    _init_utils._get_ignored_modules = lambda root_module, ignored_modules: set()


def _unsafe_setattr_env_ignored() -> None:
    """FSDP always uses the safe setattr path, whatever FSDP_USE_UNSAFE_SETATTR says."""
    from torch.distributed.fsdp import _flat_param

    def safe_only(handle: Any) -> None:
        handle._setattr_tensor = _flat_param._safe_setattr_tensor_or_param
        handle._setattr_param = _flat_param._safe_setattr_tensor_or_param

    _flat_param.FlatParamHandle._init_setattr_fns = safe_only


FAULTS: Dict[str, Callable[[], None]] = {
    "none": lambda: None,
    "no_sync_module_states": _no_sync_module_states,
    "gradient_sum_not_mean": _gradient_sum_not_mean,
    "gradient_not_reduced": _gradient_not_reduced,
    "no_homogeneous_check": _no_homogeneous_check,
    "no_pre_backward_hooks": _no_pre_backward_hooks,
    "ignored_modules_not_ignored": _ignored_modules_not_ignored,
    "unsafe_setattr_env_ignored": _unsafe_setattr_env_ignored,
}


def install_fault(name: str) -> None:
    """Break FSDP in this interpreter as fault ``name`` says (called from sitecustomize)."""
    if name not in FAULTS:
        raise ValueError(f"{FAULT_ENV}={name!r} is not one of: {', '.join(FAULTS)}")
    FAULTS[name]()


def run_with_fault(fault: str, test_ids: List[str]) -> subprocess.CompletedProcess:
    """Run ``test_ids`` (``Class.method`` of test_misc) with ``fault`` in every interpreter."""
    with tempfile.TemporaryDirectory(prefix="misc_fault_") as site_dir:
        Path(site_dir, "sitecustomize.py").write_text(
            _SITECUSTOMIZE.format(path=str(Path(__file__).resolve()), env=FAULT_ENV)
        )
        env = dict(os.environ)
        env[FAULT_ENV] = fault
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (site_dir, str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        return subprocess.run(
            [sys.executable, "-m", "unittest", "-v", SUITE, *(f"-k{t}" for t in test_ids)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )


class TestMiscSuiteIsStrict(unittest.TestCase):
    """Each fault must make the test_misc tests that guard against it fail."""

    def _assert_fails(self, fault: str, test_ids: List[str], reason: str) -> None:
        result = run_with_fault(fault, test_ids)
        output = result.stdout + result.stderr
        self.assertNotEqual(0, result.returncode, f"{fault}: suite passed\n{output[-3000:]}")
        for test_id in test_ids:
            method = test_id.split(".")[-1]
            self.assertRegex(
                output,
                rf"(?m)^(FAIL|ERROR): {method} \(",
                f"{fault}: {test_id} did not fail\n{output[-3000:]}",
            )
        self.assertIn(reason, output, f"{fault}: failed for another reason\n{output[-3000:]}")

    def test_control_selected_tests_pass_without_fault(self) -> None:
        test_ids = [
            "TestFSDPMiscMultiProcess.test_fsdp_not_all_outputs_used_in_loss",
            "TestFSDPMiscMultiThread.test_fsdp_namedtuple",
            "TestFSDPMiscWorldSize1.test_unsafe_setattr",
        ]
        result = run_with_fault("none", test_ids)
        output = result.stdout + result.stderr
        self.assertEqual(0, result.returncode, output[-3000:])

    def test_gradient_sum_not_mean(self) -> None:
        # test_fsdp_cpu_training cannot see this one: Adam's update is invariant to the
        # scale of the gradient.
        self._assert_fails(
            "gradient_sum_not_mean",
            ["TestFSDPMiscMultiProcess.test_fsdp_not_all_outputs_used_in_loss"],
            "not close",
        )

    def test_gradient_not_reduced(self) -> None:
        self._assert_fails(
            "gradient_not_reduced",
            [
                "TestFSDPMiscMultiProcess.test_fsdp_cpu_training",
                "TestFSDPMiscMultiProcess.test_fsdp_not_all_outputs_used_in_loss",
            ],
            "not close",
        )

    def test_no_sync_module_states(self) -> None:
        self._assert_fails(
            "no_sync_module_states",
            ["TestFSDPMiscMultiProcess.test_cpu_init_with_sync_module_states"],
            "ValueError not raised",
        )

    def test_no_homogeneous_check(self) -> None:
        self._assert_fails(
            "no_homogeneous_check",
            ["TestFSDPMiscMultiThread.test_homogeneous_attributes"],
            "ValueError not raised",
        )

    def test_no_pre_backward_hooks(self) -> None:
        self._assert_fails(
            "no_pre_backward_hooks",
            ["TestFSDPMiscMultiThread.test_fsdp_namedtuple"],
            "[] == []",
        )

    def test_ignored_modules_not_ignored(self) -> None:
        self._assert_fails(
            "ignored_modules_not_ignored",
            [
                "TestFSDPMiscMultiThread.test_fsdp_device_id_no_move_ignored_params_and_bufs",
                "TestFSDPMiscMultiThread.test_fsdp_ignored_module_meta",
            ],
            "device(type='meta') != device(type='cpu')",
        )

    def test_unsafe_setattr_env_ignored(self) -> None:
        self._assert_fails(
            "unsafe_setattr_env_ignored",
            ["TestFSDPMiscWorldSize1.test_unsafe_setattr"],
            "True is not false",
        )


if __name__ == "__main__":
    unittest.main()
