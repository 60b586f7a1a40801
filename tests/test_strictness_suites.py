"""Strictness of the FSDP suites: break FSDP on purpose, and the suites must fail.

Covers test_cases/test_fine_tune.py, test_fully_shard_frozen.py, test_exec_order.py and
test_checkpoint_fine_tuning.py. Each fault breaks one thing those suites promise to check
(gradients reduced to the wrong value, the execution-order validation, the post-backward
reshard of frozen parameters, fully_shard's post-backward running inside autograd, DCP
loading). Rank processes start from clean interpreters (forkserver or spawn), so a patch
made here would never reach them: the suite runs in a subprocess whose ``PYTHONPATH`` starts
with a generated ``sitecustomize.py`` that installs the fault named by ``HARNESS_SUITE_FAULT``
in every interpreter of the run (the runner, the forkserver and each rank).

Run by hand: ``python -m unittest tests.test_strictness_suites -v`` (about a minute).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Any, Callable, Dict, List

FAULT_ENV = "HARNESS_SUITE_FAULT"
REPO_ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 300

_SITECUSTOMIZE = """\
import importlib.util
import os

_spec = importlib.util.spec_from_file_location("_harness_suite_faults", {path!r})
_faults = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_faults)
_faults.install_fault(os.environ[{env!r}])
"""


def _reduce_scatter_fault(mode: str) -> None:
    """Break the reduce-scatter FSDP (FSDP1 and fully_shard) calls for gradients.

    ``"sum"``: the reduced shard is multiplied by the world size (a sum instead of a mean).
    ``"local"``: nothing is communicated; each rank keeps its own slice of its own gradient.
    DDP, the suites' reference, reduces with all_reduce and stays correct.
    """
    import torch.distributed as dist

    from harness import compat

    name = compat.fsdp_reduce_scatter_name()
    original = getattr(dist, name)

    def broken(output: Any, input: Any, op: Any = None, group: Any = None, async_op: bool = False):
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        if mode == "local":
            output.copy_(input.view(size, -1)[rank].view_as(output))
        else:
            kwargs = {} if op is None else {"op": op}
            work = original(output, input, group=group, async_op=async_op, **kwargs)
            if work is not None:
                work.wait()
            output.mul_(size)
        return None

    setattr(dist, name, broken)


def _no_exec_order_check() -> None:
    """FSDP1 never validates the forward order (not across ranks, not across iterations)."""
    from harness import compat

    compat.fsdp1_exec_order_class()._check_order = lambda self, handle, is_training: None


def _frozen_not_resharded_in_backward() -> None:
    """FSDP1 registers no post-backward reshard hook for flat parameters without gradients."""
    from harness import compat

    runtime = compat.fsdp1_runtime_module()
    runtime._register_post_backward_reshard_only_hook = lambda *args, **kwargs: None


def _post_backward_outside_autograd() -> None:
    """fully_shard's autograd post-backward does nothing; the final callback does it all."""
    from harness import compat

    compat.register_post_backward_function().backward = staticmethod(
        lambda ctx, *grads: (None, *grads)
    )


def _checkpoint_load_noop() -> None:
    """``torch.distributed.checkpoint.load`` returns without loading anything."""
    import torch.distributed.checkpoint as dcp

    dcp.load = lambda state_dict, **kwargs: None


FAULTS: Dict[str, Callable[[], None]] = {
    "none": lambda: None,
    "gradient_sum_not_mean": lambda: _reduce_scatter_fault("sum"),
    "gradient_not_reduced": lambda: _reduce_scatter_fault("local"),
    "no_exec_order_check": _no_exec_order_check,
    "frozen_not_resharded_in_backward": _frozen_not_resharded_in_backward,
    "post_backward_outside_autograd": _post_backward_outside_autograd,
    "checkpoint_load_noop": _checkpoint_load_noop,
}


