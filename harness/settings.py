"""THE settings module: every value the harness reads from the environment, and which device,
backend, world size, timeout and start method a test uses, and whether a launcher (torchrun)
started this process.

Every answer is read from the environment at call time, so `run_all.py --device cpu`
(which sets HARNESS_DEVICE) and a test that changes an env knob both take effect. One parser
per kind of value: `env_flag` (a HARNESS_* switch: 1/true/yes or 0/false/no, any case),
`upstream_flag` (upstream's own knobs, such as PYTORCH_TEST_WITH_*, with upstream's meaning),
`env_seconds` (a positive number of seconds; `is_positive_seconds` is the one rule, for
values that do not come from the environment too), `env_int` (counts, ranks, seeds),
`env_choice`, `env_text` and `env_list`; a bad value is a one-line `HarnessConfigError`
naming the variable and the value. Each rule has one function here: `rank_device`,
`backend_for`, `base_world_size` (a base's default; harness/requirements/world_size.py adds a
class's own and the accelerator gate), `test_timeout`, `torchrun_env`.
"""

from __future__ import annotations

import os
import unittest
from datetime import timedelta
from typing import Any, Dict, Optional, Tuple

import torch

from harness.compat import unittest_internals

DEVICE_ENV = "HARNESS_DEVICE"
WORLD_SIZE_ENV = "HARNESS_WORLD_SIZE"
TIMEOUT_ENV = "HARNESS_TIMEOUT"
START_METHOD_ENV = "HARNESS_START_METHOD"
ALLOW_CPU_ENV = "HARNESS_ALLOW_CPU"
DEBUG_RANK_ENV = "HARNESS_DEBUG_RANK"
SHOW_OUTPUT_ENV = "HARNESS_SHOW_OUTPUT"
LAUNCHED_ENV = "HARNESS_LAUNCHED"
UPSTREAM_TIMEOUT_ENV = "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"
CORE_BUDGET_ENV = "HARNESS_CORE_BUDGET"  # set by -j: the cores one running test may use

DEVICE_CHOICES = ("cpu", "cuda")
START_METHODS = ("forkserver", "spawn")
DEFAULT_TIMEOUT_S = 300.0
DEBUG_TIMEOUT_S = 7 * 24 * 3600.0  # `--debug-rank`: the timeout waits for the person debugging
DEFAULT_CPU_WORLD_SIZE = 2
DEFAULT_WORLD_SIZE = 4  # upstream's for the bases that do not follow the device count
# torch's default collective backend of each accelerator type (`backend_for`); gloo otherwise
ACCELERATOR_BACKEND = {"cuda": "nccl", "xpu": "xccl", "hpu": "hccl"}
ACCELERATOR_BACKENDS = tuple(ACCELERATOR_BACKEND.values())
# torchrun's own variables (its agent sets them for every worker): RANK/WORLD_SIZE/MASTER_ADDR
# alone are also left behind by pods, env:// tests and other launchers.
TORCHRUN_ENV = ("TORCHELASTIC_RUN_ID", "GROUP_RANK", "LOCAL_WORLD_SIZE")

# Upstream's per-test timeouts (common_distributed.TIMEOUT_OVERRIDE): test method name ->
# seconds. A module-level dict, as upstream's, that a test file may fill.
TIMEOUT_OVERRIDE: Dict[str, float] = {
    "test_ddp_uneven_inputs": 400,
    "test_DistributedDataParallel": 500,
}


class HarnessConfigError(ValueError):
    """A harness setting (usually an env knob) has a value the harness cannot use."""


# ------------------------------------------------------------------ one parser per kind of value

FLAG_ON = ("1", "true", "yes")
FLAG_OFF = ("0", "false", "no")


def env_text(name: str, default: str = "") -> str:
    """A variable's text as set (`default` when unset): for the knobs whose value is a name or
    a path, and for upstream's knobs that are read as text (CI, TW_JOB_USER)."""
    return os.environ.get(name, default)


def env_list(name: str) -> Tuple[str, ...]:
    """A comma-separated list (PYTORCH_TESTING_DEVICE_ONLY_FOR=cuda,cpu); empty when unset."""
    value = env_text(name)
    return tuple(value.split(",")) if value else ()


