"""Upstream's skip and expected-failure decorators that ask about the platform: CUDA, NCCL
version, peer access, multicast, compute capability, ROCm architecture and version, XPU,
Windows, Triton, TorchDynamo (from common_utils, common_cuda, common_distributed,
inductor_utils, triton_utils).

Each asks the machine through one small function here (`cuda_available`, `nccl_version`,
`peer_access_ok`, ...), so that its logic for hardware this machine lacks can be tested by
patching that query. Reasons and conditions are upstream's; `skip_but_pass_in_sandcastle`
always skips (the harness never reports a skipped test as passed).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import unittest
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from harness import settings
from harness.compat import unittest_internals
from harness.requirements import flags
from harness.requirements.decorators import (
    TEST_SKIPS,
    TEST_XPU,
    AcceleratorRequirement,
    lazy_skip_if,
    requires,
    skip_but_pass_in_sandcastle_if,
)

__all__ = [
    "TEST_WITH_TORCHDYNAMO", "get_required_world_size", "import_transformers_or_skip",
    "require_n_gpus_for_nccl_backend", "requires_cuda", "requires_cuda_and_triton",
    "requires_cuda_p2p_access", "requires_gpu", "requires_multicast_support", "requires_nccl",
    "requires_nccl_shrink", "requires_nccl_version", "requires_triton", "requires_ucc",
    "requires_world_size", "runOnRocmArch", "skipIfRocmArch", "skipIfRocmVersionLessThan",
    "skipIfTorchDynamo", "skipIfXpu", "skip_but_pass_in_sandcastle",
    "skip_if_rocm_arch_multiprocess",
    "skip_if_rocm_ver_lessthan_multiprocess", "skip_if_win32", "sm_is_or_higher_than",
    "tf32_off", "with_nccl_blocking_wait", "with_tf32_off", "xfailIf", "xfailIfSM100OrLater",
    "xfailIfTorchDynamo",
]


TEST_WITH_TORCHDYNAMO = any(settings.upstream_flag(name) for name in (
    "PYTORCH_TEST_WITH_DYNAMO", "PYTORCH_TEST_WITH_INDUCTOR", "PYTORCH_TEST_WITH_AOT_EAGER"))

# ------------------------------------------------------------------ the machine's answers


def cuda_available() -> bool:
    return torch.cuda.is_available()


def cuda_device_count() -> int:
    return torch.cuda.device_count() if cuda_available() else 0


def nccl_version() -> Tuple[int, ...]:
    return tuple(torch.cuda.nccl.version())


def peer_access_ok() -> bool:
    """Every pair of CUDA devices can access each other, on sm80 or later, with 2 or more."""
    count = cuda_device_count()
    if count < 2 or torch.cuda.get_device_capability() < (8, 0):
        return False
    return all(torch.cuda.can_device_access_peer(i, j)
               for i in range(count - 1) for j in range(i + 1, count))


def multicast_supported() -> bool:
    if not cuda_available():
        return False
    from harness.compat.symmetric_memory import has_multicast_support

    return has_multicast_support(0)


def device_capability(device: torch.device) -> Tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def rocm_arch_name() -> str:
    return torch.cuda.get_device_properties(0).gcnArchName


# ------------------------------------------------------------------ common_utils


def xfailIf(condition: Any) -> Callable[[Callable], Callable]:  # noqa: N802 - upstream's name
    """unittest.expectedFailure when `condition` holds (decided when decorating)."""

    def decorator(func: Callable) -> Callable:
        return unittest.expectedFailure(func) if condition else func

    return decorator


def xfailIfTorchDynamo(func: Callable) -> Callable:  # noqa: N802 - upstream's name
    """Expected to fail when the suite runs under TorchDynamo (PYTORCH_TEST_WITH_DYNAMO=1)."""
    return unittest.expectedFailure(func) if TEST_WITH_TORCHDYNAMO else func


def skipIfTorchDynamo(  # noqa: N802 - upstream's name
    msg: str = "test doesn't currently work with dynamo",
) -> Callable[[Any], Any]:
    """Skip under TorchDynamo (PYTORCH_TEST_WITH_DYNAMO=1); called with a message, always."""
    if not isinstance(msg, str):
        raise AssertionError("Are you using skipIfTorchDynamo correctly?")
    return lazy_skip_if(lambda: TEST_WITH_TORCHDYNAMO, msg)


requires_cuda = unittest.skipUnless(torch.cuda.is_available(), "Requires CUDA")


def requires_cuda_p2p_access() -> Callable[[Any], Any]:
    """Skip unless 2+ CUDA devices of sm80 or later can all access each other's memory."""
    return skip_but_pass_in_sandcastle_if(
        not (cuda_available() and peer_access_ok()), "cuda p2p access is not available")


