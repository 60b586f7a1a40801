"""The hooks that make a marked pytest function (or a DistributedTest method) a multi-rank test.

- collection: a list of world sizes parametrizes `world_size` (`ranksN` in the id); each
  item keeps its `Ranks` (fixtures.RANKS); a test that cannot run here is skipped with the
  reason (`device="cuda"` without enough devices); a marker that is wrong is reported by
  that test alone, as a one-line error when it is set up.
- set-up: pytest resolves the fixtures in this process as usual; then `build_call` turns them
  into the FunctionCall the ranks get (a value that cannot be sent is a one-line error), and
  the ranks start (harness/pytest_plugin/run.py `StartedRun`); the phase waits until each
  rank's own fixtures are set up, so a `@rank_fixture` failing there is this phase's error.
- call: `pytest_pyfunc_call` joins the ranks and raises `RanksFailure` with the test's
  report when they failed it, which the plugin lays out (report.py).
- teardown: a `@rank_fixture` whose teardown failed in a rank (after the test passed there)
  errors here, as pytest's own fixtures do; a module's shared ranks stop once its last test
  ran.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from typing import Any, Dict, Optional, Tuple

import pytest

from harness import settings
from harness.compat import pytest_internals
from harness.launch.ranked_case import RankedTestCase
from harness.outcome.report import SKIPPED
from harness.process import forkserver, shared
from harness.pytest_plugin import deepspeed, leases, rank_program, report, stash
from harness.pytest_plugin import fixtures as fixtures_module
from harness.pytest_plugin.call import (
    IMPERATIVE_XFAIL,
    IN_RANK_BUILTINS,
    RANK_OWN,
    CallError,
    FixtureRef,
    FunctionCall,
    check_sendable,
    marked_param,
)
from harness.pytest_plugin.fixtures import RANKS, SIZE_PARAM, InRank
from harness.pytest_plugin.marker import (
    MarkerError,
    Placement,
    Ranks,
    placement,
    read_ranks,
    size_id,
)
from harness.pytest_plugin.run import (
    FunctionRun,
    RanksFailure,
    SharedKey,
    StartedRun,
    raised_for,
)

GROUP_TIMEOUT_MARGIN_S = 60.0  # the default group outlives the test, so a hang is the test's


def requested_ranks(node: Any, cls: Optional[type]) -> Optional[Ranks]:
    """What a test asks for: its `ranks` marker, or its DistributedTest class; None if it is
    not a multi-rank function (MarkerError if it asks wrongly)."""
    if isinstance(cls, type) and issubclass(cls, deepspeed.DistributedTest):
        return deepspeed.ranks_of(cls, node.get_closest_marker("world_size"))
    mark = node.get_closest_marker("ranks")
    if mark is None:
        return None
    if isinstance(cls, type) and issubclass(cls, RankedTestCase):
        raise MarkerError(
            f"@pytest.mark.ranks on {cls.__name__}, which is already a multi-rank unittest "
            "class: its world_size says how many ranks run each test"
        )
    return read_ranks(mark.args, mark.kwargs)


def place(ranks: Ranks, world_size: int) -> Placement:
    """Where `world_size` ranks of `ranks` run on this machine."""
    return placement(ranks, world_size, settings.accelerator_count(), settings.allow_cpu())


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    try:
        ranks = requested_ranks(metafunc.definition, metafunc.cls)
    except MarkerError:
        return  # the test reports it when set up
    if ranks is None or not ranks.listed or deepspeed.is_distributed_test(metafunc.cls):
        return
    if SIZE_PARAM not in metafunc.fixturenames:
        metafunc.fixturenames.append(SIZE_PARAM)
    metafunc.parametrize(SIZE_PARAM, ranks.sizes, ids=[size_id(s) for s in ranks.sizes])


@pytest.hookimpl(trylast=True)  # after a conftest's hook, which may add the marker in bulk
def pytest_collection_modifyitems(items: list) -> None:
    for item in items:
        if isinstance(item, pytest.Function):
            _classify(item)
    if any(item.stash.get(RANKS, None) is not None for item in items):
        # What a rank needs to run a call, imported once in the forkserver (it starts with the
        # first test) instead of in every rank of every test.
        forkserver.preload(rank_program.__name__)


def _classify(item: pytest.Function) -> None:
    try:
        ranks = requested_ranks(item, item.cls)
    except MarkerError as error:
        item.stash[stash.PROBLEM] = str(error)
        return
    if ranks is None:
        return
    callspec = getattr(item, "callspec", None)
    if ranks.listed and callspec is not None and SIZE_PARAM in callspec.params:
        ranks = dataclasses.replace(ranks, sizes=(callspec.params[SIZE_PARAM],))
    elif ranks.listed and not deepspeed.is_distributed_test(item.cls):
        item.stash[stash.PROBLEM] = (
            f"@pytest.mark.ranks({list(ranks.sizes)}) added after collection (a conftest's "
            "pytest_collection_modifyitems): pytest made this test's items already; one per "
            "world size needs the marker at collection (decorator or pytestmark); a single "
            "size works from there"
        )
        return
    clash = _rank_fixture_clash(item, ranks)
    if clash is not None:
        item.stash[stash.PROBLEM] = clash
        return
    item.stash[RANKS] = ranks
    try:
        skips = [place(ranks, size).skip for size in ranks.sizes]
    except settings.HarnessConfigError as error:
        item.stash[stash.PROBLEM] = str(error)
        return
    reason = next((skip for skip in skips if skip), None)
    if reason is not None:
        item.add_marker(pytest.mark.skip(reason=reason))


def _rank_fixture_clash(item: pytest.Function, ranks: Ranks) -> Optional[str]:
    """A name the ranks give their own value (RANK_OWN) that the user gives another in a
    ranked test, a parameter or a fixture of theirs: said in one line, where the rank's value
    would silently replace the user's. (A listed marker's own `world_size` is no clash.)"""
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    for name in RANK_OWN:
        if name in params and not (name == SIZE_PARAM and ranks.listed):
            return (f"parametrize({name!r}, ...) on a ranked test: {name!r} is the rank's own "
                    "fixture there; rename the parameter")
        home = pytest_internals.fixture_home(item, name) if name in item.fixturenames else None
        if name not in params and home not in (None, fixtures_module.__name__):
            return (f"fixture {name!r} of {home} in a ranked test: {name!r} is the rank's own "
                    "fixture there (the harness's); rename yours")
    return None


@pytest.hookimpl(wrapper=True, trylast=True)  # inside the other plugins' set-up wrappers
def pytest_runtest_setup(item: pytest.Item) -> Any:
    problem = item.stash.get(stash.PROBLEM, None)
    if problem is not None:
        pytest.fail(problem, pytrace=False)
    result = yield  # pytest resolves the fixtures
    ranks = item.stash.get(RANKS, None)
    if ranks is not None and isinstance(item, pytest.Function):
        unsendable = None
        try:
            item.stash[stash.CALL] = build_call(item, ranks)
        except CallError as error:
            unsendable = str(error)
        if unsendable is not None:  # outside the except: one message, not a chain of two
            pytest.fail(unsendable, pytrace=False)
        if not item.config.getoption("setuponly", False):
            _start_in_set_up(item, ranks)
    return result


def _start_in_set_up(item: pytest.Function, ranks: Ranks) -> None:
    """Start the ranks now (a DistributedTest's first world size) and wait until each rank's
    own fixtures are set up: a `@rank_fixture` that fails there is this phase's error
    ("ERROR at setup", counted with the errors, JUnit's <error>), as a fixture of pytest's
    is; otherwise the call phase joins the ranks (`pytest_pyfunc_call`)."""
    try:
        started = start_placed(item.stash[stash.CALL], ranks, ranks.sizes[0],
                               item.stash.get(stash.DEADLINE, None))
    except (Exception, pytest.skip.Exception) as error:
        # Ranks that cannot start (a forkserver that failed, a placement that skips) are the
        # call's outcome, where they have always been reported.
        item.stash[stash.START_ERROR] = error
        return
    item.stash[stash.STARTED] = started
    finished = started.wait_for_set_up()
    lead = finished.report.own.lead if finished is not None else None
    if finished is not None and finished.report.failed and lead is not None \
            and lead.phase == "setup":
        item.stash.setdefault(stash.RECORDS, []).extend(finished.records)
        raise raised_for(finished.report)


def _argnames(function: Any) -> Tuple[str, ...]:
    """The parameters pytest fills from fixtures (no defaults, no *args)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(
        p.name for p in inspect.signature(function).parameters.values()
        if p.kind in kinds and p.default is inspect.Parameter.empty
    )


def build_call(item: pytest.Function, ranks: Ranks) -> FunctionCall:
    """The FunctionCall every rank of `item` gets, from the fixtures pytest resolved here."""
    funcargs: Dict[str, Any] = dict(item.funcargs)
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    indices = callspec.indices if callspec is not None else {}
    module, qualname = item.module.__name__, _qualname(item)
    path = getattr(item.module, "__file__", None)
    argnames = _argnames(item.obj)
    used = tuple(name for name in item.fixturenames  # by @pytest.mark.usefixtures
                 if name not in argnames and isinstance(funcargs.get(name), FixtureRef))
    values: Dict[str, Any] = {}
    marked: Dict[str, int] = {}
    refs: Dict[str, FixtureRef] = {}
    base: Optional[str] = None
    todo = [*used, *argnames]
    while todo:
        name = todo.pop(0)
        if name in values or name in marked or name in refs or name in IN_RANK_BUILTINS:
            continue
        if name == "request":
            raise CallError(
                "fixture 'request' belongs to the pytest process and cannot reach the ranks: "
                "ask for the fixtures you need by name (or use @harness.rank_fixture)"
            )
        value = funcargs.get(name)
        if name in RANK_OWN:
            base = value.base if isinstance(value, InRank) and value.base else base
            continue
        if isinstance(value, FixtureRef):
            for resolved_name, resolved in value.resolved:  # an autouse one's arguments
                funcargs.setdefault(resolved_name, resolved)
            refs[name] = dataclasses.replace(value, resolved=())
            todo.extend(value.argnames)
            continue
        if name in params and params[name] is value and name in indices:
            found, marker_value = marked_param(module, qualname, name, indices[name], path)
            if found and marker_value is value:
                marked[name] = indices[name]
                continue
        if name not in funcargs:
            raise CallError(f"fixture {name!r} of {item.nodeid} was not resolved")
        if ranks.mode != "threads":
            check_sendable(name, value)
        values[name] = value
    timeout = ranks.timeout or settings.default_timeout()
    return FunctionCall(
        test_id=item.nodeid, module=module, qualname=qualname, module_path=path,
        argnames=argnames, used_fixtures=used,
        values=values, marked=marked, rank_fixtures=refs, init=ranks.init,
        group_timeout=timeout + GROUP_TIMEOUT_MARGIN_S, rank_tmp_base=base,
        sizes=ranks.sizes, skip_leak_checks=tuple(ranks.skip_leak_checks),
    )


def _qualname(item: pytest.Function) -> str:
    name = getattr(item, "originalname", None) or item.name
    return f"{item.cls.__qualname__}.{name}" if item.cls is not None else name


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Optional[bool]:
    call = pyfuncitem.stash.get(stash.CALL, None)
    if call is None:
        return None
    ranks = pyfuncitem.stash[RANKS]
    deadline = pyfuncitem.stash.get(stash.DEADLINE, None)
    started = pyfuncitem.stash.get(stash.STARTED, None)
    start_error = pyfuncitem.stash.get(stash.START_ERROR, None)
    if start_error is not None:
        del pyfuncitem.stash[stash.START_ERROR]
        raise start_error
    records: list = []
    try:
        sizes = list(ranks.sizes)  # one, but a DistributedTest's list runs in turn
        if started is not None:  # set-up started the ranks of the first: join them
            raise_outcome(started.finish(deadline), records)
            sizes = sizes[1:]
        for size in sizes:
            run_placed(call, ranks, size, deadline, records)
    except RanksFailure as error:
        lead = error.lead
        if lead is not None and lead.phase == "teardown":  # the test passed: its teardown's
            pyfuncitem.stash[stash.TEARDOWN_ERROR] = error
            return True
        raised = report.as_raised_in_the_rank(error, lead, pyfuncitem)  # xfail(raises=...)
        if raised is error:
            raise
        raise raised from None
    finally:  # after what a pool fixture's calls left there during set-up
        pyfuncitem.stash.setdefault(stash.RECORDS, []).extend(records)
    return True


def run_placed(
    call: FunctionCall, ranks: Ranks, world_size: int, deadline: Optional[float],
    records: list, pool: bool = False,
) -> None:
    """Run `call` on `world_size` ranks at once (`start_placed`, then join them); the
    outcome as `raise_outcome` raises it."""
    raise_outcome(start_placed(call, ranks, world_size, deadline, pool).finish(deadline),
                  records)


def start_placed(
    call: FunctionCall, ranks: Ranks, world_size: int, deadline: Optional[float],
    pool: bool = False,
) -> StartedRun:
    """Start `call` on `world_size` ranks where `ranks` puts them on this machine (their
    devices leased until the run is finished; shared sets keyed by that placement, `pool`'s
    apart); a placement that cannot run here is pytest's skip."""
    where = place(ranks, world_size)
    if where.skip is not None:
        pytest.skip(where.skip)
    resources = contextlib.ExitStack()
    held = resources.enter_context(
        leases.lease(where.device_type, world_size, settings.accelerator_count()))
    placed = dataclasses.replace(
        call, device_type=where.device_type, devices=held, backend=where.backend
    )
    key = None
    if ranks.mode == "shared":
        key = SharedKey(call.module, world_size, where.device_type, held, where.backend,
                        call.init, pool)
    try:
        return StartedRun(placed, ranks.mode, world_size, ranks.timeout, deadline, key,
                          resources)
    except BaseException:
        resources.close()
        raise


def raise_outcome(run: FunctionRun, records: list) -> None:
    """The ranks' records go into `records`; their failure is raised (`RanksFailure`), then a
    thread rank's leak of process state (an AssertionError, as a class's tearDown raises it),
    and their skip is pytest's."""
    records.extend(run.records)
    outcome = run.report
    if outcome.failed:
        raise raised_for(outcome)
    if run.leaked is not None:
        raise AssertionError(run.leaked)
    if outcome.status == SKIPPED:
        if outcome.message.startswith(IMPERATIVE_XFAIL):
            pytest.xfail(outcome.message[len(IMPERATIVE_XFAIL):])
        pytest.skip(outcome.message)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: Optional[pytest.Item]) -> Any:
    """Before pytest's teardown, ranks that set-up started and no call joined (the test ended
    in its set-up) are stopped. After it: a `@rank_fixture`'s teardown error in a rank is raised
    (pytest reports "ERROR at teardown"); a module's shared ranks stop after its last test
    (their "ranks" fixtures end there)."""
    started = item.stash.get(stash.STARTED, None)
    if started is not None:
        del item.stash[stash.STARTED]
        started.close()
    try:
        result = yield
    finally:  # pytest's own teardown error, if any, is the one reported
        _stop_the_modules_shared_ranks(item, nextitem)
        error = item.stash.get(stash.TEARDOWN_ERROR, None)
        if error is not None:
            del item.stash[stash.TEARDOWN_ERROR]
    if error is not None:
        raise error
    return result


def _stop_the_modules_shared_ranks(item: pytest.Item, nextitem: Optional[pytest.Item]) -> None:
    ranks = item.stash.get(RANKS, None)
    module = getattr(item, "module", None)
    if ranks is None or ranks.mode != "shared" or module is None:
        return
    if nextitem is None or getattr(nextitem, "module", None) is not module:
        shared.OPEN_RANKS.stop_where(
            lambda key: isinstance(key, SharedKey) and key.module == module.__name__
            and not key.pool
        )