def install_fault(name: str) -> None:
    """Break FSDP in this interpreter as fault ``name`` says (called from sitecustomize)."""
    if name not in FAULTS:
        raise ValueError(f"{FAULT_ENV}={name!r} is not one of: {', '.join(FAULTS)}")
    FAULTS[name]()


def run_with_fault(fault: str, suite: str, tests: List[str]) -> subprocess.CompletedProcess:
    """Run the ``tests`` (``-k`` patterns) of ``test_cases.<suite>`` with ``fault`` installed."""
    with tempfile.TemporaryDirectory(prefix="suite_fault_") as site_dir:
        Path(site_dir, "sitecustomize.py").write_text(
            _SITECUSTOMIZE.format(path=str(Path(__file__).resolve()), env=FAULT_ENV)
        )
        env = dict(os.environ)
        env[FAULT_ENV] = fault
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (site_dir, str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        command = [sys.executable, "-m", "unittest", "-v", f"test_cases.{suite}"]
        return subprocess.run(
            command + [f"-k{test}" for test in tests],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )


class TestFSDPSuitesAreStrict(unittest.TestCase):
    """Each fault must make the suite tests that guard against it fail, for that reason."""

    def _assert_fails(self, fault: str, suite: str, tests: List[str], reason: str) -> None:
        result = run_with_fault(fault, suite, tests)
        output = result.stdout + result.stderr
        self.assertNotEqual(0, result.returncode, f"{fault}: {suite} passed\n{output[-3000:]}")
        for test in tests:
            failed = re.search(rf"(?m)^(FAIL|ERROR): {test}\w* \(", output)
            self.assertTrue(failed, f"{fault}: {suite}.{test} did not fail\n{output[-3000:]}")
        self.assertIn(reason, output, f"{fault}: failed for another reason\n{output[-3000:]}")

    def test_control_selected_tests_pass_without_fault(self) -> None:
        for suite, tests in (
            ("test_fine_tune", ["test_parity_with_ddp"]),
            ("test_exec_order", ["test_invalid_first_iter_order"]),
        ):
            result = run_with_fault("none", suite, tests)
            self.assertEqual(0, result.returncode, (result.stdout + result.stderr)[-3000:])

    def test_gradient_not_reduced(self) -> None:
        self._assert_fails(
            "gradient_not_reduced", "test_fine_tune", ["test_parity_with_ddp"], "not close"
        )
        self._assert_fails(
            "gradient_not_reduced",
            "test_fully_shard_frozen",
            ["test_multi_forward_mixed_requires_grad", "test_train_mixed_requires_grad_per_group"],
            "not close",
        )

    def test_gradient_sum_not_mean(self) -> None:
        # Adam's update barely depends on the gradient's scale, so loss parity alone cannot
        # see this fault; check_sharded_parity compares the gradients themselves.
        self._assert_fails(
            "gradient_sum_not_mean",
            "test_fully_shard_frozen",
            ["test_train_mixed_requires_grad_across_groups"],
            "not close",
        )

    def test_no_exec_order_check(self) -> None:
        self._assert_fails(
            "no_exec_order_check",
            "test_exec_order",
            ["test_invalid_first_iter_order", "test_invalid_later_iter_order"],
            "not raised",
        )

    def test_frozen_not_resharded_in_backward(self) -> None:
        self._assert_fails(
            "frozen_not_resharded_in_backward",
            "test_fine_tune",
            ["test_backward_reshard_hooks"],
            "AssertionError",
        )

    def test_post_backward_outside_autograd(self) -> None:
        self._assert_fails(
            "post_backward_outside_autograd",
            "test_fully_shard_frozen",
            ["test_train_mixed_requires_grad_per_group"],
            "not greater than or equal to",
        )

    def test_checkpoint_load_noop(self) -> None:
        self._assert_fails(
            "checkpoint_load_noop",
            "test_checkpoint_fine_tuning",
            ["test_fine_tuning"],
            "not close",
        )


if __name__ == "__main__":
    unittest.main()
