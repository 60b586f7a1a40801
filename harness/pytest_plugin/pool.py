"""`harness.RankPool` and the `rank_pool` fixture: for code written around a process pool.

Projects that test distributed code with a pool of their own (torchmetrics' session pool,
`pytest.pool.starmap(fn, [(rank, 2) for rank in range(2)])`) call it from helpers and base
classes, not only from tests. A `RankPool` is that pool on the harness's launchers: made
anywhere (a conftest's `pytest_configure`, a helper), its ranks started at first use and
stopped with the session; each call is a marked test's run with a call of its own: the same
report when a rank fails (the calling test fails with it, the rank named), the same
timeouts, the ranks' output in the calling test's report.

How a call reaches the ranks: the pool sends the call of `_in_rank` (below), a module-level
function of this module, with what the ranks need to find `fn` themselves (`_Target`: its
module and qualified name, a partial's bound arguments by value) and the call's shape (run,
map, starmap). So every pool, whatever `fn`'s module, is one kind of call: pools with equal
options key their shared ranks alike (harness/pytest_plugin/run.py `SharedKey`) and share
one set. Each rank pickles `fn`'s value itself, so a value that cannot travel is named by
`fn`'s name.

The pool needs pytest's test for a call's deadline (pytest-timeout) and for the ranks'
output; this module is registered as a plugin, and its hooks keep the running session and
test, so a pool called from a helper finds them.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import pickle
import shutil
import sys
import tempfile
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import pytest

from harness import settings
from harness.pytest_plugin import stash
from harness.pytest_plugin.call import FunctionCall, import_module, result_path
from harness.pytest_plugin.functions import GROUP_TIMEOUT_MARGIN_S, run_placed
from harness.pytest_plugin.marker import MarkerError, Ranks, check

# A bad call or a rank's failure shows at the test's `pool.run(...)` line, not in the pool's
# code (pytest's rule); in a rank, the traceback starts at `fn` (unittest's rule, which the
# ranks' reports follow).
__tracebackhide__ = True
__unittest = True

OPTIONS = ("mode", "device", "init", "timeout", "skip_leak_checks")


class UnknownOptionError(TypeError, ValueError):
    """A keyword RankPool does not take: a TypeError, as Python's own for an unexpected
    keyword, and a ValueError, as the `ranks` marker's unknown option."""


class _Now:
    """What pytest is doing, as this plugin's hooks see it: the sessions running (pytester
    nests them), whether one ended, and the test running now."""

    def __init__(self) -> None:
        self.sessions: List[pytest.Session] = []
        self.ended = False
        self.items: List[pytest.Item] = []


_NOW = _Now()


@pytest.hookimpl(tryfirst=True)  # before a conftest's own, which may use its pool
def pytest_sessionstart(session: pytest.Session) -> None:
    """From here on a pool runs (a conftest's `pytest_sessionstart` may already call one)."""
    _NOW.sessions.append(session)


@pytest.hookimpl(wrapper=True, tryfirst=True)  # after every other: a conftest's may close it
def pytest_sessionfinish(session: pytest.Session) -> Any:
    """Once the session's fixtures and hooks are done, a pool refuses calls: its ranks stop
    with the session (the plugin's pytest_unconfigure)."""
    try:
        return (yield)
    finally:
        if session in _NOW.sessions:  # not if a plugin's start failed before ours
            _NOW.sessions.remove(session)
        _NOW.ended = True


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Any:
    """The test running now: a pool called from a helper runs its call for that test."""
    _NOW.items.append(item)
    try:
        return (yield)
    finally:
        _NOW.items.pop()


@dataclass(frozen=True)
class _Target:
    """`fn` as a rank finds it: a module-level function by module and qualified name (and
    the module's file, where the name alone does not import it), and a partial's bound
    arguments, sent by value."""

    module: str
    qualname: str
    path: Optional[str]
    args: Tuple[Any, ...] = ()
    keywords: Tuple[Tuple[str, Any], ...] = ()

    def function(self) -> Callable[..., Any]:
        """In a rank: the function, with the partial's arguments bound again."""
        found: Any = import_module(self.module, self.path)
        for part in self.qualname.split("."):
            found = getattr(found, part)
        if self.args or self.keywords:
            return functools.partial(found, *self.args, **dict(self.keywords))
        return found


def _target(fn: Any, what: str) -> _Target:
    """`fn` as the ranks will find it; TypeError (one line, `fn` named by its qualified name,
    never by its arguments' repr) unless it is a module-level function or a partial of one."""
    function = fn.func if isinstance(fn, functools.partial) else fn
    name = getattr(function, "__qualname__", None) or f"a {type(function).__qualname__} object"
    module = sys.modules.get(getattr(function, "__module__", None) or "")
    found: Any = module
    for part in name.split("."):
        found = getattr(found, part, None)
    if not inspect.isfunction(function) or "<" in name or found is not function:
        shown = f"functools.partial of {name}" if function is not fn else name
        raise TypeError(
            f"{what}: {shown} is not a module-level function; each rank finds the function "
            "by module and name, so define it at the top level of a module (a "
            "functools.partial of such a function works too)"
        )
    if isinstance(fn, functools.partial):
        return _Target(function.__module__, name, function.__code__.co_filename,
                       tuple(fn.args), tuple(fn.keywords.items()))
    return _Target(function.__module__, name, function.__code__.co_filename)


