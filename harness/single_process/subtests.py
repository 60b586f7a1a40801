"""Subtest grids: one test runs a function over a grid of parameters, a `subTest` per point.

A failing point is reported with its parameters (`name=value`) and the other points still run
(upstream stops at the first failing point). As upstream's `run_subtests`, every point starts
and ends with dynamo's caches reset (compile-counter tests count one point's compilations), and
the ranks of a multi-rank test meet after each point; where a default process group is
initialised they also pass a `dist.barrier()`, as upstream's ranks do.
"""

from __future__ import annotations

import itertools
import unittest
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch.distributed as dist

from harness.compat import dynamo as compat_dynamo


def _grid_points(grid: Any) -> Tuple[List[str], List[Tuple[Any, ...]]]:
    if not isinstance(grid, dict):
        raise TypeError(
            f"run_subtests: the grid must be a dict of name -> list of values, "
            f"got {type(grid).__name__}"
        )
    for key, values in grid.items():
        if not isinstance(values, (list, tuple)):
            raise TypeError(
                f"run_subtests: grid[{key!r}] must be a list of values, got {type(values).__name__}"
            )
        if not values:
            raise ValueError(f"run_subtests: grid[{key!r}] is an empty list")
    return list(grid), list(itertools.product(*grid.values()))


def _group_initialised() -> bool:
    return dist.is_available() and dist.is_initialized()


def run_subtests(
    case: unittest.TestCase, grid: Dict[str, Sequence[Any]], fn: Callable, *args: Any, **kwargs: Any
) -> None:
    """Run `fn(*args, **kwargs, **point)` for each point of the grid's Cartesian product.

    Each point runs inside `case.subTest(**point)`, between two dynamo resets. In a rank of a
    multi-rank test (the case has a `rank_context`), the ranks agree after each point through
    `rank_context.grid_point_done(point, passed)`; if they cannot stay in step the rest of the
    grid is abandoned and the test fails saying so. Once they agreed, or in any test with an
    initialised default group, every rank then passes `dist.barrier()`.
    """
    names, combos = _grid_points(grid)
    context = getattr(case, "rank_context", None)
    for combo in combos:
        point = dict(zip(names, combo))
        passed = False
        with case.subTest(**point):
            compat_dynamo.reset_if_loaded()
            try:
                fn(*args, **kwargs, **point)
            except unittest.SkipTest:
                passed = True
                raise
            passed = True
            compat_dynamo.reset_if_loaded()
        if context is not None and not context.grid_point_done(point, passed):
            shown = ", ".join(f"{k}={v!r}" for k, v in point.items())
            case.fail(
                f"ranks could not stay in step after grid point ({shown}); "
                "the remaining grid points were not run"
            )
        if _group_initialised():
            dist.barrier()
