"""The order tests run in: as written, reversed, or shuffled (`--order`, `HARNESS_ORDER`).

A test that passes only after another one (state a shared-process class kept, a file
written, a module global) passes in the order the file lists them and fails in another. So
the runners can reorder: the tests within each class and the classes within each file, files
staying where they are and a class's tests staying together (its class fixtures and shared
ranks run once). A shuffle is seeded by the run's seed (`--seed`, HARNESS_SEED, else 1234)
and derived per class and per file, so `-k` narrowing a run keeps the order of what is left;
`describe` is the line the summary prints, enough to replay the run.
"""

from __future__ import annotations

import random
import unittest
from typing import Dict, List, Optional

from harness import settings

ORDER_ENV = "HARNESS_ORDER"
ORDERS = ("forward", "reverse", "shuffle")


class OrderError(ValueError):
    """An order that does not exist (from the command line or HARNESS_ORDER)."""


def chosen_order(given: Optional[str] = None) -> str:
    """`given` (the --order flag), else HARNESS_ORDER, else forward; OrderError if unknown."""
    name = given if given is not None else settings.env_text(ORDER_ENV) or "forward"
    if name not in ORDERS:
        source = "--order" if given is not None else ORDER_ENV
        raise OrderError(f"{source}: {name!r} is not one of {', '.join(ORDERS)}")
    return name


def _arrange(items: List, order: str, seed: int, key: str) -> List:
    if order == "reverse":
        return items[::-1]
    if order == "shuffle":
        items = list(items)
        random.Random(f"{seed}:{key}").shuffle(items)
    return items


def reorder(tests: List[unittest.TestCase], order: str, seed: int) -> List[unittest.TestCase]:
    """`tests` in `order`: files in their order, each file's classes and each class's tests
    reversed or shuffled (seeded by `seed`), a class's tests kept together."""
    if order == "forward":
        return tests
    files: Dict[str, Dict[type, List[unittest.TestCase]]] = {}
    for test in tests:
        cls = type(test)
        files.setdefault(cls.__module__, {}).setdefault(cls, []).append(test)
    arranged: List[unittest.TestCase] = []
    for module, classes in files.items():
        for cls in _arrange(list(classes), order, seed, module):
            arranged += _arrange(classes[cls], order, seed, f"{module}.{cls.__qualname__}")
    return arranged


def describe(order: str, seed: int) -> Optional[str]:
    """The summary's line naming the order (None for the written one), enough to replay it."""
    if order == "forward":
        return None
    if order == "reverse":
        return "order: reverse (replay: --order reverse)"
    return f"order: shuffle, seed {seed} (replay: --order shuffle --seed {seed})"
