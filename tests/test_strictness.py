"""Strictness of the FSDP suites: break FSDP on purpose, and the suites must fail.

Covers test_cases/test_misc.py, test_fine_tune.py, test_fully_shard_frozen.py,
test_exec_order.py and test_checkpoint_fine_tuning.py. Each fault in ``tests.faults.FAULTS``
breaks one thing those suites promise to check (gradients reduced to the wrong value,
sync_module_states doing nothing, the execution-order validation, DCP loading, ...). A test
runs the suite tests that guard against its fault in a fresh interpreter with the fault
installed and asserts that they fail, for the reason the fault causes; a control run checks
that the same tests pass without a fault.

Rank processes start from clean interpreters (forkserver or spawn), so a patch made in this
process would never reach them: each run's ``PYTHONPATH`` starts with a generated
``sitecustomize.py`` that installs the fault named by ``HARNESS_STRICTNESS_FAULT`` (from
tests/faults.py; the repository root comes next on that path) in every interpreter of the run
(the runner, the forkserver and each rank). One fault per run; to save
time the run the next test needs is started while the current one is checked (at most two at
once), and a run no test asked for is killed at the end.

Run by hand: ``python -m unittest tests.test_strictness -v`` (a couple of minutes).
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

pytestmark = pytest.mark.slow  # every test runs a suite's ranks

FAULT_ENV = "HARNESS_STRICTNESS_FAULT"
REPO_ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 600

_SITECUSTOMIZE = f"""\
import os

from tests.faults import install_fault