def skipIfRocmArch(arch: Tuple[str, ...]) -> Callable[[Any], Any]:  # noqa: N802 - upstream's
    """Skip on ROCm devices of one of the gfx architectures (MI300_ARCH, ...)."""
    return lazy_skip_if(lambda: flags.TEST_WITH_ROCM and _rocm_arch_in(arch),
                         f"skipIfRocm: test skipped on {arch}")


def runOnRocmArch(arch: Tuple[str, ...]) -> Callable[[Callable], Callable]:  # noqa: N802
    """On ROCm, run only on the gfx architectures named; elsewhere always run."""

    def decorator(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if flags.TEST_WITH_ROCM and not _rocm_arch_in(arch):
                raise unittest.SkipTest(f"skipIfRocm: test only runs on {arch}")
            return fn(self, *args, **kwargs)

        return wrapper

    return decorator


def _rocm_arch_in(arch: Tuple[str, ...]) -> bool:
    return bool(torch.version.hip) and any(a in rocm_arch_name() for a in arch)


def skipIfRocmVersionLessThan(  # noqa: N802 - upstream's name
    version: Optional[Sequence[int]] = None,
) -> Callable[[Any], Any]:
    """On ROCm, skip unless torch's ROCm is at least `version` (major, minor)."""

    def should_skip() -> bool:
        if not flags.TEST_WITH_ROCM:
            return False
        found = flags._get_torch_rocm_version()[:2]
        return version is None or found < tuple(version)

    return lazy_skip_if(should_skip, f"ROCm version less than {version} required")


def skipIfXpu(  # noqa: N802 - upstream's name
    func: Optional[Callable] = None, *, msg: str = "test doesn't currently work on the XPU stack"
) -> Any:
    """Skip on Intel XPU machines; bare or with a message."""
    decorator = lazy_skip_if(lambda: TEST_XPU, f"skipIfXpu: {msg}")
    return decorator(func) if func is not None else decorator


def skip_but_pass_in_sandcastle(reason: str) -> Callable[[Any], Any]:
    """Always skip with `reason` (upstream passes it inside Meta's Sandcastle CI only)."""
    return skip_but_pass_in_sandcastle_if(True, reason)


# ------------------------------------------------------------------ common_distributed


def requires_nccl() -> Callable[[Any], Any]:
    """Skip unless torch was built with the NCCL backend: an accelerator requirement
    (harness/requirements/decorators.py), met on CPU where the CPU stands in."""
    return requires(AcceleratorRequirement(
        0, backends=("nccl",), message="c10d was not compiled with the NCCL backend"
    ))


def requires_nccl_version(version: Tuple[int, ...], msg: str) -> Callable[[Any], Any]:
    """Where CUDA exists, skip unless NCCL is compiled in and at least `version`. Without
    CUDA it changes nothing (as upstream: the test's other requirements decide)."""
    if not cuda_available():
        return lambda f: f
    if not dist.is_nccl_available():
        return skip_but_pass_in_sandcastle("c10d was not compiled with the NCCL backend")
    found = nccl_version()
    return skip_but_pass_in_sandcastle_if(
        found < tuple(version),
        f"Requires NCCL version greater than or equal to: {version}, found: {found}, "
        f"reason: {msg}")


def requires_nccl_shrink() -> Callable[[Any], Any]:
    """NCCL 2.27 or later (shrink_group)."""
    return requires_nccl_version((2, 27), "Need NCCL 2.27+ for shrink_group")


def requires_ucc() -> Callable[[Any], Any]:
    return skip_but_pass_in_sandcastle_if(
        not dist.is_ucc_available(), "c10d was not compiled with the UCC backend")


def requires_multicast_support() -> Callable[[Any], Any]:
    """Skip unless CUDA device 0 supports multicast (symmetric memory)."""
    return skip_but_pass_in_sandcastle_if(
        not multicast_supported(), "multicast support is not available")


def skip_if_win32() -> Callable[[Any], Any]:
    return skip_but_pass_in_sandcastle_if(
        sys.platform == "win32", "This unit test case is not supported on Windows platform")


def sm_is_or_higher_than(device: torch.device, major: int, minor: int) -> bool:
    """Compute capability at least (major, minor): True for non-CUDA devices, False on ROCm."""
    if device.type != "cuda":
        return True
    if torch.version.hip is not None:
        return False
    return device_capability(device) >= (major, minor)


def skip_if_rocm_arch_multiprocess(arch: Tuple[str, ...]) -> Callable[[Any], Any]:
    """Skip a multi-rank test on ROCm devices of the gfx architectures named."""

    def decorator(func: Any) -> Any:
        reason = None
        if flags.TEST_WITH_ROCM and rocm_arch_name().split(":")[0] in arch:
            reason = f"skip_if_rocm_arch_multiprocess: test skipped on {arch}"
        return unittest.skipIf(reason is not None, reason or "")(func)

    return decorator


def skip_if_rocm_ver_lessthan_multiprocess(
    version: Optional[Sequence[int]] = None,
) -> Callable[[Any], Any]:
    """Skip a multi-rank test on ROCm older than `version`."""

    def decorator(func: Any) -> Any:
        reason = None
        if flags.TEST_WITH_ROCM:
            found = tuple(int(x) for x in str(torch.version.hip).split("-", 1)[0].split("."))
            if version is None or found < tuple(version):
                reason = (f"skip_if_rocm_ver_lessthan_multiprocess: ROCm {found} is available "
                          f"but {version} required")
        return unittest.skipIf(reason is not None, reason or "")(func)

    return decorator


def require_n_gpus_for_nccl_backend(n: int, backend: str) -> Callable[[Callable], Callable]:
    """With the nccl backend, skip (in the rank) unless `n` CUDA devices exist."""

    def decorator(func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if backend == "nccl" and cuda_device_count() < n:
                raise unittest.SkipTest(TEST_SKIPS[f"multi-gpu-{n}"].message)
            return func(*args, **kwargs)

        return wrapper

    return decorator


def requires_world_size(n: int) -> Callable[[Callable], Callable]:
    """Ask for `n` ranks (read by get_required_world_size); skip unless n CUDA devices exist."""

    def decorator(func: Callable) -> Callable:
        func._required_world_size = n  # type: ignore[attr-defined]
        available = cuda_device_count()
        return unittest.skipUnless(available >= n, f"requires {n} GPUs, found {available}")(func)

    return decorator


def get_required_world_size(obj: Any, default: int) -> int:
    """The world size the running test asked for with requires_world_size, else `default`."""
    try:
        return int(getattr(obj, unittest_internals.method_name(obj))._required_world_size)
    except Exception:  # noqa: BLE001 - upstream's rule: anything missing means the default
        return default


def import_transformers_or_skip() -> Callable[[Callable], Callable]:
    """Skip (as a missing import) unless `transformers` imports."""

    def decorator(func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                from transformers import AutoModelForMaskedLM, BertConfig  # noqa: F401
            except ImportError:
                raise unittest.SkipTest(TEST_SKIPS["importerror"].message) from None
            return func(*args, **kwargs)

        return wrapper

    return decorator


def with_nccl_blocking_wait(func: Callable) -> Callable:
    """Run with TORCH_NCCL_BLOCKING_WAIT=1 and TORCH_NCCL_ASYNC_ERROR_HANDLING unset. As
    upstream, each is restored afterwards only if it was set before (an unset
    TORCH_NCCL_BLOCKING_WAIT stays 1)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        saved = {name: os.environ.pop(name, None)
                 for name in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT")}
        os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1"
        try:
            return func(*args, **kwargs)
        finally:
            for name, value in saved.items():
                if value is not None:
                    os.environ[name] = value

    return wrapper


# ------------------------------------------------------------------ common_cuda


@contextlib.contextmanager
def tf32_off() -> Iterator[None]:
    """TF32 off for CUDA matmuls and cuDNN inside the block, restored after."""
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        with torch.backends.cudnn.flags(enabled=None, benchmark=None, deterministic=None,
                                        allow_tf32=False):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def with_tf32_off(func: Callable) -> Callable:
    """Run the test with TF32 off (full float32 precision for matmuls and convolutions)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with tf32_off():
            return func(*args, **kwargs)

    return wrapper


def xfailIfSM100OrLater(func: Callable) -> Callable:  # noqa: N802 - upstream's name
    """Expected to fail on NVIDIA sm100 or later (never on ROCm)."""
    if flags.TEST_WITH_ROCM or not flags.SM100OrLater:
        return func
    return unittest.expectedFailure(func)


# ------------------------------------------------------------------ inductor / triton

requires_triton = functools.partial(unittest.skipIf, not flags.HAS_TRITON, "requires triton")
requires_gpu = unittest.skipUnless(flags.HAS_GPU, "requires gpu")  # triton_utils' form
requires_cuda_and_triton = unittest.skipUnless(flags.HAS_CUDA_AND_TRITON,
                                               "requires cuda and triton")
