"""The `rank_pool` fixture: for code written around a process pool (torchmetrics' style).

`rank_pool.run(fn, *args, world_size=2, ...)` calls `fn(rank, world_size, *args, **kwargs)`
in every rank and returns the ranks' return values, in rank order. It is a marked test's
run with a call of its own: the same launchers (shared ranks by default, so consecutive calls
reuse one set, as a session pool does), the same report when a rank fails (the calling test
fails with it, the rank named), the same timeouts. `fn` is found in each rank by module and
name, so it must be a module-level function; its arguments and return values travel pickled.
"""

from __future__ import annotations

import inspect
import pickle
import shutil
import sys
import tempfile
from typing import Any, Callable, List, Optional

import pytest

from harness import devices
from harness.pytest_plugin import stash
from harness.pytest_plugin.call import FunctionCall, check_sendable, result_path
from harness.pytest_plugin.functions import GROUP_TIMEOUT_MARGIN_S, run_placed
from harness.pytest_plugin.marker import MarkerError, Ranks, check, world_sizes

# pytest shows a bad call or a rank's failure at the test's `rank_pool.run(...)` line, not in
# the pool's own code.
__tracebackhide__ = True


class RankPool:
    """Runs module-level functions on a set of ranks for the test that asked for it."""

    def __init__(self, node: pytest.Item) -> None:
        self._node = node

    def __repr__(self) -> str:
        return f"<rank_pool of {self._node.nodeid}>"

    def run(
        self, fn: Callable[..., Any], *args: Any, world_size: int = 2, mode: str = "shared",
        device: str = "auto", init: bool = True, timeout: Optional[float] = None,
        backend: Optional[str] = None, **kwargs: Any,
    ) -> List[Any]:
        """`fn(rank, world_size, *args, **kwargs)` in every rank; their values in rank order."""
        _check_module_level(fn)
        sizes, _ = world_sizes(world_size, "rank_pool.run")
        ranks = Ranks(sizes, mode=mode, device=device, backend=backend, init=init,
                      timeout=timeout)
        try:
            check(ranks, "rank_pool.run")
        except MarkerError as error:
            raise ValueError(str(error)) from None
        if mode != "threads":
            for index, value in enumerate(args):
                check_sendable(f"rank_pool.run argument {index}", value)
            for name, value in kwargs.items():
                check_sendable(f"rank_pool.run argument {name}", value)
        result_dir = tempfile.mkdtemp(prefix="harness-pool-")
        try:
            call = FunctionCall(
                test_id=self._node.nodeid, module=fn.__module__, qualname=fn.__qualname__,
                module_path=fn.__code__.co_filename,
                argnames=(), values=dict(kwargs), init=init,
                group_timeout=(timeout or devices.default_timeout()) + GROUP_TIMEOUT_MARGIN_S,
                pool_args=tuple(args), result_dir=result_dir,
            )
            run_placed(call, ranks, world_size, self._node.stash.get(stash.DEADLINE, None),
                       self._node.stash.setdefault(stash.RECORDS, []), pool=True)
            values = []
            for rank in range(world_size):
                with open(result_path(result_dir, rank), "rb") as f:
                    values.append(pickle.load(f))
            return values
        finally:
            shutil.rmtree(result_dir, ignore_errors=True)


def _check_module_level(fn: Any) -> None:
    """TypeError (one line) unless `fn` is a function each rank can find by module and name."""
    name = getattr(fn, "__qualname__", repr(fn))
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    found = module
    for part in name.split("."):
        found = getattr(found, part, None)
    if not inspect.isfunction(fn) or "<" in name or found is not fn:
        raise TypeError(
            f"rank_pool.run: {name} is not a module-level function; each rank finds the "
            "function by module and name, so define it at the top level of a module"
        )


@pytest.fixture
def rank_pool(request: pytest.FixtureRequest) -> RankPool:
    """Run module-level functions on ranks: `rank_pool.run(fn, *args, world_size=2)`."""
    return RankPool(request.node)