install_fault(os.environ[{FAULT_ENV!r}])
"""


@dataclass(frozen=True)
class Run:
    """One suite run: ``fault`` (None: none) over ``targets``: (module, ``[Class.]method``)."""

    fault: Optional[str]
    targets: Tuple[Tuple[str, str], ...]
    reason: str = ""

    def patterns(self) -> List[str]:
        """unittest ``-k`` patterns naming each target by its full id (the module included)."""
        return [f"test_cases.{module}.*{test}*" for module, test in self.targets]


def _misc(*tests: str) -> Tuple[Tuple[str, str], ...]:
    return tuple(("test_misc", test) for test in tests)


# Every suite test that claims training parity with DDP or with an unsharded reference: each
# compares gradients after every backward, so a wrongly scaled gradient fails it.
_GRADIENT_PARITY_TESTS: Tuple[Tuple[str, str], ...] = (
    ("test_fine_tune", "test_parity_with_ddp"),
    ("test_fine_tune", "test_parity_with_non_frozen_fsdp"),
    ("test_fine_tune", "test_hooks_multi_traversal"),
    ("test_fully_shard_frozen", "test_train_mixed_requires_grad_per_group"),
    ("test_fully_shard_frozen", "test_train_mixed_requires_grad_across_groups"),
    ("test_fully_shard_frozen", "test_multi_forward_mixed_requires_grad"),
) + _misc(
    "TestFSDPMiscMultiProcess.test_fsdp_cpu_training",
    "TestFSDPMiscMultiProcess.test_fsdp_not_all_outputs_used_in_loss",
)

# Keyed by the name of the test that checks the run; tests run in sorted order, which is the
# order runs are started in.
RUNS: Dict[str, Run] = {
    "control_selected_tests_pass_without_fault": Run(
        None,
        _misc(
            "TestFSDPMiscMultiProcess.test_fsdp_not_all_outputs_used_in_loss",
            "TestFSDPMiscMultiThread.test_fsdp_namedtuple",
            "TestFSDPMiscWorldSize1.test_unsafe_setattr",
        )
        + (("test_exec_order", "test_invalid_first_iter_order"),)
        + _GRADIENT_PARITY_TESTS,
    ),
    "fsdp1_gradient_sum_not_mean": Run(
        "fsdp1_gradient_sum_not_mean",
        _misc(
            "TestFSDPMiscMultiProcess.test_fsdp_cpu_training",
            "TestFSDPMiscMultiProcess.test_fsdp_not_all_outputs_used_in_loss",
        ),
        "not close",
    ),
    "fsdp1_gradient_not_reduced": Run(
        "fsdp1_gradient_not_reduced",
        _misc(
            "TestFSDPMiscMultiProcess.test_fsdp_cpu_training",
            "TestFSDPMiscMultiProcess.test_fsdp_not_all_outputs_used_in_loss",
        ),
        "not close",
    ),
    "no_sync_module_states": Run(
        "no_sync_module_states",
        _misc("TestFSDPMiscMultiProcess.test_cpu_init_with_sync_module_states"),
        "ValueError not raised",
    ),
    "no_homogeneous_check": Run(
        "no_homogeneous_check",
        _misc("TestFSDPMiscMultiThread.test_homogeneous_attributes"),
        "ValueError not raised",
    ),
    "no_pre_backward_hooks": Run(
        "no_pre_backward_hooks",
        _misc("TestFSDPMiscMultiThread.test_fsdp_namedtuple"),
        "AssertionError not raised",  # upstream's assertNotEqual message, word for word
    ),
    "ignored_modules_not_ignored": Run(
        "ignored_modules_not_ignored",
        _misc(
            "TestFSDPMiscMultiThread.test_fsdp_device_id_no_move_ignored_params_and_bufs",
            "TestFSDPMiscMultiThread.test_fsdp_ignored_module_meta",
        ),
        "device(type='meta') != device(type='cpu')",
    ),
    "unsafe_setattr_env_ignored": Run(
        "unsafe_setattr_env_ignored",
        _misc("TestFSDPMiscWorldSize1.test_unsafe_setattr"),
        "True is not false",
    ),
    "reduce_scatter_not_reduced": Run(
        "reduce_scatter_not_reduced",
        (
            ("test_fine_tune", "test_parity_with_ddp"),
            ("test_fully_shard_frozen", "test_multi_forward_mixed_requires_grad"),
            ("test_fully_shard_frozen", "test_train_mixed_requires_grad_per_group"),
        ),
        "not close",
    ),
    "reduce_scatter_sum_not_mean": Run(
        "reduce_scatter_sum_not_mean",
        (("test_fully_shard_frozen", "test_train_mixed_requires_grad_across_groups"),),
        "not close",
    ),
    "gradient_reduction_scaled": Run(
        "gradient_reduction_scaled", _GRADIENT_PARITY_TESTS, "not close"
    ),
    "no_exec_order_check": Run(
        "no_exec_order_check",
        (
            ("test_exec_order", "test_invalid_first_iter_order"),
            ("test_exec_order", "test_invalid_later_iter_order"),
        ),
        "not raised",
    ),
    "frozen_not_resharded_in_backward": Run(
        "frozen_not_resharded_in_backward",
        (("test_fine_tune", "test_backward_reshard_hooks"),),
        "AssertionError",
    ),
    "post_backward_outside_autograd": Run(
        "post_backward_outside_autograd",
        (("test_fully_shard_frozen", "test_train_mixed_requires_grad_per_group"),),
        "not greater than or equal to",
    ),
    "checkpoint_load_noop": Run(
        "checkpoint_load_noop",
        (("test_checkpoint_fine_tuning", "test_fine_tuning"),),
        "not close",
    ),
}

_RAN = re.compile(r"(?m)^\w+ \((test_cases\.[\w.]+)\)")
_FAILED = re.compile(r"(FAIL|ERROR): \w+ \((test_cases\.[\w.]+)\)")


@dataclass
class Result:
    """What a finished run reported: exit code, output, the ids run and each failure's text."""

    returncode: int
    output: str
    ran: List[str]
    failures: Dict[str, str]

    @classmethod
    def parse(cls, returncode: int, output: str) -> Result:
        failures: Dict[str, str] = {}
        for section in re.split(r"(?m)^={70}$", output)[1:]:
            header = _FAILED.match(section.lstrip("\n"))
            if header:
                failures[header.group(2)] = failures.get(header.group(2), "") + section
        return cls(returncode, output, _RAN.findall(output), failures)


