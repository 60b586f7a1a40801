"""In each rank: a marked pytest function's call, run as that rank's test, without unittest.

The pytest process sends every rank a Job (harness/pytest_plugin/run.py) naming one of the
three programs below and carrying the FunctionCall as its inputs. A launcher treats a program
as it treats a test class's rank instance (the rank hooks, harness/launch/hooks.py): it makes
one with the job's method name, hands it the rank's context (`attach_rank`) and runs it with
the rank's reporting result (`run`). The program sets the rank up, makes the call
(harness/pytest_plugin/in_rank.py), reports what happened through the result's `report_*`
methods (a Failure built from the live exception, harness/outcome/failure.py), and tears
down.

Before the call: the rank's seed, its device (its accelerator, when it has one) and, with
`init=True`, the default group. Fresh ranks make the group per test; shared ranks once per
set (the set is keyed by module, world size, devices, backend and init, so every test sent to
it wants that group); threads use the threaded backend's group, made by the launcher's
thread hooks.
"""

from __future__ import annotations

import datetime
import sys
import unittest
from typing import Any, ClassVar, FrozenSet, Optional

import torch
import torch.distributed as dist

from harness.launch.context import RankContext
from harness.outcome.rank_record import ReportingResult, exit_ends_rank
from harness.process.continuous import meet_before_test, still_usable_after_test
from harness.process.rank import destroy_default_group
from harness.pytest_plugin.call import FunctionCall
from harness.pytest_plugin.in_rank import RANKS_SCOPE, call_in_rank, rank_device
from harness.single_process.testcase import current_seed, seed_everything
from harness.threads import backend as threaded_pg

# unittest and pytest hide frames of modules that define these: a failure points at the
# user's line, not at how the rank ran it.
__unittest = True
__tracebackhide__ = True

METHOD = "run_function"  # the job's method: a program runs its one call


class FunctionProgram:
    """What the three modes share: the call its rank was sent, made as the rank's test."""

    def __init__(self, method: str = METHOD) -> None:
        """`method`: the job's (a program has one call to make)."""
        self.context: Optional[RankContext] = None
        self.exited = False  # the call ended with sys.exit: the rank ends as upstream's do

    # --- the rank hooks every launcher calls ----------------------------------------------
    def attach_rank(self, context: RankContext) -> None:
        self.context = context

    def run(self, result: ReportingResult) -> None:
        """Set the rank up, make the call, tear down: each outcome reported to `result`, as
        unittest reports a test class's (a success only once the tear-down is done too)."""
        try:
            self.set_up()
        except KeyboardInterrupt:
            raise
        except BaseException:
            result.report_raised(sys.exc_info())
            self._tear_down(result)
            return
        passed = self._call(result)
        if self.exited:  # as upstream's rank process: no tear-down
            result.report_success()
        elif self._tear_down(result) and passed:
            result.report_success()

    def _call(self, result: ReportingResult) -> bool:
        """Make the call; report how it failed or skipped; whether it passed."""
        try:
            call_in_rank(self.call, self.rank, self.world_size, self._context.init_method,
                         keep_ranks_scope=self.keeps_ranks_scope(),
                         set_up_done=result.report_set_up)
        except unittest.SkipTest as skip:  # pytest.skip in the rank (in_rank.py)
            result.report_skip(str(skip))
        except KeyboardInterrupt:
            raise
        except SystemExit as exit_:
            if not exit_ends_rank(exit_.code):
                result.report_raised(sys.exc_info())
                return False
            self.exited = True
            if exit_.code:
                result.add_exit(exit_.code)
        except BaseException:
            result.report_raised(sys.exc_info())
        else:
            return True
        return False

    def _tear_down(self, result: ReportingResult) -> bool:
        """The mode's tear-down (`passed`: the test did not fail in this rank); whether it
        raised nothing (what it raised is reported)."""
        try:
            self.tear_down(passed=not result.failed)
        except KeyboardInterrupt:
            raise
        except BaseException:
            result.report_raised(sys.exc_info())
            return False
        return True

    # --- what each mode adds ---------------------------------------------------------------
    def set_up(self) -> None:
        """Before the call: the seed every process rank starts from, the rank's device."""
        seed_everything(current_seed())
        device = rank_device(self.call, self.rank)
        if device.type != "cpu":
            torch.get_device_module(device.type).set_device(device)

    def tear_down(self, passed: bool) -> None:
        """After the call (not after sys.exit)."""

    def keeps_ranks_scope(self) -> bool:
        """Whether this rank outlives the test (so "ranks"-scoped rank fixtures stay)."""
        return False

    def init_group(self, **rendezvous: Any) -> None:
        """The default group of this call's backend (its timeout beyond the test's own), then
        a barrier: gloo's connections are made in the background of init, and a rank whose
        test ends at once (a skip, a test without a collective) would otherwise exit while a
        peer still connects to it, failing that peer ("Connection closed by peer")."""
        call = self.call
        dist.init_process_group(
            call.backend, rank=self.rank, world_size=self.world_size,
            timeout=datetime.timedelta(seconds=call.group_timeout), **rendezvous,
        )
        dist.barrier()

    # --- what the rank knows -----------------------------------------------------------------
    @property
    def _context(self) -> RankContext:
        assert self.context is not None, "not attached to a rank"
        return self.context

    @property
    def call(self) -> FunctionCall:
        """The call the pytest process sent."""
        return self._context.inputs

    @property
    def rank(self) -> int:
        return self._context.rank

    @property
    def world_size(self) -> int:
        return self._context.world_size

    def id(self) -> str:
        """The test's pytest node id (what a rank's messages name it by)."""
        return self.call.test_id

    def reported_name(self) -> str:
        """The test's name in what a shared rank reports about it (a leak)."""
        return self.id().rpartition("::")[2]

    def waived_leak_checks(self) -> FrozenSet[str]:
        """In a shared rank, after the test: the leak checks the marker waives."""
        return frozenset(self.call.skip_leak_checks)


