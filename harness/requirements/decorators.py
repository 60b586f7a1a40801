"""The requirement and skip decorators upstream test files use, decided before any rank starts.

Accelerator requirements (`skip_if_lt_x_gpu`, `skip_if_no_gpu`,
`requires_accelerator_dist_backend`, `at_least_x_gpu`; `requires_nccl` in platform.py) are
recorded on the test function or class; the bases call `check_case_requirements` in
`setUp`, so a skipped test costs no process or thread (a rank that skips anyway exits with
one of upstream's codes, skip_codes.py). Whether the accelerators are enough, or the CPU may
stand in for them, is decided by `cpu_stands_in_for` and `accelerators_suffice` alone, for
these decorators and for the pytest marker's placement (harness/pytest_plugin/marker.py):
the CPU stands in only on a machine without any accelerator, for a test that allows it
(`allow_cpu=True`, or HARNESS_ALLOW_CPU=1 for every test); with some accelerators, but too
few, the test skips.
"""

from __future__ import annotations

import functools
import unittest
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from harness import settings
from harness.compat import unittest_internals
from harness.requirements.skip_codes import TEST_SKIPS

TEST_WITH_DEV_DBG_ASAN = settings.upstream_flag("PYTORCH_TEST_WITH_DEV_DBG_ASAN")
# As upstream: a ROCm build of torch, or PYTORCH_TEST_WITH_ROCM=1.
TEST_WITH_ROCM = settings.upstream_flag("PYTORCH_TEST_WITH_ROCM") or torch.version.hip is not None
# Meta's internal build; outside it only the upstream variable can turn it on.
IS_FBCODE = settings.upstream_flag("PYTORCH_TEST_FBCODE")
TEST_HPU = bool(hasattr(torch, "hpu") and torch.hpu.is_available())
TEST_XPU = bool(hasattr(torch, "xpu") and torch.xpu.is_available())

REQUIREMENTS_ATTR = "__harness_requires__"
PER_RANK = -1  # AcceleratorRequirement.count: one accelerator for each rank of the test


def _backend_compiled(backend: str) -> bool:
    checks = {
        "nccl": dist.is_nccl_available,
        "xccl": getattr(dist, "is_xccl_available", lambda: False),
        "hccl": lambda: TEST_HPU,
    }
    return checks.get(backend, lambda: False)()


def cpu_stands_in_for(found: int, allowed: bool) -> bool:
    """THE rule for "may the CPU stand in for the accelerators a test asks for": only on a
    machine with no accelerator at all (`found` == 0), and only when `allowed` (the test's
    own allow_cpu=True, or HARNESS_ALLOW_CPU=1). With some accelerators, but fewer than the
    test asks for, it never does: the test skips. Pure, so that the decorators here and the
    pytest marker's placement ask the same question of the same numbers."""
    return found == 0 and allowed


def cpu_stands_in() -> bool:
    """Whether the CPU stands in on this machine, now, for every test (HARNESS_ALLOW_CPU=1
    and no accelerator): the process-wide CPU analogs (harness/compat/cpu_defaults.py) and
    device-type classes ask this."""
    return cpu_stands_in_for(settings.accelerator_count(), settings.allow_cpu())


def accelerators_suffice(count: int, backends: Sequence[str] = (), allow_cpu: bool = False) -> bool:
    """THE rule for every accelerator requirement: is it met on this machine, now?

    Met when at least `count` accelerators exist and (if `backends` are named) one of those
    accelerator communication backends is compiled in, or when the CPU stands in
    (`cpu_stands_in_for`: no accelerator at all, and the test's own `allow_cpu` or
    HARNESS_ALLOW_CPU=1; the test then runs on CPU with gloo, with at least `count` ranks:
    harness/requirements/world_size.py).
    """
    found = settings.accelerator_count()
    if cpu_stands_in_for(found, allow_cpu or settings.allow_cpu()):
        return True
    return found >= count and (not backends or any(_backend_compiled(b) for b in backends))


def _count_message(count: int) -> str:
    key = f"multi-gpu-{count}"
    if key in TEST_SKIPS:
        return TEST_SKIPS[key].message
    return f"Need at least {count} CUDA devices"