class _Started:
    """A run in progress: its process (a session of its own) and the file its output goes to."""

    def __init__(self, run: Run, site_dir: str) -> None:
        env = dict(os.environ)
        env.pop(FAULT_ENV, None)
        if run.fault is not None:
            env[FAULT_ENV] = run.fault
        paths = [site_dir] if run.fault is not None else []
        env["PYTHONPATH"] = os.pathsep.join(
            [*paths, str(REPO_ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
        )
        modules = sorted({f"test_cases.{module}" for module, _ in run.targets})
        self._log = tempfile.TemporaryFile(mode="w+")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "unittest", "-v", *modules,
             *(f"-k{pattern}" for pattern in run.patterns())],
            cwd=REPO_ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def result(self) -> Result:
        try:
            returncode = self._process.wait(RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            returncode = self._process.returncode
        self._log.seek(0)
        output = self._log.read()
        self._log.close()
        return Result.parse(returncode, output)

    def kill(self) -> None:
        """End the run with everything it started (runner, forkserver, ranks)."""
        if self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()
        self._log.close()


class _Runs:
    """Starts each run once, the next one (in test order) as soon as one is asked for."""

    def __init__(self) -> None:
        self._site_dir = tempfile.mkdtemp(prefix="strictness_")
        Path(self._site_dir, "sitecustomize.py").write_text(_SITECUSTOMIZE)
        self._started: Dict[str, _Started] = {}
        self._order = sorted(RUNS)

    def _start(self, name: str) -> _Started:
        if name not in self._started:
            self._started[name] = _Started(RUNS[name], self._site_dir)
        return self._started[name]

    def result(self, name: str) -> Result:
        started = self._start(name)
        following = self._order[self._order.index(name) + 1:]
        if following:
            self._start(following[0])
        return started.result()

    def close(self) -> None:
        for started in self._started.values():
            started.kill()
        shutil.rmtree(self._site_dir, ignore_errors=True)


_runs: Optional[_Runs] = None


def setUpModule() -> None:
    global _runs
    _runs = _Runs()


def tearDownModule() -> None:
    if _runs is not None:
        _runs.close()


class TestFSDPSuitesAreStrict(unittest.TestCase):
    """Each fault must make the suite tests that guard against it fail, for that reason."""

    def _result(self, name: str) -> Tuple[Run, Result]:
        assert _runs is not None, "setUpModule did not run"
        return RUNS[name], _runs.result(name)

    def _assert_fails(self, name: str) -> None:
        run, result = self._result(name)
        tail = f"\n{result.output[-3000:]}"
        self.assertNotEqual(0, result.returncode, f"{run.fault}: the suite passed{tail}")
        for pattern in run.patterns():
            failed = fnmatch.filter(result.failures, pattern)
            self.assertTrue(failed, f"{run.fault}: {pattern} did not fail{tail}")
        for module in {module for module, _ in run.targets}:
            reports = "".join(
                text for test, text in result.failures.items()
                if test.startswith(f"test_cases.{module}.")
            )
            self.assertIn(
                run.reason, reports, f"{run.fault}: {module} failed for another reason{tail}"
            )

    def test_control_selected_tests_pass_without_fault(self) -> None:
        run, result = self._result("control_selected_tests_pass_without_fault")
        self.assertEqual(0, result.returncode, result.output[-3000:])
        for pattern in run.patterns():
            self.assertTrue(fnmatch.filter(result.ran, pattern), f"{pattern} did not run")

    def test_fsdp1_gradient_sum_not_mean(self) -> None:
        # Adam's update is nearly invariant to the gradient's scale: test_fsdp_cpu_training
        # sees this only because it compares the gradients themselves.
        self._assert_fails("fsdp1_gradient_sum_not_mean")

    def test_fsdp1_gradient_not_reduced(self) -> None:
        self._assert_fails("fsdp1_gradient_not_reduced")

    def test_no_sync_module_states(self) -> None:
        self._assert_fails("no_sync_module_states")

    def test_no_homogeneous_check(self) -> None:
        self._assert_fails("no_homogeneous_check")

    def test_no_pre_backward_hooks(self) -> None:
        self._assert_fails("no_pre_backward_hooks")

    def test_ignored_modules_not_ignored(self) -> None:
        self._assert_fails("ignored_modules_not_ignored")

    def test_unsafe_setattr_env_ignored(self) -> None:
        self._assert_fails("unsafe_setattr_env_ignored")

    def test_reduce_scatter_not_reduced(self) -> None:
        self._assert_fails("reduce_scatter_not_reduced")

    def test_reduce_scatter_sum_not_mean(self) -> None:
        # Adam's update barely depends on the gradient's scale, so loss parity alone cannot
        # see this fault; check_sharded_parity compares the gradients themselves.
        self._assert_fails("reduce_scatter_sum_not_mean")

    def test_gradient_reduction_scaled(self) -> None:
        # Every parity test must see a constant scale of the reduced gradients, which Adam
        # hides from the losses.
        self._assert_fails("gradient_reduction_scaled")

    def test_no_exec_order_check(self) -> None:
        self._assert_fails("no_exec_order_check")

    def test_frozen_not_resharded_in_backward(self) -> None:
        self._assert_fails("frozen_not_resharded_in_backward")

    def test_post_backward_outside_autograd(self) -> None:
        self._assert_fails("post_backward_outside_autograd")

    def test_checkpoint_load_noop(self) -> None:
        self._assert_fails("checkpoint_load_noop")


if __name__ == "__main__":
    unittest.main()
