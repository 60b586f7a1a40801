"""A marked pytest function run by the harness's launchers, as a supervising test case.

The launchers (fresh processes, shared processes, threads, torchrun) run test cases. A marked
test is therefore run through a case of one of three module-level classes, one per mode,
whose single method, `run_function`, makes the call in each rank
(harness/pytest_plugin/in_rank.py) from the FunctionCall the supervising instance sends
(`rank_inputs`). Everything else is the classes' path, unchanged: the supervisor's setUp
checks the settings and starts the ranks, joins them, and `decide` turns their records into
the test's one TestReport, replayed as unittest's outcome (harness/launch/case.py);
`run_in_ranks` hands that outcome to pytest.

In a rank, before the call: the rank's device (its accelerator, when it has one) and, with
`init=True`, the default group. Fresh ranks make it per test; shared ranks once per set (the
set is keyed by module, world size, devices, backend and init, so every test sent to it wants
that group); threads use the threaded backend's group.
"""

from __future__ import annotations

import datetime
import unittest
from dataclasses import dataclass
from typing import Any, FrozenSet, List, Optional, Tuple

import torch
import torch.distributed as dist

from harness import settings as devices  # import lines only: being replaced
from harness.launch.case import RankedTestCase
from harness.outcome.rank_record import RankRecord
from harness.process import shared
from harness.process.case import MultiProcessTestCase
from harness.process.continuous import MultiProcContinuousTest
from harness.pytest_plugin.call import FunctionCall
from harness.pytest_plugin.in_rank import RANKS_SCOPE, call_in_rank, rank_device
from harness.threads.multithreaded_case import MultiThreadedTestCase

__unittest = True
__tracebackhide__ = True

METHOD = "run_function"


@dataclass(frozen=True)
class SharedKey:
    """Which set of shared ranks runs a marked test: one per (module, world size, devices,
    backend, init), so that every test sent to a set wants the group it has."""

    module: str
    world_size: int
    device_type: str
    devices: Tuple[int, ...]
    backend: str
    init: bool
    pool: bool = False  # rank_pool's sets are its own: they live for the session


class FunctionCase(RankedTestCase):
    """What the three mode classes share: a supervisor made for one call (`supervising`), the
    call sent to every rank, and the rank's device set before the call."""

    call: Optional[FunctionCall] = None  # the supervisor's; a rank reads its RankContext's
    _requested_size = 0

    def __init__(self, methodName: str = METHOD) -> None:  # noqa: N803 - unittest's
        super().__init__(methodName)

    @classmethod
    def supervising(
        cls, call: FunctionCall, world_size: int, timeout: Optional[float]
    ) -> FunctionCase:
        """The supervisor of `call` on `world_size` ranks (`timeout`: seconds, else the
        harness's default)."""
        case = cls(METHOD)
        case.call = call
        case._requested_size = world_size
        if timeout is not None:
            case.timeout = timeout
        return case

    def id(self) -> str:
        call = self.call if self.rank_context is None else self.rank_context.inputs
        return call.test_id if call is not None else super().id()

    def __str__(self) -> str:
        return self.id()

    def reported_name(self) -> str:
        return self.id().rpartition("::")[2]

    def checked_rank_settings(self) -> Tuple[int, float]:
        return devices.checked_rank_settings(self, self._requested_size)

    def rank_inputs(self) -> Any:
        return self.call

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
    shared_key: Optional[SharedKey] = None

    def shared_ranks_key(self) -> Any:
        return self.shared_key

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


MODE_CLASSES = {"fresh": FreshFunction, "shared": SharedFunction, "threads": ThreadFunction}


class _Outcome(unittest.TestResult):
    """The supervisor's verdict as unittest reports it: the first problem, or the skip."""

    def __init__(self) -> None:
        super().__init__()
        self.problem: Any = None
        self.skip: Optional[str] = None

    def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802 - unittest's
        self.problem = self.problem or err

    def addError(self, test: Any, err: Any) -> None:  # noqa: N802 - unittest's
        self.problem = self.problem or err

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802
        if err is not None:
            self.problem = self.problem or err

    def addSkip(self, test: Any, reason: str) -> None:  # noqa: N802 - unittest's
        self.skip = reason


@dataclass
class RanksRun:
    """What running a call on its ranks gave: the problem to raise (exc_info), else the skip
    reason, else a pass; and every rank's record (their output goes into pytest's report)."""

    problem: Any
    skip: Optional[str]
    records: List[RankRecord]


def run_in_ranks(
    call: FunctionCall, mode: str, world_size: int, timeout: Optional[float],
    deadline: Optional[float], shared_key: Optional[SharedKey] = None,
) -> RanksRun:
    """Run `call` on `world_size` ranks of `mode` (`shared_key`: the set of shared ranks that
    runs it); what happened."""
    case = MODE_CLASSES[mode].supervising(call, world_size, timeout)
    if isinstance(case, SharedFunction):
        case.shared_key = shared_key
    case.deadline = deadline
    outcome = _Outcome()
    case.run(outcome)
    if outcome.problem is not None and shared_key is not None:
        # A test that failed on shared ranks may have left them in any state: the next test
        # gets new ones (crashes, hangs and leaks already retire a set).
        shared.OPEN_RANKS.stop(shared_key)
    return RanksRun(outcome.problem, outcome.skip, list(case.rank_records))
