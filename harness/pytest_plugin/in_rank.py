"""Inside a rank: a marked test's arguments built from its FunctionCall, the call, the teardown.

Each argument is one of: the rank's own fixtures (`rank`, `world_size`, `device`,
`rank_tmp_path`, `init_method`), pytest's fixtures that act in the rank (`monkeypatch`,
`capsys`, `capfd`, `caplog`, `recwarn`: harness/pytest_plugin/captures.py), a `@rank_fixture`
(built here from its function, its own arguments resolved the same way, its generator
finished at teardown), a `pytest.mark.parametrize` value read from the marker, or a value the
parent sent. Teardown runs in reverse order of set-up, as pytest's. A "ranks"-scoped rank
fixture lives as long as the rank process when the ranks are shared (`RanksScope`).

`pytest.skip` in a rank is unittest's skip (so the ranks' verdict counts it), `pytest.xfail`
a skip whose reason says so (IMPERATIVE_XFAIL), `pytest.fail` a failed assertion with its
message. An error while the arguments are built, or torn down after a test that passed, is a
FixtureError: pytest reports it as "ERROR at setup" or "ERROR at teardown", as for its own
fixtures.
"""

from __future__ import annotations

import contextlib
import inspect
import unittest
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import pytest
import torch

from harness.outcome.rank_record import FixtureError
from harness.pytest_plugin import captures
from harness.pytest_plugin.call import (
    IMPERATIVE_XFAIL,
    IN_RANK_BUILTINS,
    FixtureRef,
    FunctionCall,
    find_target,
    marked_param,
    result_path,
)
from harness.pytest_plugin.deepspeed import DistributedTest
from harness.pytest_plugin.fixtures import rank_fixture_function

# unittest and pytest hide frames of modules that define these: a failure points at the
# user's line, not at how the rank called it.
__unittest = True
__tracebackhide__ = True


class RanksScope:
    """The "ranks"-scoped rank fixtures of this rank process: built once, torn down when the
    process's set of ranks ends (`close`)."""

    def __init__(self) -> None:
        self.values: Dict[Tuple[str, str], Any] = {}
        self.teardown = contextlib.ExitStack()

    def close(self) -> None:
        self.values.clear()
        self.teardown.close()


RANKS_SCOPE = RanksScope()  # this process's; a shared rank closes it when its set ends


def rank_device(call: FunctionCall, rank: int) -> torch.device:
    """The device `rank` of `call` computes on."""
    if call.device_type == "cpu" or not call.devices:
        return torch.device("cpu")
    return torch.device(call.device_type, call.devices[rank])


class Arguments:
    """One rank's fixture values for one call, built on demand; `teardown` undoes them."""

    def __init__(
        self, call: FunctionCall, rank: int, world_size: int, init_method: str,
        keep_ranks_scope: bool,
    ) -> None:
        self.call, self.rank, self.world_size = call, rank, world_size
        self.init_method = init_method
        self.keep_ranks_scope = keep_ranks_scope
        self.teardown = contextlib.ExitStack()
        self._built: Dict[str, Any] = {}

    def build(self, call: FunctionCall) -> Dict[str, Any]:
        """The test's arguments, after the rank fixtures it uses without taking them."""
        for name in call.used_fixtures:
            self.value(name)
        return {name: self.value(name) for name in call.argnames}

    def value(self, name: str, asked_by: str = "") -> Any:
        if name not in self._built:
            self._built[name] = self._build(name, asked_by)
        return self._built[name]

    def _build(self, name: str, asked_by: str) -> Any:
        call = self.call
        own = self._own(name)
        if own is not None:
            return own()
        if name in IN_RANK_BUILTINS:
            fixture = captures.make(name)
            self.teardown.callback(fixture.close)
            return fixture
        if name in call.rank_fixtures:
            return self._rank_fixture(call.rank_fixtures[name])
        if name in call.marked:
            found, value = marked_param(
                call.module, call.qualname, name, call.marked[name], call.module_path
            )
            if found:
                return value
        if name in call.values:
            return call.values[name]
        who = f"{asked_by!r}" if asked_by else call.test_id
        raise LookupError(f"fixture {name!r} (asked by {who}) is not available in the rank")

    def _own(self, name: str) -> Optional[Callable[[], Any]]:
        own: Dict[str, Callable[[], Any]] = {
            "rank": lambda: self.rank,
            "world_size": lambda: self.world_size,
            "device": lambda: rank_device(self.call, self.rank),
            "rank_tmp_path": self._rank_tmp_path,
            "init_method": self._init_method,
        }
        return own.get(name)

    def _rank_tmp_path(self) -> Path:
        base = self.call.rank_tmp_base
        assert base is not None, "the parent made no rank_tmp_path folder"
        path = Path(base) / f"rank{self.rank}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _init_method(self) -> str:
        if not self.init_method:
            raise LookupError(
                "init_method: threads share one process and have no rendezvous; use init=True "
                "(the default group on the threaded backend)"
            )
        return self.init_method

    def _rank_fixture(self, ref: FixtureRef) -> Any:
        scoped = ref.scope == "ranks" and self.keep_ranks_scope
        key = (ref.module, ref.name)
        if scoped and key in RANKS_SCOPE.values:
            return RANKS_SCOPE.values[key]
        function = rank_fixture_function(ref.module, ref.name, ref.path)
        kwargs = {arg: self.value(arg, ref.name) for arg in ref.argnames}
        value = function(**kwargs)
        if inspect.isgenerator(value):
            generator = value
            value = next(generator)
            stack = RANKS_SCOPE.teardown if scoped else self.teardown
            stack.callback(_finish, generator, ref.name)
        if scoped:
            RANKS_SCOPE.values[key] = value
        return value


