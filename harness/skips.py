"""Skip codes and decorators that decide before any rank starts.

`TEST_SKIPS` keeps the upstream names and exit codes, so a rank that exits with one of
these codes is reported as a skip with its message, as CI scripts written for
upstream expect. `skip_if_lt_x_gpu` records its requirement on the test function;
the multi-rank bases call `check_requirements` in `setUp`, so a skipped test costs no
process or thread.
"""

from __future__ import annotations

import functools
import os
import unittest
from typing import Any, Callable, List, NamedTuple

from harness import devices


class TestSkip(NamedTuple):
    exit_code: int
    message: str


TEST_SKIPS = {
    "backend_unavailable": TestSkip(72, "Skipped because distributed backend is not available."),
    "small_worldsize": TestSkip(73, "Skipped due to small world size."),
    "odd_worldsize": TestSkip(87, "Skipped due to odd world size."),
    "no_cuda": TestSkip(74, "CUDA is not available."),
    "multi-gpu-1": TestSkip(75, "Need at least 1 CUDA device"),
    "multi-gpu-2": TestSkip(77, "Need at least 2 CUDA devices"),
    "multi-gpu-3": TestSkip(80, "Need at least 3 CUDA devices"),
    "multi-gpu-4": TestSkip(81, "Need at least 4 CUDA devices"),
    "multi-gpu-5": TestSkip(82, "Need at least 5 CUDA devices"),
    "multi-gpu-6": TestSkip(83, "Need at least 6 CUDA devices"),
    "multi-gpu-7": TestSkip(84, "Need at least 7 CUDA devices"),
    "multi-gpu-8": TestSkip(85, "Need at least 8 CUDA devices"),
    "nccl": TestSkip(76, "c10d not compiled with NCCL support"),
    "skipIfRocm": TestSkip(78, "Test skipped for ROCm"),
    "no_peer_access": TestSkip(79, "Test skipped because no GPU peer access"),
    "generic": TestSkip(
        86, "Test skipped at subprocess level, look at subprocess log for skip reason"
    ),
    "importerror": TestSkip(88, "Test skipped due to missing import"),
    "no_accelerator": TestSkip(89, "accelerator is not available."),
}

SKIP_BY_EXIT_CODE = {skip.exit_code: skip for skip in TEST_SKIPS.values()}

TEST_WITH_DEV_DBG_ASAN = os.environ.get("PYTORCH_TEST_WITH_DEV_DBG_ASAN", "0") == "1"

REQUIREMENTS_ATTR = "__harness_requires__"


class GpuRequirement(NamedTuple):
    """At least `count` accelerators, or (with allow_cpu) none at all so the test runs on CPU."""

    count: int
    allow_cpu: bool

    def unmet_reason(self) -> str | None:
        found = devices.accelerator_count()
        if found >= self.count or (found == 0 and self.allow_cpu):
            return None
        key = f"multi-gpu-{self.count}"
        base = TEST_SKIPS[key].message if key in TEST_SKIPS else (
            f"Need at least {self.count} CUDA devices"
        )
        if found == 0:
            return f"{base}: this test needs an accelerator and none is available"
        return f"{base}, found {found}"


def skip_if_lt_x_gpu(n: int, *, allow_cpu: bool = False) -> Callable[[Callable], Callable]:
    """Skip unless `n` accelerators exist; with allow_cpu=True run on CPU where none exist."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"skip_if_lt_x_gpu: n must be a positive int, got {n!r}")
    requirement = GpuRequirement(n, allow_cpu)

    def decorator(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            reason = requirement.unmet_reason()
            if reason is not None:
                raise unittest.SkipTest(reason)
            return fn(*args, **kwargs)

        setattr(wrapper, REQUIREMENTS_ATTR, [*getattr(fn, REQUIREMENTS_ATTR, []), requirement])
        return wrapper

    return decorator


def requirements_of(test_method: Callable) -> List[GpuRequirement]:
    return list(getattr(test_method, REQUIREMENTS_ATTR, []))


def check_requirements(test_method: Callable) -> None:
    """Raise unittest.SkipTest with the reason if any recorded requirement is unmet."""
    for requirement in requirements_of(test_method):
        reason = requirement.unmet_reason()
        if reason is not None:
            raise unittest.SkipTest(reason)