def _check_size(world_size: Any, what: str) -> int:
    """`world_size`, unless it is not a number of ranks (a one-line error saying why)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"{what}: world size {world_size!r} is not an int")
    if world_size < 1:
        raise ValueError(f"{what}: world size {world_size} is below 1; a pool needs a rank")
    return world_size


def _check_sendable(what: str, value: Any) -> None:
    """TypeError (one line, the value named by its type) unless `value` can be sent to a
    rank process."""
    try:
        ForkingPickler.dumps(value)
    except Exception as error:  # noqa: BLE001 - any pickling failure means the same to the user
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise TypeError(
            f"{what} ({type(value).__name__}) cannot be sent to the rank processes ({reason}): "
            "send what each rank can build it from, or use mode='threads'"
        ) from None


class RankPool:
    """A pool of ranks, in `multiprocessing.Pool`'s shape, usable anywhere a test runs.

    `RankPool(world_size=2, *, mode="shared", device="auto", init=True, timeout=None,
    skip_leak_checks=())`: the options mean what the `ranks` marker's do, and are fixed here,
    so that every keyword of a call reaches `fn`. Pools made with equal options share one set
    of shared ranks (a helper that makes a pool per call starts no more processes); the set
    starts at the first call and stops with the session.

    - `run(fn, *args, **kwargs)`: `fn(rank, world_size, *args, **kwargs)` in every rank.
      `fn` gets the world size positionally, so `world_size=N` on `run` is the pool's and
      not `fn`'s: it runs the call on the set of N ranks with the pool's other options.
    - `map(fn, items)`: `fn(items[r])` in rank r; `starmap(fn, items)`: `fn(*items[r])`;
      one item per rank.

    Each returns the ranks' values in rank order, with the default group initialised as the
    pool's `init` says. `fn` is a module-level function or a `functools.partial` of one (the
    ranks find the function by module and name; the partial's arguments, and the call's,
    travel pickled). A rank's exception fails the calling test with the ranks' report.
    """

    def __init__(
        self, world_size: int = 2, *, mode: str = "shared", device: str = "auto",
        init: bool = True, timeout: Optional[float] = None,
        skip_leak_checks: Sequence[str] = (), **unknown: Any,
    ) -> None:
        if unknown:  # said as the marker says it, with what is known
            raise UnknownOptionError(
                f"RankPool: unknown option {sorted(unknown)[0]!r} (known: {', '.join(OPTIONS)})"
            )
        _check_size(world_size, "RankPool")
        if isinstance(skip_leak_checks, str):
            skip_leak_checks = (skip_leak_checks,)
        ranks = Ranks((world_size,), mode=mode, device=device, init=init, timeout=timeout,
                      skip_leak_checks=skip_leak_checks)  # type: ignore[arg-type]
        try:
            check(ranks, "RankPool")
        except MarkerError as error:
            raise ValueError(str(error)) from None
        self._ranks = dataclasses.replace(ranks, skip_leak_checks=tuple(skip_leak_checks))
        self._closed = False

    def _options(self) -> Dict[str, Any]:
        return {name: getattr(self._ranks, name) for name in OPTIONS}

    @property
    def world_size(self) -> int:
        """How many ranks each call of `map` and `starmap`, and `run` by default, runs on."""
        return self._ranks.sizes[0]

    def __repr__(self) -> str:
        options = ", ".join(f"{name}={value!r}" for name, value in self._options().items())
        return f"RankPool({self.world_size}, {options})"

    def __call__(self, world_size: Optional[int] = None, **options: Any) -> RankPool:
        """A pool with other options (the fixture's `rank_pool(4, mode="fresh")`); the
        options not given are this pool's."""
        return RankPool(self.world_size if world_size is None else world_size,
                        **{**self._options(), **options})

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """No more calls through this pool (as `multiprocessing.Pool.close`). Its ranks stay
        for the other pools that share them; the session's end stops them."""
        self._closed = True

    def join(self) -> None:
        """Returns at once (as `multiprocessing.Pool.join` after `close`): every call has
        returned by the time it returns, so nothing is pending."""

    def run(
        self, fn: Callable[..., Any], /, *args: Any, world_size: Optional[int] = None,
        **kwargs: Any,
    ) -> List[Any]:
        """`fn(rank, world_size, *args, **kwargs)` in every rank; their values in rank order.
        (`world_size=N`: on N ranks, with this pool's other options.)"""
        size = self.world_size if world_size is None else _check_size(world_size, "RankPool.run")
        return self._call("run", fn, size, args, kwargs, None)

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> List[Any]:
        """`fn(items[r])` in rank r, one item per rank; their values in rank order."""
        return self._call("map", fn, self.world_size, (), {}, self._per_rank("map", items))

    def starmap(self, fn: Callable[..., Any], items: Iterable[Iterable[Any]]) -> List[Any]:
        """`fn(*items[r])` in rank r, one tuple of arguments per rank; their values in rank
        order."""
        per_rank = self._per_rank("starmap", items)
        for index, item in enumerate(per_rank):
            try:
                per_rank[index] = tuple(item)
            except TypeError:
                raise TypeError(
                    f"RankPool.starmap: item {index} ({type(item).__name__}) is not a tuple of "
                    "arguments"
                ) from None
        return self._call("starmap", fn, self.world_size, (), {}, per_rank)

    def _per_rank(self, what: str, items: Iterable[Any]) -> List[Any]:
        """`items` as a list, one per rank (ValueError naming both numbers otherwise)."""
        per_rank = list(items)
        if len(per_rank) != self.world_size:
            raise ValueError(
                f"RankPool.{what}: {len(per_rank)} items for a pool of {self.world_size} ranks; "
                "give one item per rank (item r goes to rank r)"
            )
        return per_rank

    def _call(
        self, shape: str, fn: Callable[..., Any], world_size: int, args: Tuple[Any, ...],
        kwargs: Dict[str, Any], items: Optional[List[Any]],
    ) -> List[Any]:
        """Run one call of `shape` on `world_size` ranks; their values in rank order."""
        what = f"RankPool.{shape}"
        if self._closed:
            raise ValueError(f"{what}: the pool is closed (close() was called); make a new one")
        target = _target(fn, what)
        ranks = dataclasses.replace(self._ranks, sizes=(world_size,))
        if ranks.mode != "threads":  # thread ranks get the very objects
            sent = [*(("argument", i, v) for i, v in enumerate(args)),
                    *(("argument", k, v) for k, v in kwargs.items()),
                    *(("item", i, v) for i, v in enumerate(items or ())),
                    *(("bound argument", i, v) for i, v in enumerate(target.args)),
                    *(("bound argument", k, v) for k, v in target.keywords)]
            for kind, name, value in sent:
                _check_sendable(f"{what}: {kind} {name} of {target.qualname}", value)
        item = _running_test(what)
        result_dir = tempfile.mkdtemp(prefix="harness-pool-")
        try:
            call = FunctionCall(
                test_id=item.nodeid if item is not None else f"{target.module}::{target.qualname}",
                module=__name__, qualname=_in_rank.__name__, module_path=__file__,
                argnames=(), values=dict(kwargs), init=ranks.init,
                group_timeout=(ranks.timeout or settings.default_timeout())
                + GROUP_TIMEOUT_MARGIN_S,
                skip_leak_checks=ranks.skip_leak_checks,
                pool_args=(shape, target, items, *args), result_dir=result_dir,
            )
            deadline = item.stash.get(stash.DEADLINE, None) if item is not None else None
            records = item.stash.setdefault(stash.RECORDS, []) if item is not None else []
            run_placed(call, ranks, world_size, deadline, records, pool=True)
            values = []
            for rank in range(world_size):
                with open(result_path(result_dir, rank), "rb") as f:
                    values.append(pickle.loads(f.read()))
            return values
        finally:
            shutil.rmtree(result_dir, ignore_errors=True)


def _running_test(what: str) -> Optional[pytest.Item]:
    """The test running now (None between tests, as in a conftest's session hooks);
    RuntimeError (one line) where no pytest session runs, before it or after it."""
    if not _NOW.sessions:
        if _NOW.ended:
            raise RuntimeError(
                f"{what}: the pytest session has ended; a pool runs only while the session does"
            )
        raise RuntimeError(
            f"{what}: no pytest session is running (a pool runs while the tests do, with the "
            "harness's pytest plugin)"
        )
    return _NOW.items[-1] if _NOW.items else None


def _in_rank(
    rank: int, world_size: int, shape: str, target: _Target, items: Optional[List[Any]], /,
    *args: Any, **kwargs: Any,
) -> bytes:
    """In a rank: the pool's call in its shape, `fn`'s value pickled here (so that a value
    that cannot travel is named by `fn`'s name). Positional-only, so that every keyword of
    the call is `fn`'s."""
    fn = target.function()
    if shape == "run":
        value = fn(rank, world_size, *args, **kwargs)
    else:
        assert items is not None
        value = fn(items[rank]) if shape == "map" else fn(*items[rank])
    try:
        return pickle.dumps(value)
    except Exception as error:  # noqa: BLE001 - any pickling failure means the same to the user
        raise TypeError(
            f"RankPool.{shape}: {target.qualname} returned {type(value).__name__}, which cannot "
            f"be sent back to the test ({error})"
        ) from None


@pytest.fixture
def rank_pool() -> RankPool:
    """A pool of 2 shared ranks: `rank_pool.run(fn, *args)`; `rank_pool(4, mode="fresh")`
    for other options."""
    return RankPool()
