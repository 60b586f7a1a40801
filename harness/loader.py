"""Choosing the tests: which suite modules, which of their tests (-k), which shard, how often.

The result is a `Plan`: (module, its tests in run order) pairs. A module that cannot be
imported becomes one failing test, so a broken suite fails the run instead of vanishing.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import sys
import traceback
import unittest
from pathlib import Path
from typing import Any, Callable, List, Sequence, Tuple

from harness.records import Reported, last_line

SUITES_PACKAGE = "test_cases"

Plan = List[Tuple[str, List[unittest.TestCase]]]  # (module, its tests in run order)


class UsageError(Exception):
    """Bad command-line input (an unknown module, a bad pattern or shard): reported as one
    line, exit code 2."""


def suite_modules() -> List[str]:
    """Every suite in test_cases/, as dotted module names."""
    package = importlib.import_module(SUITES_PACKAGE)
    folder = Path(package.__path__[0])
    return [f"{SUITES_PACKAGE}.{path.stem}" for path in sorted(folder.glob("test_*.py"))]


def _module_of_path(path: Path) -> str:
    """Dotted name of a .py file, putting the folder above its package on sys.path."""
    path = path.resolve()
    parts = [path.stem]
    folder = path.parent
    while (folder / "__init__.py").exists():
        parts.insert(0, folder.name)
        folder = folder.parent
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return ".".join(parts)


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def resolve_modules(names: Sequence[str]) -> List[str]:
    """Dotted module names for `names` (`test_misc`, `test_cases.test_misc`, a .py path or a
    folder); all suites in test_cases/ when empty. UsageError for anything unknown."""
    if not names:
        return suite_modules()
    resolved: List[str] = []
    for name in names:
        path = Path(name)
        if name.endswith(".py") and path.is_file():
            found = [_module_of_path(path)]
        elif path.is_dir():
            found = [_module_of_path(p) for p in sorted(path.glob("test_*.py"))]
            if not found:
                raise UsageError(f"folder {name!r} has no test_*.py modules")
        elif "." in name and not name.endswith(".py") and _module_exists(name):
            found = [name]
        elif name.isidentifier() and _module_exists(f"{SUITES_PACKAGE}.{name}"):
            found = [f"{SUITES_PACKAGE}.{name}"]
        else:
            known = ", ".join(m.rpartition(".")[2] for m in suite_modules())
            raise UsageError(f"unknown test module {name!r} (suites in test_cases/: {known})")
        resolved += [module for module in found if module not in resolved]
    return resolved


def _import_failure(module: str, text: str) -> unittest.TestCase:
    """A test standing for a module that failed to import; running it reports the error."""

    class ImportFailure(unittest.TestCase):
        import_failure = True  # kept by -k: a suite that cannot load must not vanish

        def test_import(self) -> None:
            raise Reported(f"cannot import {module}: {last_line(text)}", text)

    ImportFailure.__module__ = module
    ImportFailure.__qualname__ = "ImportFailure"
    return ImportFailure("test_import")


def flatten(suite: Any) -> List[unittest.TestCase]:
    if isinstance(suite, unittest.TestSuite):
        return [test for item in suite for test in flatten(item)]
    return [suite]


def load_module(module: str) -> List[unittest.TestCase]:
    """The module's tests in unittest's order; a failed import becomes one failing test."""
    try:
        loaded = importlib.import_module(module)
    except Exception as error:
        frames = [
            frame for frame in traceback.extract_tb(error.__traceback__)
            if not frame.filename.startswith("<frozen")
            and frame.filename not in (__file__, importlib.__file__)
        ]
        text = "Traceback (most recent call last):\n" + "".join(
            traceback.format_list(frames) + traceback.format_exception_only(type(error), error)
        )
        return [_import_failure(module, text)]
    return flatten(unittest.defaultTestLoader.loadTestsFromModule(loaded))


def name_matcher(pattern: str) -> Callable[[str], bool]:
    """unittest's -k rule: fnmatch on the full test id; a pattern without `*` matches substrings."""
    if not pattern:
        raise UsageError("-k: empty pattern")
    glob = pattern if "*" in pattern else f"*{pattern}*"
    return lambda test_id: fnmatch.fnmatchcase(test_id, glob)


def select(plan: Plan, patterns: Sequence[str]) -> Plan:
    """Keep tests matching any pattern (import failures always stay). UsageError for a pattern
    that matches no test (a typo must not turn into a green run of nothing), unless a module
    failed to import (its tests are unknown; the import failure fails the run anyway)."""
    if not patterns:
        return plan
    matchers = [(pattern, name_matcher(pattern)) for pattern in patterns]
    used = set()
    selected: Plan = []
    for module, tests in plan:
        kept = []
        for test in tests:
            hits = [pattern for pattern, match in matchers if match(test.id())]
            used.update(hits)
            if hits or getattr(test, "import_failure", False):
                kept.append(test)
        selected.append((module, kept))
    unused = [pattern for pattern in patterns if pattern not in used]
    broken = any(getattr(test, "import_failure", False) for _, tests in plan for test in tests)
    if unused and not broken:  # with a broken module, the import error is the news
        raise UsageError(f"-k {unused[0]!r} matches no test in the selected modules")
    return [(module, tests) for module, tests in selected if tests]


def shard(plan: Plan, index: int, count: int) -> Plan:
    """Shard `index` of `count` (1-based): the i-th test id in sorted order goes to shard
    i % count + 1, so shards are disjoint, cover the run and do not depend on load order."""
    ids = sorted({test.id() for _, tests in plan for test in tests})
    position = {test_id: i for i, test_id in enumerate(ids)}
    kept = [
        (module, [t for t in tests if position[t.id()] % count == index - 1])
        for module, tests in plan
    ]
    return [(module, tests) for module, tests in kept if tests]


def repeat(plan: Plan, times: int) -> Plan:
    """Each module's tests `times` times over, as fresh TestCase instances."""
    if times == 1:
        return plan
    return [
        (module, tests + [type(t)(t._testMethodName) for _ in range(times - 1) for t in tests])
        for module, tests in plan
    ]
