"""Upstream's shared-process base, `MultiProcContinuousTest` (FSDP's: harness/kit/fsdp.py).

As upstream, one set of rank processes runs every test of a class, with one default process
group per class: the ranks start on the class's first test (lazily, so device-type
instantiation works: the class that actually runs is the one started), create the group with
`_init_pg`, and before each test they barrier and reseed (and reset torch.compile's caches,
as upstream). The launching is harness/process/shared.py's (through the SharedProcesses
launcher); each test's events are reported as in the fresh-process mode. Beyond upstream
there is no poison pill: a failing test fails alone, and a rank that crashes, exits or hangs
fails only that test, the class's next test running on new ranks. Where a rank has no
class-wide group (torchrun launched this process, which is then the rank), each test creates
and destroys its own. As upstream, the class's ``timeout`` (a ``timedelta``, 120 s by default) is
its process group's timeout; a test's time limit is every base's (harness/settings.py
`test_timeout`: TIMEOUT_OVERRIDE, DISTRIBUTED_TESTS_DEFAULT_TIMEOUT, HARNESS_TIMEOUT, 300 s).
"""

from __future__ import annotations

import inspect
import os
import sys
from datetime import timedelta
from typing import Any, Optional

import torch.distributed as dist

from harness import settings
from harness.compat import distributed
from harness.compat import local_tensor as compat_local_tensor
from harness.launch.launcher import Launcher
from harness.process import shared as shared_ranks
from harness.process.launchers import SharedProcesses, process_launcher
from harness.process.multiprocess_case import MultiProcessTestCase
from harness.requirements.world_size import BaseWorldSize


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


def _group_timeout(timeout: Any) -> timedelta:
    """A class's `timeout` as the process group's: upstream's timedelta, or seconds."""
    return timeout if isinstance(timeout, timedelta) else timedelta(seconds=float(timeout))


def meet_before_test(pg: Any) -> None:
    """A set of shared ranks meets before each test on its kept group `pg`: see
    `MultiProcContinuousTest.shared_rank_before_test`."""
    if "gloo" in dist.get_backend_config(pg):
        distributed.cpu_barrier(pg)
    else:
        dist.barrier(group=pg)


def still_usable_after_test(pg: Any) -> bool:
    """After a test on shared ranks: torch.compile's caches forgotten; whether the default
    group is still the kept `pg`."""
    if "torch._dynamo" in sys.modules:
        compat_local_tensor.reset_dynamo()
    return dist.is_initialized() and dist.group.WORLD is pg


class MultiProcContinuousTest(MultiProcessTestCase):
    """Upstream's `MultiProcContinuousTest`: the tests of a class share its rank processes.

    In a rank, once per set of ranks, `_init_pg(rank, world_size, rdvz_file)` creates the
    default group with `backend_str()` (None: torch picks per device), `opts()` and the
    class's `timeout` (a `timedelta`; a number of seconds also limits each test), and the
    class attributes `pg`, `rank`, `world_size` and `rdvz_file` are set as upstream does.
    `world_size` defaults to the device count (1 on CPU), as upstream's.
    """

    world_size: int = BaseWorldSize(per_device=True, launched=True)  # type: ignore[assignment]
    timeout: Any = timedelta(seconds=120)  # upstream's: the process group's timeout
    rdvz_file: Optional[str] = None
    pg: Any = None
    poison_pill: bool = False  # upstream's flag; never set here, a failing test fails alone

    @classmethod
    def backend_str(cls) -> Optional[str]:
        """The default group's backend; None lets torch choose per device (gloo, nccl)."""
        return None

    @classmethod
    def device_type(cls) -> str:
        """The device type the class tests: the accelerator's, else ``cpu``."""
        return settings.device_type()

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
            timeout=_group_timeout(cls.timeout),
            **rendezvous,
        )
        cls.pg = dist.group.WORLD

    @property
    def destroy_pg_upon_exit(self) -> bool:
        """Never: the default group belongs to the class, not to one test."""
        return False

    @classmethod
    def tearDownClass(cls) -> None:
        shared_ranks.OPEN_RANKS.stop(cls)
        super().tearDownClass()

    # -- in a shared rank (harness/process/rank.py `serve`): the SharedRankHooks ---------------

    @classmethod
    def shared_rank_start(cls, rank: int, world_size: int, rdvz_file: str) -> None:
        """Once per set of ranks: the class attributes and the default group, as upstream."""
        cls.rank = rank  # type: ignore[assignment]
        cls.world_size = world_size
        cls.rdvz_file = rdvz_file
        cls._init_pg(rank, world_size, rdvz_file)

    @classmethod
    def shared_rank_before_test(cls) -> None:
        """Every rank meets before a test, so none is still in the last one (the test's setUp
        then reseeds, as in every rank).

        A barrier of the class's group, which a group left out of step cannot complete; on
        its CPU backend when it has one: `dist.barrier` would pick the accelerator's backend,
        which fails where ranks share one GPU (a CPU test class with more ranks than GPUs;
        seen with nccl on a 1-GPU machine) although the test itself never touches the GPU.
        """
        meet_before_test(cls.pg)

    @classmethod
    def shared_rank_after_test(cls) -> bool:
        """Forget what torch.compile cached; whether the class's group is still there."""
        return still_usable_after_test(cls.pg)

    @classmethod
    def shared_rank_finish(cls) -> None:
        """Nothing to undo: the rank process exits, its group with it."""

    # -- in the parent -------------------------------------------------------------------

    def make_launcher(self) -> Launcher:
        return process_launcher(SharedProcesses())

    def shared_ranks_key(self) -> Any:
        """Which set of shared ranks runs this test (harness/process/shared.py): the class's."""
        return type(self)

    # -- in a rank without the class's group (torchrun): a group for this test alone --------

    def rank_set_up(self) -> None:
        context = self.rank_context
        if context is not None and type(self).pg is None:
            type(self).shared_rank_start(context.rank, context.world_size, context.init_method)
            self.addCleanup(self._destroy_test_group)  # the last cleanup
        super().rank_set_up()

    def _destroy_test_group(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        type(self).pg = None