class FreshFunction(FunctionProgram):
    """mode="fresh": new rank processes for the test (or, under torchrun, this process)."""

    def set_up(self) -> None:
        super().set_up()
        if self.call.init:
            self.init_group(init_method=self._context.init_method)

    def tear_down(self, passed: bool) -> None:
        # As the process classes' ranks: the group the test left, unless it failed here (a
        # failed rank's peers may still be inside a collective with it).
        if passed and dist.is_initialized():
            destroy_default_group()


class SharedFunction(FunctionProgram):
    """mode="shared": one set of rank processes per SharedKey, with the shared classes' leak
    checks; its default group is made by the first test and kept. The class holds what the
    set keeps (the shared-rank hooks are class methods, as the shared classes' are)."""

    rdvz_file: ClassVar[Optional[str]] = None  # None: not in a set (torchrun runs this rank)
    pg: ClassVar[Any] = None  # the set's default group, once its first test made it

    def __init__(self, method: str = METHOD) -> None:
        super().__init__(method)
        self._own_group = False  # torchrun: this test made a group of its own

    @classmethod
    def shared_rank_start(cls, rank: int, world_size: int, rdvz_file: str) -> None:
        """Once per set: its rendezvous file; the group waits for the first test's call (each
        test's context says who the rank is)."""
        cls.rdvz_file = rdvz_file

    @classmethod
    def shared_rank_before_test(cls) -> None:
        if cls.pg is not None:  # the first test makes the group: nothing to meet on before it
            meet_before_test(cls.pg)

    @classmethod
    def shared_rank_after_test(cls) -> bool:
        if cls.pg is None:
            return not dist.is_initialized()
        return still_usable_after_test(cls.pg)

    @classmethod
    def shared_rank_finish(cls) -> None:
        RANKS_SCOPE.close()

    def keeps_ranks_scope(self) -> bool:
        return type(self).rdvz_file is not None

    def set_up(self) -> None:
        super().set_up()
        cls = type(self)
        if not self.call.init or dist.is_initialized():
            return
        if cls.rdvz_file is None:  # torchrun: this process is the rank, a group per test
            self.init_group(init_method=self._context.init_method)
            self._own_group = True
            return
        self.init_group(store=dist.FileStore(cls.rdvz_file, self.world_size))
        cls.pg = dist.group.WORLD

    def tear_down(self, passed: bool) -> None:
        if self._own_group and dist.is_initialized():
            dist.destroy_process_group()


class ThreadFunction(FunctionProgram):
    """mode="threads": the ranks are threads of the pytest process, on the threaded backend;
    they share the process's generators, which the pytest process seeds once before the
    threads start (harness/pytest_plugin/run.py), as a thread class's supervisor does."""

    def set_up(self) -> None:
        """Nothing: the thread hooks made the group, and there is no device of the rank's own."""

    def start_rank_thread(self) -> None:
        if self.call.init:
            threaded_pg.init_default_group(self.rank)

    def finish_rank_thread(self, passed: bool) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


MODE_PROGRAMS = {"fresh": FreshFunction, "shared": SharedFunction, "threads": ThreadFunction}
