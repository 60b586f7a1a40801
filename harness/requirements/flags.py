"""Upstream's platform flags (common_utils, common_cuda, common_distributed,
common_device_type, inductor_utils): what kind of machine and CI a test runs on.

Flags that need a device query (compute capability, device properties) are `LazyFlag`s,
evaluated when first read, as upstream's `LazyVal`s: importing a test module must not
initialise CUDA (its ranks are forked from a process that imported it).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Tuple

import torch

from harness import settings
from harness.compat.inductor import has_triton
from harness.requirements.decorators import TEST_HPU, TEST_WITH_ROCM, TEST_XPU
from harness.settings import TEST_CUDA

__all__ = [
    "E4M3_MAX_POS", "GPU_TYPE", "HAS_ACCELERATOR", "HAS_CUDA_AND_TRITON", "HAS_GPU",
    "HAS_TRITON", "IS_CI", "IS_H100", "IS_SANDCASTLE", "IS_WINDOWS", "LazyFlag", "MI200_ARCH",
    "MI300_ARCH", "MI350_ARCH", "NAVI_ARCH", "PLATFORM_SUPPORTS_CUDNN_ATTENTION",
    "PLATFORM_SUPPORTS_FLASH_ATTENTION", "PLATFORM_SUPPORTS_FP8",
    "PLATFORM_SUPPORTS_FUSED_ATTENTION", "PLATFORM_SUPPORTS_MEM_EFF_ATTENTION",
    "PLATFORM_SUPPORTS_SYMM_MEM", "SM80OrLater", "SM89OrLater", "SM90OrLater",
    "SM100OrLater", "TEST_CUDA_GRAPH", "TEST_MULTIACCELERATOR", "_get_torch_rocm_version",
    "e4m3_type", "rocm_arch_any_of",
]


class LazyFlag:
    """A bool computed on first use (then kept), usable wherever upstream's LazyVal is."""

    def __init__(self, compute: Callable[[], Any]) -> None:
        self._compute = compute
        self._value: Any = None
        self._known = False

    @property
    def value(self) -> Any:
        if not self._known:
            self._value = self._compute()
            self._known = True
        return self._value

    def __bool__(self) -> bool:
        return bool(self.value)

    def __eq__(self, other: object) -> bool:
        return self.value == (other.value if isinstance(other, LazyFlag) else other)

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return repr(self.value)


# ------------------------------------------------------------------ where the tests run

IS_WINDOWS = sys.platform == "win32"
# Upstream's CI flag: CI set to anything non-empty (GitHub sets CI=true).
IS_CI = bool(settings.env_text("CI"))
# Meta's internal CI; outside it only SANDCASTLE=1 (or its job user) turns it on.
IS_SANDCASTLE = (settings.upstream_flag("SANDCASTLE")
                 or settings.env_text("TW_JOB_USER") == "sandcastle")

# ------------------------------------------------------------------ accelerators

HAS_ACCELERATOR = TEST_CUDA or TEST_HPU or TEST_XPU
TEST_MULTIACCELERATOR = LazyFlag(lambda: torch.accelerator.device_count() > 1)
TEST_CUDA_GRAPH = TEST_CUDA and not settings.upstream_flag("PYTORCH_TEST_SKIP_CUDAGRAPH") and (
    torch.version.cuda or torch.version.hip)


def _capability_at_least(major: int, minor: int) -> LazyFlag:
    return LazyFlag(lambda: torch.cuda.is_available()
                    and torch.cuda.get_device_capability() >= (major, minor))


SM80OrLater = _capability_at_least(8, 0)
SM89OrLater = _capability_at_least(8, 9)
SM90OrLater = _capability_at_least(9, 0)
SM100OrLater = _capability_at_least(10, 0)

# ------------------------------------------------------------------ ROCm

MI350_ARCH = ("gfx950",)
MI300_ARCH = ("gfx942",)
MI200_ARCH = ("gfx90a",)
NAVI_ARCH = ("gfx1030", "gfx1100", "gfx1101", "gfx1200", "gfx1201")


def rocm_arch_any_of(arch: Tuple[str, ...]) -> bool:
    """Whether this is a ROCm build whose device 0 has one of the gfx architectures."""
    if not torch.version.hip:
        return False
    name = torch.cuda.get_device_properties(0).gcnArchName
    return any(candidate in name for candidate in arch)


def _get_torch_rocm_version() -> Tuple[int, ...]:
    """(major, minor, ...) of torch's ROCm; (0, 0) where this is not a ROCm run."""
    if not TEST_WITH_ROCM or torch.version.hip is None:
        return (0, 0)
    return tuple(int(part) for part in str(torch.version.hip).split("-", 1)[0].split("."))


