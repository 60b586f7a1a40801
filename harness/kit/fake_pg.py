"""Upstream's `distributed.fake_pg`: a store and process group for one-process "ranks".

`init_process_group("fake", store=FakeStore(), rank=r, world_size=n)` makes this process
rank r of n without any peer: collectives return at once (their results are not computed),
so sharding logic for 8-64 ranks can be tested in one process, on CPU. Creating a
`FakeStore` registers the "fake" backend (as importing upstream's module does), unless it is
registered already.
"""

from __future__ import annotations

import torch.distributed as dist

from harness.compat.fake_pg import FakeProcessGroup, register_fake_backend

__all__ = ["FakeProcessGroup", "FakeStore"]


class FakeStore(dist.Store):
    """A key-value store that only serves to initialise the fake process group."""

    def __init__(self) -> None:
        super().__init__()
        register_fake_backend()