def _finish(generator: Any, name: str) -> None:
    try:
        next(generator)
    except StopIteration:
        return
    raise RuntimeError(f"rank fixture {name!r} yielded more than once")


def call_in_rank(
    call: FunctionCall, rank: int, world_size: int, init_method: str,
    keep_ranks_scope: bool = False, set_up_done: Callable[[], None] = lambda: None,
) -> None:
    """Build the test's arguments in this rank, say so (`set_up_done`), call the test, tear
    the arguments down."""
    target = find_target(call.module, call.qualname, call.module_path)
    if isinstance(getattr(target, "__self__", None), DistributedTest):
        target.__self__.world_size = world_size  # this size, of a class that lists several
    if call.pool_args is not None:
        _pool_call(call, target, rank, world_size)
        return
    arguments = Arguments(call, rank, world_size, init_method, keep_ranks_scope)
    with arguments.teardown:  # a failed test: its failure leads, a teardown error chained
        kwargs = _in_phase("setup", call, lambda: arguments.build(call))
        set_up_done()
        _as_unittest(lambda: target(**kwargs))
        teardown = arguments.teardown.pop_all()
    _in_phase("teardown", call, teardown.close)


def _in_phase(phase: str, call: FunctionCall, body: Callable[[], Any]) -> Any:
    """`body()`, the test's fixtures' `phase` in this rank: an error there is a FixtureError,
    which pytest reports as "ERROR at <phase>", as for its own fixtures."""
    try:
        return _as_unittest(body)
    except unittest.SkipTest:
        raise
    except Exception as error:
        raise FixtureError(phase, f"{phase} of {call.test_id} failed") from error


def _pool_call(call: FunctionCall, target: Any, rank: int, world_size: int) -> None:
    """A pool's call (harness/pytest_plugin/pool.py `_in_rank`, which returns `fn`'s value
    already pickled, so that a value that cannot travel is named by `fn`'s name): its bytes,
    left for the parent."""
    data = _as_unittest(lambda: target(rank, world_size, *(call.pool_args or ()), **call.values))
    assert call.result_dir is not None and isinstance(data, bytes)
    with open(result_path(call.result_dir, rank), "wb") as f:
        f.write(data)


class Failed(AssertionError):
    """`pytest.fail(msg)` in a rank: a failure (an AssertionError to unittest) that reads as
    pytest's own, `Failed: msg`."""


Failed.__module__ = "builtins"  # printed as `Failed: msg`, as pytest prints its own


def _as_unittest(body: Callable[[], Any]) -> Any:
    """`body()`, with pytest's outcome exceptions (BaseExceptions unittest would count as
    errors) raised as the unittest outcomes they mean, their traceback kept (the report
    points at the user's `pytest.fail` line)."""
    try:
        return body()
    except pytest.skip.Exception as skip:
        raise unittest.SkipTest(skip.msg).with_traceback(skip.__traceback__) from None
    except pytest.xfail.Exception as xfail:  # before pytest.fail's: it is one of them
        raise unittest.SkipTest(IMPERATIVE_XFAIL + xfail.msg).with_traceback(
            xfail.__traceback__) from None
    except pytest.fail.Exception as failure:
        raise Failed(failure.msg).with_traceback(failure.__traceback__) from None
