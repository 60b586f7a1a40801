"""Which device, backend, world size, timeout and start method a test uses.

Every answer is read from the environment at call time, so `run_all.py --device cpu`
(which sets HARNESS_DEVICE) and a test that changes an env knob both take effect.
"""

from __future__ import annotations

import os
import unittest
from typing import Any, Optional, Tuple

import torch

DEVICE_ENV = "HARNESS_DEVICE"
WORLD_SIZE_ENV = "HARNESS_WORLD_SIZE"
TIMEOUT_ENV = "HARNESS_TIMEOUT"
START_METHOD_ENV = "HARNESS_START_METHOD"
ALLOW_CPU_ENV = "HARNESS_ALLOW_CPU"
DEBUG_RANK_ENV = "HARNESS_DEBUG_RANK"

DEVICE_CHOICES = ("cpu", "cuda")
START_METHODS = ("forkserver", "spawn")
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_CPU_WORLD_SIZE = 2


# Upstream's common_cuda flags, read once at import as upstream does; HARNESS_DEVICE=cpu
# turns them off, since the harness then runs everything on CPU.
TEST_CUDA = torch.cuda.is_available() and os.environ.get(DEVICE_ENV) != "cpu"
TEST_MULTIGPU = TEST_CUDA and torch.cuda.device_count() >= 2


class HarnessConfigError(ValueError):
    """A harness setting (usually an env knob) has a value the harness cannot use."""


def _env_choice(name: str, choices: Tuple[str, ...]) -> Optional[str]:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    if value not in choices:
        raise HarnessConfigError(f"{name}={value!r} is not one of: {', '.join(choices)}")
    return value


def _env_number(name: str, kind: type, minimum: float) -> Optional[float]:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        number = kind(value)
    except ValueError:
        raise HarnessConfigError(f"{name}={value!r} is not a {kind.__name__}") from None
    if number < minimum:
        raise HarnessConfigError(f"{name}={value!r} must be at least {minimum}")
    return number


def accelerator_count() -> int:
    """CUDA devices the harness may use: none when HARNESS_DEVICE=cpu forces CPU."""
    forced = _env_choice(DEVICE_ENV, DEVICE_CHOICES)
    if forced == "cpu":
        return 0
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if forced == "cuda" and count == 0:
        raise HarnessConfigError(f"{DEVICE_ENV}='cuda' but no CUDA device is available")
    return count


def allow_cpu() -> bool:
    """Whether HARNESS_ALLOW_CPU=1 asks to run accelerator-written tests on CPU (off by default)."""
    value = os.environ.get(ALLOW_CPU_ENV, "")
    if value not in ("", "0", "1"):
        raise HarnessConfigError(f"{ALLOW_CPU_ENV}={value!r} must be 1 (on) or 0 (off)")
    return value == "1"


def cpu_stands_in() -> bool:
    """Whether the CPU stands in for the accelerators tests ask for: the switch is on and
    this machine has none (with accelerators present the switch changes nothing)."""
    return allow_cpu() and accelerator_count() == 0


def device_type() -> str:
    """"cuda" when accelerators are present (and not forced off), else "cpu"."""
    return "cuda" if accelerator_count() > 0 else "cpu"


def backend_for(device: str) -> str:
    """The collective backend for a device type: nccl on CUDA, gloo on CPU."""
    if device not in DEVICE_CHOICES:
        raise HarnessConfigError(f"unknown device type {device!r}; expected one of: cpu, cuda")
    return "nccl" if device == "cuda" else "gloo"


def rank_device(rank: int) -> torch.device:
    """The device a rank computes on: its own GPU, or the CPU."""
    count = accelerator_count()
    if count > 0:
        return torch.device("cuda", rank % count)
    return torch.device("cpu")


def default_world_size() -> int:
    """HARNESS_WORLD_SIZE, else one rank per GPU, else 2 CPU ranks."""
    size = _env_number(WORLD_SIZE_ENV, int, 1)
    if size is not None:
        return int(size)
    return accelerator_count() or DEFAULT_CPU_WORLD_SIZE


def default_timeout() -> float:
    """Per-test timeout in seconds: HARNESS_TIMEOUT, else 300."""
    timeout = _env_number(TIMEOUT_ENV, float, 0.001)
    return DEFAULT_TIMEOUT_S if timeout is None else float(timeout)


class DefaultTimeout:
    """Class attribute `timeout` of the multi-rank bases: default_timeout(), read when used."""

    def __get__(self, obj: Any, owner: Any = None) -> float:
        return default_timeout()


def checked_rank_settings(case: Any) -> Tuple[int, float]:
    """A multi-rank case's (world_size, timeout), or a one-line error naming the bad one.

    A world size of 0 (typically computed from an accelerator count on a machine without
    one) is a skip saying why, not an error and not a pass: there is nothing to run.
    """
    name = type(case).__name__
    world_size, timeout = case.world_size, case.timeout
    if world_size == 0 and isinstance(world_size, int) and not isinstance(world_size, bool):
        raise unittest.SkipTest(
            f"{name}.world_size is 0: no ranks to start "
            f"({accelerator_count()} accelerators found)"
        )
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise HarnessConfigError(f"{name}.world_size must be a positive int, got {world_size!r}")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise HarnessConfigError(
            f"{name}.timeout must be a positive number of seconds, got {timeout!r}"
        )
    return world_size, timeout


def debug_rank() -> Optional[int]:
    """The rank given the terminal for a debugger (`--debug-rank N`), else None."""
    rank = _env_number(DEBUG_RANK_ENV, int, 0)
    return None if rank is None else int(rank)


def start_method() -> str:
    """How rank processes start: a preloaded forkserver (fast) or spawn (fallback)."""
    return _env_choice(START_METHOD_ENV, START_METHODS) or "forkserver"


def torchrun_env() -> Optional[Tuple[int, int]]:
    """(rank, world_size) when this process was launched by torchrun, else None."""
    if not all(os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR")):
        return None
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except ValueError:
        raise HarnessConfigError(
            f"RANK={os.environ['RANK']!r} and WORLD_SIZE={os.environ['WORLD_SIZE']!r} "
            "must be integers"
        ) from None


def intra_op_threads(world_size: int) -> int:
    """Threads one rank may use so that world_size ranks share the cores without oversubscribing."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(1, world_size))
