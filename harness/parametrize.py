"""Test generation from parameter lists, and subtest grids inside one test.

`parametrize` marks a test function; `instantiate_parametrized_tests` turns each mark
combination into its own method through the `parameterized` package, named
`test_x_<name>_<value>` with identifier-safe values. `run_subtests` runs a function
over a grid inside one test, one `subTest` per grid point, so a failing point is
reported with its parameters and the other points still run.
"""

from __future__ import annotations

import enum
import inspect
import itertools
import re
import unittest
from typing import Any, Callable, Dict, Iterable, List, Sequence, Tuple

import torch
from parameterized import param, parameterized

PARAMS_ATTR = "__harness_params__"


def parametrize(name: str, values: Iterable[Any]) -> Callable[[Callable], Callable]:
    """Generate one test per value of `name`; stacked decorators give the product."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"parametrize: name must be an identifier, got {name!r}")
    values = list(values)
    if not values:
        raise ValueError(f"parametrize({name!r}): no values given")

    def decorator(fn: Callable) -> Callable:
        marks: List[Tuple[str, List[Any]]] = list(getattr(fn, PARAMS_ATTR, []))
        if any(existing == name for existing, _ in marks):
            raise ValueError(f"parametrize({name!r}): {fn.__name__} is already parametrized by it")
        _check_accepts(fn, name)
        # Decorators apply bottom-up; keep the order they are written in (top first).
        setattr(fn, PARAMS_ATTR, [(name, values), *marks])
        return fn

    return decorator


def _check_accepts(fn: Callable, name: str) -> None:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if name not in params and not takes_kwargs:
        raise ValueError(f"parametrize({name!r}): {fn.__name__} has no parameter {name!r}")


def value_name(value: Any) -> str:
    """An identifier-safe rendering of a parameter value: enum members by name, None as None."""
    if isinstance(value, enum.Enum):
        text = value.name
    elif isinstance(value, torch.dtype):
        text = str(value).replace("torch.", "")
    elif isinstance(value, type) or inspect.isfunction(value):
        text = value.__name__
    else:
        text = str(value)
    return re.sub(r"\W", "_", text) or "_"


def _test_names(base: str, names: Sequence[str], combos: List[Tuple[Any, ...]]) -> List[str]:
    result: List[str] = []
    for combo in combos:
        suffix = "_".join(f"{n}_{value_name(v)}" for n, v in zip(names, combo))
        name = f"{base}_{suffix}"
        if name in result:  # two values render alike: keep both tests, distinguish by position
            name = f"{name}_{len(result)}"
        result.append(name)
    return result


def _expand(fn: Callable, names: Sequence[str], combos: List[Tuple[Any, ...]]) -> Dict[str, Any]:
    """Let `parameterized.expand` generate one method per combination into a fresh namespace."""
    test_names = _test_names(fn.__name__, names, combos)
    cases = [param(**dict(zip(names, combo))) for combo in combos]
    namespace: Dict[str, Any] = {}
    parameterized.expand(
        cases, name_func=lambda _f, index, _p: test_names[int(index)], namespace=namespace
    )(fn)
    return {name: namespace[name] for name in test_names}


def instantiate_parametrized_tests(cls: type) -> type:
    """Replace every @parametrize-marked method of `cls` with one method per combination."""
    for attr, fn in list(vars(cls).items()):
        marks = getattr(fn, PARAMS_ATTR, None)
        if not marks or not callable(fn):
            continue
        names = [name for name, _ in marks]
        combos = list(itertools.product(*(values for _, values in marks)))
        delattr(cls, attr)
        for name, method in _expand(fn, names, combos).items():
            if hasattr(method, PARAMS_ATTR):
                delattr(method, PARAMS_ATTR)
            setattr(cls, name, method)
    return cls


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


def run_subtests(
    case: unittest.TestCase, grid: Dict[str, Sequence[Any]], fn: Callable, *args: Any, **kwargs: Any
) -> None:
    """Run `fn(*args, **kwargs, **point)` for each point of the grid's Cartesian product.

    Each point runs inside `case.subTest(**point)`. After each point, multi-rank cases
    agree through `case._grid_point_done(point, passed)`; if the ranks cannot stay in
    step the rest of the grid is abandoned and the test fails saying so.
    """
    names, combos = _grid_points(grid)
    for combo in combos:
        point = dict(zip(names, combo))
        passed = False
        with case.subTest(**point):
            try:
                fn(*args, **kwargs, **point)
            except unittest.SkipTest:
                passed = True
                raise
            passed = True
        case._grid_points_run = getattr(case, "_grid_points_run", 0) + 1
        sync = getattr(case, "_grid_point_done", None)
        if sync is not None and not sync(point, passed):
            shown = ", ".join(f"{k}={v!r}" for k, v in point.items())
            case.fail(
                f"ranks could not stay in step after grid point ({shown}); "
                "the remaining grid points were not run"
            )