def env_flag(name: str, default: bool = False) -> bool:
    """THE reading of a HARNESS_* switch: 1, true or yes turn it on, 0, false or no off (in
    any case); unset or empty, `default`; any other value is a HarnessConfigError naming the
    variable and the value."""
    value = env_text(name)
    if value == "":
        return default
    word = value.strip().lower()
    if word in FLAG_ON:
        return True
    if word in FLAG_OFF:
        return False
    raise HarnessConfigError(
        f"{name}={value!r} is not a switch: use 1, true or yes (on), 0, false or no (off)"
    )


def upstream_flag(name: str, default: bool = False) -> bool:
    """An upstream knob (PYTORCH_TEST_WITH_ROCM, PYTORCH_TEST_WITH_DYNAMO, ...) with upstream's
    meaning (common_utils' TestEnvironment.def_flag): off by default, on only when set to "1";
    on by default, off only when set to "0". Any other value is not an error, as upstream."""
    value = os.environ.get(name)
    return value != "0" if default else value == "1"


def env_choice(name: str, choices: Tuple[str, ...]) -> Optional[str]:
    """One of `choices`, or None when unset or empty (HarnessConfigError for anything else)."""
    value = env_text(name)
    if value == "":
        return None
    if value not in choices:
        raise HarnessConfigError(f"{name}={value!r} is not one of: {', '.join(choices)}")
    return value


def env_int(name: str, minimum: Optional[int] = None) -> Optional[int]:
    """A whole number (a count: world size, cores; a rank; a seed), at least `minimum` when one
    is given; None when unset or empty."""
    value = env_text(name)
    if value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        raise HarnessConfigError(f"{name}={value!r} is not a whole number") from None
    if minimum is not None and number < minimum:
        raise HarnessConfigError(f"{name}={value!r} must be at least {minimum}")
    return number


def is_positive_seconds(value: Any) -> bool:
    """THE rule for a number of seconds (a timeout, a marker's, a class's, an env knob's): a
    positive int or float, not a bool and not NaN."""
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and value > 0 and value == value)


def positive_seconds(value: Any, what: str) -> float:
    """`value` as seconds, or a one-line HarnessConfigError naming `what` (`Case.timeout`)."""
    if not is_positive_seconds(value):
        raise HarnessConfigError(f"{what} must be a positive number of seconds, got {value!r}")
    return float(value)


def env_seconds(name: str, zero_ok: bool = False) -> Optional[float]:
    """A positive number of seconds (also 0 when `zero_ok`); None when unset or empty."""
    value = env_text(name)
    if value == "":
        return None
    try:
        number = float(value)
    except ValueError:
        number = None
    if number is None or not (is_positive_seconds(number) or (zero_ok and number == 0)):
        kind = "number of seconds >= 0" if zero_ok else "positive number of seconds"
        raise HarnessConfigError(f"{name}={value!r} is not a {kind}")
    return number


# ------------------------------------------------------------------ upstream's module state


def _upstream_timeout_default() -> int:
    """Upstream's `common_distributed.TIMEOUT_DEFAULT` as it is at import: the environment's
    seconds, else 300 (a bad value is reported by `default_timeout()` when a test runs)."""
    try:
        return int(env_text(UPSTREAM_TIMEOUT_ENV) or DEFAULT_TIMEOUT_S)
    except ValueError:
        return int(DEFAULT_TIMEOUT_S)


# Upstream's `common_distributed.TIMEOUT_DEFAULT`, module state a client may set
# (`common_distributed.TIMEOUT_DEFAULT = 1800` reaches here through `harness`): read when a
# test starts, as upstream reads it.
TIMEOUT_DEFAULT: float = _upstream_timeout_default()
_TIMEOUT_DEFAULT_AT_IMPORT = TIMEOUT_DEFAULT


# Upstream's common_cuda flags, read once at import as upstream does; HARNESS_DEVICE=cpu
# turns them off, since the harness then runs everything on CPU.
TEST_CUDA = torch.cuda.is_available() and env_text(DEVICE_ENV) != "cpu"
TEST_MULTIGPU = TEST_CUDA and torch.cuda.device_count() >= 2


# ------------------------------------------------------------------ the rules