class AcceleratorRequirement(NamedTuple):
    """What a decorator asks of the machine; `accelerators_suffice` says whether it is met.

    `count` is the number of accelerators (PER_RANK: one per rank of the test), `backends`
    the accelerator communication backends of which one must be compiled in, and `message`
    upstream's skip message for a backend requirement (count messages are built here).
    """

    count: int
    allow_cpu: bool = False
    backends: Tuple[str, ...] = ()
    message: str = ""

    def unmet_reason(self, world_size: Any = None) -> Optional[str]:
        """None when met here, else the skip reason (upstream's message first)."""
        count = self.count
        if count == PER_RANK:
            if isinstance(world_size, bool) or not isinstance(world_size, int):
                return None  # no world size to check: checked_rank_settings reports a bad one
            count = world_size
        if accelerators_suffice(count, self.backends, self.allow_cpu):
            return None
        if self.message:
            return self.message
        found = settings.accelerator_count()
        if self.count == PER_RANK and found == 0:
            return (
                f"{TEST_SKIPS['no_cuda'].message} This test needs one accelerator for each of "
                f"its {count} ranks and none is available"
            )
        if found == 0:
            return f"{_count_message(count)}: this test needs an accelerator and none is available"
        return f"{_count_message(count)}, found {found}"


def _world_size_of(args: Sequence[Any]) -> Any:
    """The world size a decorated test method runs with: its case's, else WORLD_SIZE, else 1."""
    if args and hasattr(args[0], "world_size"):
        return args[0].world_size
    world_size = settings.env_int("WORLD_SIZE")
    return 1 if world_size is None else world_size


def requires(requirement: AcceleratorRequirement) -> Callable[[Any], Any]:
    """Record `requirement` on a test function or class; a function also checks it when called."""

    def decorator(target: Any) -> Any:
        recorded = [*getattr(target, REQUIREMENTS_ATTR, []), requirement]
        if isinstance(target, type):
            setattr(target, REQUIREMENTS_ATTR, recorded)
            return target

        @functools.wraps(target)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            reason = requirement.unmet_reason(_world_size_of(args))
            if reason is not None:
                raise unittest.SkipTest(reason)
            return target(*args, **kwargs)

        setattr(wrapper, REQUIREMENTS_ATTR, recorded)
        return wrapper

    return decorator


def skip_if_lt_x_gpu(n: int, *, allow_cpu: bool = False) -> Callable[[Any], Any]:
    """Skip unless `n` accelerators exist; with allow_cpu=True run on CPU where none exist."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"skip_if_lt_x_gpu: n must be a positive int, got {n!r}")
    return requires(AcceleratorRequirement(n, allow_cpu))


def skip_if_no_gpu(func: Callable) -> Callable:
    """Skip unless every rank of the test has an accelerator of its own (world_size of them)."""
    return requires(AcceleratorRequirement(PER_RANK))(func)


def at_least_x_gpu(x: int) -> bool:
    """Whether `x` accelerators are available here (for skipIf conditions and branches)."""
    return accelerators_suffice(x)


def requires_accelerator_dist_backend(
    backends: Optional[Sequence[str]] = None,
) -> Callable[[Any], Any]:
    """Skip unless one of `backends` (default: nccl, xccl, hccl) is available."""
    names = list(settings.ACCELERATOR_BACKENDS if backends is None else backends)
    return requires(AcceleratorRequirement(
        0, backends=tuple(names),
        message=f"No accelerator communication backend available among {names}",
    ))


def skip_but_pass_in_sandcastle_if(condition: bool, reason: str) -> Callable[[Any], Any]:
    """unittest.skipIf for functions and classes, decided when decorating.

    Upstream reports the test as passed inside Meta's Sandcastle CI; the harness never
    reports a skipped test as passed, so it skips everywhere.
    """

    def decorator(target: Any) -> Any:
        if condition:
            unittest_internals.mark_skipped(target, reason)
        return target

    return decorator


def requires_gloo() -> Callable[[Any], Any]:
    """Skip unless torch was built with the Gloo backend."""
    return skip_but_pass_in_sandcastle_if(
        not dist.is_gloo_available(), "c10d was not compiled with the Gloo backend"
    )


def lazy_skip_if(condition: Callable[[], bool], reason: str) -> Callable[[Any], Any]:
    """Skip a function when `condition()` holds at call time, a class when it holds now."""

    def decorator(target: Any) -> Any:
        if isinstance(target, type):
            return skip_but_pass_in_sandcastle_if(condition(), reason)(target)

        @functools.wraps(target)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if condition():
                raise unittest.SkipTest(reason)
            return target(*args, **kwargs)

        return wrapper

    return decorator


def skipIfRocm(  # noqa: N802 - upstream's name
    func: Optional[Callable] = None, *, msg: str = "test doesn't currently work on the ROCm stack"
) -> Any:
    """Skip on ROCm; usable bare (`@skipIfRocm`) or with a message (`@skipIfRocm(msg=...)`)."""
    decorator = lazy_skip_if(lambda: TEST_WITH_ROCM, f"skipIfRocm: {msg}")
    return decorator(func) if func is not None else decorator


def skipIfHpu(fn: Callable) -> Callable:  # noqa: N802 - upstream's name
    """Skip on Intel Gaudi (HPU) machines."""
    return lazy_skip_if(lambda: TEST_HPU, "test doesn't currently work with HPU")(fn)


def skip_if_rocm_multiprocess(func: Callable) -> Callable:
    """Skip a multi-rank test on ROCm, with upstream's skipIfRocm message."""
    return unittest.skipIf(TEST_WITH_ROCM, TEST_SKIPS["skipIfRocm"].message)(func)


