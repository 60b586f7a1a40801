"""Upstream's shared-process bases, `MultiProcContinuousTest` and `FSDPTestContinuous` (INTERIM).

Upstream starts one set of rank processes per class and runs every test of the class in them,
with one default process group per class. Until the harness has a shared-process launcher
(issue 10), these classes run on the fresh-process mode instead: every test gets its own rank
processes (MultiProcessTestCase), and the default group is initialised through the test's own
rendezvous before the test and destroyed after it. What they add is only upstream's class API
(`world_size`, `rank`, `backend_str()`, `device_type()`, `opts()`, `timeout`, `_init_pg`, `pg` /
`process_group`), so upstream files that subclass them import and pass with upstream's
semantics, and swapping in the shared-process launcher later changes no test file. Unlike
upstream there is no poison pill: a failing test fails alone. Two things fresh processes make
unnecessary that the shared launcher must add: resetting torch.compile's caches between tests
(upstream calls ``torch._dynamo.reset()``) and creating the group once per class. The default
``timeout`` is the harness's (HARNESS_TIMEOUT, else 300 s), not upstream's 120 s.
"""

from __future__ import annotations

import inspect
import os
import unittest
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

from harness import devices
from harness.fsdp import FSDPTestMixin
from harness.multiprocess import MAIN_PROCESS_RANK, MultiProcessTestCase


class _DefaultWorldSize:
    """`world_size` until a class sets it (as an int or a property): the harness's default
    (HARNESS_WORLD_SIZE, else one rank per GPU, else 2 CPU ranks), read when used."""

    def __get__(self, obj: Any, owner: Any = None) -> int:
        return devices.default_world_size()


def class_device_type(cls: type) -> str:
    """A class's device type however it is declared: upstream's ``device_type()`` classmethod,
    a plain string (device-type instantiation sets one on the generated class) or a property."""
    declared = inspect.getattr_static(cls, "device_type")
    if isinstance(declared, str):
        return declared
    if isinstance(declared, classmethod):
        return declared.__func__(cls)
    if isinstance(declared, staticmethod):
        return declared.__func__()
    if isinstance(declared, property) and declared.fget is not None:
        return declared.fget(cls)
    raise TypeError(f"{cls.__name__}.device_type must be a classmethod, property or str")


class MultiProcContinuousTest(MultiProcessTestCase):
    """Upstream's `MultiProcContinuousTest` class API on fresh rank processes (see the module).

    In a rank, before each test, `_init_pg(rank, world_size, rendezvous)` creates the default
    group with `backend_str()` (None: torch picks per device) and `opts()`, and sets the
    class attributes `pg`, `rank`, `world_size` and `rdvz_file` as upstream does; the group is
    destroyed after the test. A `timeout` given as a `timedelta` (upstream's type) is
    converted to seconds, the harness's unit.
    """

    world_size: int = _DefaultWorldSize()  # type: ignore[assignment]
    rdvz_file: Optional[str] = None
    pg: Any = None
    poison_pill: bool = False  # upstream's flag; never set here, a failing test fails alone

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        timeout = vars(cls).get("timeout")
        if isinstance(timeout, timedelta):
            cls.timeout = timeout.total_seconds()

    @classmethod
    def backend_str(cls) -> Optional[str]:
        """The default group's backend; None lets torch choose per device (gloo, nccl)."""
        return None

    @classmethod
    def device_type(cls) -> str:
        """The device type the class tests: the accelerator's, else ``cpu``."""
        return devices.device_type()

    @classmethod
    def opts(cls, high_priority_stream: bool = False) -> Any:
        """Backend options for the default group (``pg_options``); None for the defaults."""
        return None

    @classmethod
    def _init_pg(cls, rank: int, world_size: int, rdvz_file: str) -> None:
        """Create the default group; ``rdvz_file`` is a rendezvous file path or, when the
        ranks were launched by torchrun, an ``init_method`` URL."""
        os.environ.setdefault("LOCAL_RANK", str(rank))  # torchrun's, when it launched us
        if "://" in rdvz_file:
            rendezvous: dict = {"init_method": rdvz_file}
        else:
            rendezvous = {"store": dist.FileStore(rdvz_file, world_size)}
        dist.init_process_group(
            backend=cls.backend_str(),
            world_size=world_size,
            rank=rank,
            pg_options=cls.opts(),
            timeout=timedelta(seconds=float(cls.timeout)),
            **rendezvous,
        )
        cls.pg = dist.group.WORLD

    def setUp(self) -> None:
        super().setUp()
        if self.rank == MAIN_PROCESS_RANK:
            return
        cls = type(self)
        cls.rank = self.rank
        cls.world_size = self.world_size
        cls.rdvz_file = self.file_name
        by_file = self.init_method == f"file://{self.file_name}"
        cls._init_pg(self.rank, self.world_size, self.file_name if by_file else self.init_method)

    def tearDown(self) -> None:
        if self.rank != MAIN_PROCESS_RANK and dist.is_initialized():
            dist.destroy_process_group()
            type(self).pg = None
        super().tearDown()


class FSDPTestContinuous(FSDPTestMixin, MultiProcContinuousTest):
    """Upstream's `FSDPTestContinuous`: the FSDP parity helpers on MultiProcContinuousTest.

    The backend follows the device type (nccl on GPUs, gloo on CPU); each rank uses its own
    device (`self.device`); ranks barrier before and after each test (the barrier after is
    skipped when this rank failed); `process_group` is the class's `pg`. With fewer
    accelerators than ranks the test skips before any rank starts, as upstream's ranks do.
    """

    @classmethod
    def backend_str(cls) -> str:
        return devices.backend_for(class_device_type(cls))

    @classmethod
    def device_type(cls) -> str:
        return devices.device_type()

    @classmethod
    def _init_pg(cls, rank: int, world_size: int, rdvz_file: str) -> None:
        device = devices.rank_device(rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        super()._init_pg(rank, world_size, rdvz_file)

    @property
    def device(self) -> torch.device:
        """This rank's device: its own GPU, or the CPU."""
        return devices.rank_device(max(self.rank, 0))

    @property
    def process_group(self) -> Any:
        return type(self).pg

    def setUp(self) -> None:
        if self.rank == MAIN_PROCESS_RANK and class_device_type(type(self)) != "cpu":
            found, needed = devices.accelerator_count(), self.world_size
            if isinstance(needed, int) and found < needed:
                raise unittest.SkipTest(f"Need at least {needed} CUDA devices ({found} found)")
        super().setUp()
        if self.rank != MAIN_PROCESS_RANK:
            dist.barrier()

    def tearDown(self) -> None:
        if self.rank != MAIN_PROCESS_RANK and dist.is_initialized() and not self._rank_failed():
            dist.barrier()
        super().tearDown()
