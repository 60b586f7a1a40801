"""torch's fake process group: one rank of any world size that communicates with nobody.

torch builds the group in C++ (`torch._C._distributed_c10d.FakeProcessGroup`) and leaves
registering it as the "fake" backend to its private testing package; the harness registers
the same group through the public `Backend.register_backend`, unless someone already did.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch._C._distributed_c10d import FakeProcessGroup

FAKE_DEVICES = ["cpu", "cuda", "hpu", "xpu"]  # the devices torch lists for the fake backend


def backend_registered(name: str) -> bool:
    """Whether a creator for backend `name` is registered (by anyone) in this process."""
    return name.upper() in dist.Backend._plugins


def _create_fake_group(common_opts: Any, backend_opts: Any) -> FakeProcessGroup:
    """The backend creator (extended API): one fake group for the rank and size asked."""
    if backend_opts is None:
        return FakeProcessGroup._create_internal(common_opts.group_rank, common_opts.group_size)
    return FakeProcessGroup._create_internal(
        common_opts.group_rank, common_opts.group_size, backend_opts
    )


def register_fake_backend() -> None:
    """Register the "fake" backend once; a registration already made (torch's own testing
    package imported first) is kept as it is."""
    if not backend_registered(dist.Backend.FAKE):
        dist.Backend.register_backend(
            dist.Backend.FAKE, _create_fake_group, extended_api=True, devices=FAKE_DEVICES
        )
