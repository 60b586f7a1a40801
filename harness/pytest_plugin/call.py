"""`FunctionCall`: one marked test as its ranks receive it, and the rules both sides share.

The parent builds it once pytest has resolved the test's fixtures (`build_call`); every rank
gets the same record (harness/launch/context.py `RankContext.inputs`) and makes the call
itself (harness/pytest_plugin/in_rank.py). Nothing in it is a function object: the test is
found in the rank by module and qualified name, a `@rank_fixture` by module and name, and a
`pytest.mark.parametrize` value by its index in the marker (`marked_param`), so that values
that cannot be pickled (a lambda, a local class) still reach the ranks. Every other fixture
value travels by value; one that cannot is a one-line error naming the fixture.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from types import ModuleType
from typing import Any, Dict, Optional, Tuple

import pytest

from harness.single_process.pytest_marks import marks_on

# Fixtures every rank builds for itself: its identity, and pytest's own fixtures that act
# inside the rank (patches, captures, log records and warnings of the rank's code).
RANK_OWN = ("rank", "world_size", "device", "rank_tmp_path", "init_method")
IN_RANK_BUILTINS = ("monkeypatch", "capsys", "capfd", "caplog", "recwarn")
RANK_SCOPES = ("function", "ranks")
# `pytest.xfail(reason)` called in a rank travels as the ranks' skip, its reason after this
# prefix; the parent makes it pytest's xfail again.
IMPERATIVE_XFAIL = "pytest.xfail: "
_PARAMETER_SET = type(pytest.param(None))


class CallError(ValueError):
    """A marked test whose call cannot be sent to its ranks (one line: what, and the fix)."""


@dataclass(frozen=True)
class FixtureRef:
    """A `@rank_fixture`, as the rank finds it: the module that defines it and its name."""

    module: str
    name: str
    scope: str
    argnames: Tuple[str, ...]
    path: Optional[str] = None  # the module's file, where its name cannot be imported
    # an autouse one: its arguments as the pytest process resolved them (name, value); pytest
    # did not, as it asks for none, so that it never resolves `rank` for a test without ranks
    resolved: Tuple[Tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class FunctionCall:
    """What every rank of one marked test needs to make the call."""

    test_id: str  # pytest's node id, for messages and the report
    module: str
    qualname: str  # `test_x`, or `TestX.test_x` for a method (a fresh instance per test)
    argnames: Tuple[str, ...]  # the test's parameters, in order
    # rank fixtures the test uses without taking them (usefixtures): built first
    used_fixtures: Tuple[str, ...] = ()
    module_path: Optional[str] = None  # the module's file, where its name cannot be imported
    values: Dict[str, Any] = field(default_factory=dict)  # fixtures resolved in the parent
    marked: Dict[str, int] = field(default_factory=dict)  # parametrize args: name -> index
    rank_fixtures: Dict[str, FixtureRef] = field(default_factory=dict)
    device_type: str = "cpu"
    devices: Tuple[int, ...] = ()  # the accelerator index of each rank (empty on CPU)
    backend: str = "gloo"
    init: bool = True
    group_timeout: float = 1800.0  # the default group's timeout, beyond the test's own
    rank_tmp_base: Optional[str] = None  # `rank_tmp_path` is <base>/rank<N>
    sizes: Tuple[int, ...] = ()  # DistributedTest: the world sizes run in turn in one test
    skip_leak_checks: Tuple[str, ...] = ()  # shared ranks: the leak checks the test waives
    # a RankPool call: `fn(rank, world_size, *pool_args, **values)` (fn: pool.py's `_in_rank`),
    # each rank's pickled value left in <result_dir>/rank<N>.pkl for the parent
    pool_args: Optional[Tuple[Any, ...]] = None
    result_dir: Optional[str] = None


def result_path(result_dir: str, rank: int) -> str:
    """Where rank `rank` of a rank_pool call leaves its return value."""
    return os.path.join(result_dir, f"rank{rank}.pkl")


def import_module(name: str, path: Optional[str] = None) -> ModuleType:
    """Module `name` from file `path`: imported by name, unless that fails or finds another
    file (pytest's --import-mode=importlib keeps test folders off sys.path, where a `tests`
    package of another project may answer to the name); then loaded from `path` under that
    name, as pytest loaded it."""
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError:
        if not path or not os.path.exists(path):
            raise
    else:
        found = getattr(module, "__file__", None)
        if not path or not os.path.exists(path) or (
            found and os.path.realpath(found) == os.path.realpath(path)
        ):
            return module
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def find_target(module: str, qualname: str, path: Optional[str] = None) -> Any:
    """The test function (or `Class.method`, as a bound method of a new instance)."""
    owner: Any = import_module(module, path)
    parts = qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    if isinstance(owner, type):
        owner = owner()
    return getattr(owner, parts[-1])


def marked_param(
    module: str, qualname: str, name: str, index: int, path: Optional[str] = None
) -> Tuple[bool, Any]:
    """(True, value) of argument `name` at `index` of the `pytest.mark.parametrize` that
    declares it (on the function, its class or its module); (False, None) if none does."""
    target: Any = import_module(module, path)
    owners = [target]
    for part in qualname.split("."):
        target = getattr(target, part, None)
        owners.insert(0, target)
    for owner in owners:
        for mark in marks_on(owner):
            if getattr(mark, "name", None) != "parametrize" or len(mark.args) < 2:
                continue
            names = mark.args[0]
            names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
            values = list(mark.args[1])
            if name not in names or index >= len(values):
                continue
            value = values[index]
            if isinstance(value, _PARAMETER_SET):  # pytest.param(...)
                value = value.values if len(names) > 1 else value.values[0]
            return True, value if len(names) == 1 else tuple(value)[names.index(name)]
    return False, None


def check_sendable(name: str, value: Any) -> None:
    """CallError unless `value` (fixture `name`'s) can be sent to a rank process."""
    try:
        ForkingPickler.dumps(value)
    except Exception as error:  # noqa: BLE001 - any pickling failure means the same to the user
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CallError(
            f"fixture {name!r} ({shown}) cannot be sent to the rank processes ({reason}): build "
            "it in each rank with @harness.rank_fixture, or use mode='threads'"
        ) from None