def accelerator_count() -> int:
    """CUDA devices the harness may use: none when HARNESS_DEVICE=cpu forces CPU."""
    forced = env_choice(DEVICE_ENV, DEVICE_CHOICES)
    if forced == "cpu":
        return 0
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if forced == "cuda" and count == 0:
        raise HarnessConfigError(f"{DEVICE_ENV}='cuda' but no CUDA device is available")
    return count


def allow_cpu() -> bool:
    """Whether HARNESS_ALLOW_CPU=1 asks to run accelerator-written tests on CPU (off by default)."""
    return env_flag(ALLOW_CPU_ENV)


def device_type() -> str:
    """"cuda" when accelerators are present (and not forced off), else "cpu"."""
    return "cuda" if accelerator_count() > 0 else "cpu"


def backend_for(device: Any) -> str:
    """THE collective backend of a device (a type, "cuda:1" or a torch.device): torch's default
    for an accelerator type (nccl on CUDA, xccl on XPU, hccl on HPU), gloo for anything else,
    as upstream's DistributedTestBase.backend."""
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        raise HarnessConfigError(
            f"unknown device {device!r}; expected e.g. cpu, cuda, cuda:0"
        ) from None
    return ACCELERATOR_BACKEND.get(kind, "gloo")


def rank_device(rank: int) -> torch.device:
    """The device a rank computes on: its own GPU, or the CPU."""
    count = accelerator_count()
    if count > 0:
        return torch.device("cuda", rank % count)
    return torch.device("cpu")


def configured_world_size() -> Optional[int]:
    """HARNESS_WORLD_SIZE, or None when unset."""
    return env_int(WORLD_SIZE_ENV, 1)


def default_world_size() -> int:
    """The world size a suite picks when it adapts to the machine: HARNESS_WORLD_SIZE, else one
    rank per GPU, else 2 CPU ranks (a helper for suites; the bases' defaults are upstream's,
    `base_world_size`)."""
    return configured_world_size() or accelerator_count() or DEFAULT_CPU_WORLD_SIZE


def base_world_size(per_device: bool = False, launched: bool = False) -> int:
    """A base's world size where its class sets none: for a base whose ranks are the processes
    torchrun launched (`launched`), their number; else HARNESS_WORLD_SIZE; else upstream's
    default: one rank per device for the FSDP and shared-process bases (`per_device`: the
    accelerator count, 1 without one), 4 for the others."""
    if launched:
        found = torchrun_env()
        if found is not None:
            return found[1]
    configured = configured_world_size()
    if configured is not None:
        return configured
    return (accelerator_count() or 1) if per_device else DEFAULT_WORLD_SIZE


def default_timeout() -> float:
    """A test's time limit in seconds where nothing more specific is set: HARNESS_TIMEOUT when
    the run sets it and the file has set TIMEOUT_DEFAULT (a run's choice wins, as HARNESS_SEED
    wins over a file's SEED); else TIMEOUT_DEFAULT as the file set it; else upstream's
    DISTRIBUTED_TESTS_DEFAULT_TIMEOUT, else HARNESS_TIMEOUT, else 300."""
    upstream = env_seconds(UPSTREAM_TIMEOUT_ENV)
    harness = env_seconds(TIMEOUT_ENV)
    if TIMEOUT_DEFAULT != _TIMEOUT_DEFAULT_AT_IMPORT:
        return float(harness if harness is not None else TIMEOUT_DEFAULT)
    for timeout in (upstream, harness):
        if timeout is not None:
            return float(timeout)
    return DEFAULT_TIMEOUT_S


def test_timeout(case: Any) -> float:
    """THE wall-clock limit of a multi-rank test, in seconds: TIMEOUT_OVERRIDE[its method name]
    (upstream's), else its class's `timeout` when that is a number of seconds, else
    `default_timeout()`; at most the case's `timeout_cap`; a week under `--debug-rank`. A
    `timedelta` timeout (upstream's shared-process classes) is the process group's timeout,
    not the test's limit."""
    if debug_rank() is not None:  # `--debug-rank`: a person steps through a rank; wait for them
        return DEBUG_TIMEOUT_S
    override = TIMEOUT_OVERRIDE.get(unittest_internals.method_name(case))
    declared = getattr(case, "timeout", None)
    if override is not None:
        timeout = float(override)
    elif isinstance(declared, (int, float)) and not isinstance(declared, bool):
        timeout = float(declared)
    else:
        timeout = default_timeout()
    # A runner that must see the harness's report before its own limit (pytest-timeout's)
    # caps it (harness/launch/ranked_case.py, RankedTestCase.deadline).
    cap = getattr(case, "timeout_cap", None)
    return timeout if cap is None else min(timeout, cap)