def requirements_of(target: Any) -> List[AcceleratorRequirement]:
    return list(getattr(target, REQUIREMENTS_ATTR, []))


def check_requirements(test_method: Callable, world_size: Any = None) -> None:
    """Raise unittest.SkipTest with the reason if any requirement recorded on it is unmet."""
    for requirement in requirements_of(test_method):
        reason = requirement.unmet_reason(world_size)
        if reason is not None:
            raise unittest.SkipTest(reason)


def skips_before_it_starts(cls: type, method: Any) -> bool:
    """Whether a test `method` of `cls` is sure to skip before any rank starts: unittest's skip
    decorators on it or its class, or an accelerator requirement unmet here whatever the
    test's world size (a runner then need not start a forkserver for it)."""
    if unittest_internals.marked_skipped(cls) or unittest_internals.marked_skipped(method):
        return True
    return any(requirement.unmet_reason() is not None
               for requirement in _test_requirements(cls, method))


def _test_requirements(cls: type, method: Any) -> List[AcceleratorRequirement]:
    """A test's requirements: its class's, then its method's."""
    return requirements_of(cls) + requirements_of(method)


def _case_requirements(case: unittest.TestCase) -> List[AcceleratorRequirement]:
    return _test_requirements(type(case), getattr(case, unittest_internals.method_name(case), None))


def check_case_requirements(case: unittest.TestCase) -> None:
    """check_requirements for a case: its class's requirements, then its test method's.

    The case's world size is read only when a requirement is per rank. Called by the
    multi-rank bases before their ranks start: when the CPU stands in for accelerators, this
    process gets the CPU analogs of torch's accelerator defaults for the ranks it runs.
    """
    requirements = _case_requirements(case)
    per_rank = any(requirement.count == PER_RANK for requirement in requirements)
    world_size = getattr(case, "world_size", None) if per_rank else None
    for requirement in requirements:
        reason = requirement.unmet_reason(world_size)
        if reason is not None:
            raise unittest.SkipTest(reason)
    if cpu_stands_in():
        from harness.compat import (
            cpu_defaults as compat_cpu_defaults,  # torch's FSDP/DDP: only when needed
        )

        compat_cpu_defaults.PROCESS_ADAPTATIONS.install()


def cpu_allowed(case: unittest.TestCase) -> bool:
    """Whether `case` runs on CPU in place of accelerators (`cpu_stands_in_for`): none exists
    here, and HARNESS_ALLOW_CPU=1 or one of its requirements says `allow_cpu=True`."""
    found = settings.accelerator_count()
    if found > 0:  # the switches are not read: the CPU cannot stand in here
        return False
    allowed = settings.allow_cpu() or any(r.allow_cpu for r in _case_requirements(case))
    return cpu_stands_in_for(found, allowed)


def cpu_gate(case: unittest.TestCase) -> int:
    """The accelerator count `case`'s requirements ask for (`skip_if_lt_x_gpu(n)`: n) when
    the CPU stands in for them here; 0 when the case runs as written. The world size rule
    (harness/requirements/world_size.py) runs such a test with at least that many ranks."""
    if not cpu_allowed(case):
        return 0
    return max((r.count for r in _case_requirements(case) if r.count > 0), default=0)


def require_accelerator_per_rank(case: unittest.TestCase, world_size: int) -> None:
    """Skip before any rank starts when a base that gives each rank its own accelerator (FSDP's)
    has fewer accelerators than ranks, as upstream's FSDP ranks skip, CPU machines included;
    unless the CPU stands in for the accelerators (`cpu_allowed`)."""
    if cpu_allowed(case) or accelerators_suffice(world_size):
        return
    found = settings.accelerator_count()
    raise unittest.SkipTest(f"{_count_message(world_size)} ({found} found)")
