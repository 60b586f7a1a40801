"""Whether a CUDA device supports multicast (``torch._C._distributed_c10d._SymmetricMemory``)."""

from __future__ import annotations


def has_multicast_support(device_index: int = 0) -> bool:
    """Multicast on CUDA device `device_index`, as symmetric memory reports it."""
    from torch._C._autograd import DeviceType
    from torch._C._distributed_c10d import _SymmetricMemory

    return bool(_SymmetricMemory.has_multicast_support(DeviceType.CUDA, device_index))