def _rocm_arch_within(arch: Tuple[str, ...]) -> bool:
    if not torch.cuda.is_available():
        return False
    name = settings.env_text("PYTORCH_DEBUG_FLASH_ATTENTION_GCN_ARCH_OVERRIDE") or (
        torch.cuda.get_device_properties("cuda").gcnArchName)
    return any(candidate in name for candidate in arch)


# ------------------------------------------------------------------ platform support

_ROCM_ATTENTION_ARCH = ("gfx90a", "gfx942", "gfx1100", "gfx1201", "gfx950")
_ROCM_EXPERIMENTAL_ARCH = ("gfx1101", "gfx1102", "gfx1150", "gfx1151", "gfx1200")


def _rocm_attention_arch() -> Tuple[str, ...]:
    experimental = settings.env_text("TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL", "0") != "0"
    return _ROCM_ATTENTION_ARCH + (_ROCM_EXPERIMENTAL_ARCH if experimental else ())


def _flash_attention() -> bool:
    if TEST_WITH_ROCM:
        return _rocm_arch_within(_rocm_attention_arch())
    if TEST_CUDA:
        return not IS_WINDOWS and bool(SM80OrLater)
    return TEST_XPU


def _mem_eff_attention() -> bool:
    if TEST_WITH_ROCM:
        return _rocm_arch_within(_rocm_attention_arch())
    return TEST_CUDA or TEST_XPU


def _cudnn_attention() -> bool:
    if TEST_WITH_ROCM or not SM80OrLater:
        return False
    return TEST_CUDA and torch.backends.cudnn.is_available() and (
        (torch.backends.cudnn.version() or 0) >= 90000)


def _rocm_version() -> Tuple[int, ...]:
    return tuple(int(v) for v in torch.version.hip.split(".")[:2]) if torch.version.hip else (0, 0)


def _fp8() -> bool:
    if torch.cuda.is_available():
        if torch.version.hip:
            archs = ["gfx94"] + (["gfx120"] if _rocm_version() >= (6, 3) else []) + (
                ["gfx95"] if _rocm_version() >= (6, 5) else [])
            return any(a in torch.cuda.get_device_properties(0).gcnArchName for a in archs)
        return bool(SM90OrLater) or torch.cuda.get_device_capability() == (8, 9)
    return True  # XPU and the CPU support FP8


def _symm_mem() -> bool:
    if not TEST_CUDA:
        return False
    if TEST_WITH_ROCM:
        return any(a in torch.cuda.get_device_properties(0).gcnArchName
                   for a in ("gfx942", "gfx950"))
    return True


PLATFORM_SUPPORTS_FLASH_ATTENTION = LazyFlag(_flash_attention)
PLATFORM_SUPPORTS_MEM_EFF_ATTENTION = LazyFlag(_mem_eff_attention)
PLATFORM_SUPPORTS_CUDNN_ATTENTION = LazyFlag(_cudnn_attention)
PLATFORM_SUPPORTS_FUSED_ATTENTION = LazyFlag(
    lambda: bool(PLATFORM_SUPPORTS_FLASH_ATTENTION) or bool(PLATFORM_SUPPORTS_CUDNN_ATTENTION)
    or bool(PLATFORM_SUPPORTS_MEM_EFF_ATTENTION))
PLATFORM_SUPPORTS_FP8 = LazyFlag(_fp8)
PLATFORM_SUPPORTS_SYMM_MEM = LazyFlag(_symm_mem)

# ------------------------------------------------------------------ float8 (common_device_type)

if torch.version.hip and torch.cuda.device_count() > 0 and rocm_arch_any_of(("gfx94",)):
    e4m3_type = torch.float8_e4m3fnuz
else:
    e4m3_type = torch.float8_e4m3fn
E4M3_MAX_POS = torch.finfo(e4m3_type).max

# ------------------------------------------------------------------ inductor (inductor_utils)

HAS_TRITON = has_triton()
HAS_CUDA_AND_TRITON = torch.cuda.is_available() and HAS_TRITON
HAS_GPU = HAS_CUDA_AND_TRITON or (torch.xpu.is_available() and HAS_TRITON)
# The GPU kind inductor generates code for: the one available, else "cuda".
GPU_TYPE = next((kind for kind in ("cuda", "mps", "xpu", "mtia")
                 if getattr(torch, kind).is_available()), "cuda")
H100_SHARED_MEMORY = 232448  # bytes of shared memory per block an H100 offers


def _is_h100() -> bool:
    if not HAS_CUDA_AND_TRITON:
        return False
    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    return getattr(properties, "shared_memory_per_block_optin", 0) == H100_SHARED_MEMORY


IS_H100 = LazyFlag(_is_h100)