class DefaultTimeout:
    """Class attribute `timeout` of the multi-rank bases: default_timeout(), read when used."""

    def __get__(self, obj: Any, owner: Any = None) -> float:
        return default_timeout()


def checked_rank_settings(case: Any, world_size: Any) -> Tuple[int, float]:
    """A multi-rank case's (world_size, timeout) for `world_size` ranks, or a one-line error
    naming the bad one.

    A world size of 0 (typically computed from an accelerator count on a machine without
    one) is a skip saying why, not an error and not a pass: there is nothing to run.
    """
    name = type(case).__name__
    if world_size == 0 and isinstance(world_size, int) and not isinstance(world_size, bool):
        raise unittest.SkipTest(
            f"{name}.world_size is 0: no ranks to start "
            f"({accelerator_count()} accelerators found)"
        )
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise HarnessConfigError(f"{name}.world_size must be a positive int, got {world_size!r}")
    declared = getattr(case, "timeout", None)
    if not isinstance(declared, timedelta):
        positive_seconds(declared, f"{name}.timeout")
    override = TIMEOUT_OVERRIDE.get(unittest_internals.method_name(case))
    if override is not None:
        positive_seconds(override, f"TIMEOUT_OVERRIDE[{unittest_internals.method_name(case)!r}]")
    return world_size, test_timeout(case)


def debug_rank() -> Optional[int]:
    """The rank given the terminal for a debugger (`--debug-rank N`), else None."""
    return env_int(DEBUG_RANK_ENV, 0)


def show_output() -> bool:
    """HARNESS_SHOW_OUTPUT: ranks' output (their warnings too) shown live, not only on failure."""
    return env_flag(SHOW_OUTPUT_ENV)


def start_method() -> str:
    """How rank processes start: a preloaded forkserver (fast) or spawn (fallback)."""
    return env_choice(START_METHOD_ENV, START_METHODS) or "forkserver"


def torchrun_env() -> Optional[Tuple[int, int]]:
    """THE launch detection: (rank, world_size) when a launcher started this process as one
    rank, else None. Launched means torchrun's own variables are set (TORCHELASTIC_RUN_ID,
    GROUP_RANK, LOCAL_WORLD_SIZE, with RANK, WORLD_SIZE and MASTER_ADDR), or HARNESS_LAUNCHED=1
    for a launcher that sets only RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. Those four
    alone are often left behind (a pod, an earlier env:// test): they change nothing."""
    opt_in = env_flag(LAUNCHED_ENV)
    by_torchrun = all(env_text(name) for name in TORCHRUN_ENV)
    if not (by_torchrun or opt_in):
        return None
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR") if not env_text(k)]
    if missing:
        if opt_in:
            raise HarnessConfigError(
                f"{LAUNCHED_ENV}={env_text(LAUNCHED_ENV)} but {', '.join(missing)} unset"
            )
        return None
    try:
        return int(env_text("RANK")), int(env_text("WORLD_SIZE"))
    except ValueError:
        raise HarnessConfigError(
            f"RANK={env_text('RANK')!r} and WORLD_SIZE={env_text('WORLD_SIZE')!r} "
            "must be integers"
        ) from None


def machine_cores() -> int:
    """The cores this process may run on."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return cores or 1


def core_budget() -> int:
    """The cores this process's tests may use: CORE_BUDGET_ENV (set by `-j` for each worker's
    test, its share of the machine), else the machine's."""
    return env_int(CORE_BUDGET_ENV, 1) or machine_cores()


def intra_op_threads(world_size: int) -> int:
    """Threads one rank may use so that world_size ranks share the cores without oversubscribing."""
    return max(1, core_budget() // max(1, world_size))
