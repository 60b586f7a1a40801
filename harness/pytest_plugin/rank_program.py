"""In each rank: a marked pytest function's call run as the rank's test, one class per mode.

The pytest process sends every rank a Job (harness/pytest_plugin/run.py) naming one of these
classes and the FunctionCall as its inputs; the rank makes an instance of it and runs its one
method, `run_function`, which makes the call (harness/pytest_plugin/in_rank.py). The modes'
bases give each rank its process or thread, its group and its reporting, as for the classes.

Before the call: the rank's device (its accelerator, when it has one) and, with `init=True`,
the default group. Fresh ranks make it per test; shared ranks once per set (the set is keyed
by module, world size, devices, backend and init, so every test sent to it wants that group);
threads use the threaded backend's group.
"""

from __future__ import annotations

import datetime
from typing import Any, FrozenSet

import torch
import torch.distributed as dist

from harness import devices
from harness.launch.case import RankedTestCase
from harness.process.case import MultiProcessTestCase
from harness.process.continuous import MultiProcContinuousTest
from harness.pytest_plugin.call import FunctionCall
from harness.pytest_plugin.in_rank import RANKS_SCOPE, call_in_rank, rank_device
from harness.threads.case import MultiThreadedTestCase

__unittest = True
__tracebackhide__ = True

METHOD = "run_function"


class FunctionCase(RankedTestCase):
    """What the three mode classes share: the call its rank was sent, made as the test, and
    the rank's device set before the call. Made only where a rank runs."""

    def __init__(self, methodName: str = METHOD) -> None:  # noqa: N803 - unittest's
        super().__init__(methodName)

    def id(self) -> str:
        context = self.rank_context
        return context.inputs.test_id if context is not None else super().id()

    def __str__(self) -> str:
        return self.id()

    def reported_name(self) -> str:
        return self.id().rpartition("::")[2]

    def rank_call(self) -> FunctionCall:
        """In a rank: the call its supervisor sent."""
        assert self.rank_context is not None, "not in a rank"
        return self.rank_context.inputs

    def waived_leak_checks(self) -> FrozenSet[str]:
        return frozenset(self.rank_call().skip_leak_checks)

    def run_function(self) -> None:
        """The one test method: the call, in every rank (the supervisor joins them)."""
        context = self.rank_context
        assert context is not None
        call_in_rank(
            context.inputs, context.rank, context.world_size, context.init_method,
            keep_ranks_scope=self.keeps_ranks_scope(),
        )

    def keeps_ranks_scope(self) -> bool:
        """Whether this rank outlives the test (so "ranks"-scoped rank fixtures stay)."""
        return False

    def use_device(self) -> None:
        """Make the rank's accelerator its current device (nothing on CPU)."""
        device = rank_device(self.rank_call(), self.rank)
        if device.type != "cpu":
            torch.get_device_module(device.type).set_device(device)

    def init_group(self, **rendezvous: Any) -> None:
        """The default group of this call's backend (its timeout beyond the test's own), then
        a barrier: gloo's connections are made in the background of init, and a rank whose
        test ends at once (a skip, a test without a collective) would otherwise exit while a
        peer still connects to it, failing that peer ("Connection closed by peer")."""
        call = self.rank_call()
        dist.init_process_group(
            call.backend, rank=self.rank, world_size=self.world_size,
            timeout=datetime.timedelta(seconds=call.group_timeout), **rendezvous,
        )
        dist.barrier()


class FreshFunction(FunctionCase, MultiProcessTestCase):
    """mode="fresh": new rank processes for the test (or, under torchrun, this process)."""

    def rank_set_up(self) -> None:
        super().rank_set_up()
        self.use_device()
        if self.rank_call().init:
            self.init_group(init_method=self.init_method)


class SharedFunction(FunctionCase, MultiProcContinuousTest):
    """mode="shared": one set of rank processes per SharedKey, with the shared classes' leak
    checks; its default group is made by the first test and kept."""

    timeout: Any = devices.DefaultTimeout()  # seconds, as the fresh mode's (not a group's)

    def keeps_ranks_scope(self) -> bool:
        return type(self).rdvz_file is not None

    @classmethod
    def shared_rank_start(cls, rank: int, world_size: int, rdvz_file: str) -> None:
        """Once per set: who this rank is; the group waits for the first test's call."""
        cls.rank = rank  # type: ignore[assignment]
        cls.world_size = world_size
        cls.rdvz_file = rdvz_file

    @classmethod
    def shared_rank_before_test(cls) -> None:
        if cls.pg is not None:  # the first test makes the group: nothing to meet on before it
            super().shared_rank_before_test()

    @classmethod
    def shared_rank_after_test(cls) -> bool:
        if cls.pg is None:
            return not dist.is_initialized()
        return super().shared_rank_after_test()

    @classmethod
    def shared_rank_finish(cls) -> None:
        RANKS_SCOPE.close()

    def rank_set_up(self) -> None:
        # The seeding every rank does; not the continuous base's group for torchrun (below).
        RankedTestCase.rank_set_up(self)
        self.use_device()
        cls = type(self)
        if not self.rank_call().init or dist.is_initialized():
            return
        if cls.rdvz_file is None:  # torchrun: this process is the rank, a group per test
            self.init_group(init_method=self.init_method)
            self.addCleanup(dist.destroy_process_group)
            return
        self.init_group(store=dist.FileStore(cls.rdvz_file, self.world_size))
        cls.pg = dist.group.WORLD


class ThreadFunction(FunctionCase, MultiThreadedTestCase):
    """mode="threads": the ranks are threads of the pytest process, on the threaded backend."""

    def start_rank_thread(self) -> None:
        if self.rank_call().init:
            super().start_rank_thread()


MODE_PROGRAMS = {"fresh": FreshFunction, "shared": SharedFunction, "threads": ThreadFunction}
