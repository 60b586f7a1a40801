"""Test tiers for the harness's own tests.

`slow` marks a test that starts a process (rank processes through the forkserver, a
`subprocess` of run_all or a script, torchrun) or compares against upstream's harness: each
such start imports torch afresh, which is what makes the full run take minutes. The inner
loop is `python -m pytest -m "not slow" tests`; CI runs everything.

Plain `python ...` starts fork from a zygote that has imported torch (tests/zygote.py: why,
and which runs still start an interpreter).

With HARNESS_REPORT_SPAWNS set, the run ends listing the tests without the mark that started
a process, so a new test that should be `slow` is found by running the fast tier;
HARNESS_REPORT_SPAWNS=refuse also fails such a test at its first start instead of letting the
process run, which finds them all in minutes. Under pytest-xdist (CI runs `-n 2`) each worker
hands its list to the controller, which prints them all.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from collections import Counter
from typing import Any, Iterator, List

import pytest

from tests import zygote

_current: list[str] = []
_unmarked_spawners: dict[str, str] = {}


zygote.install()  # plain `python ...` runs fork from a zygote that imported torch (tests/zygote.py)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slow: starts a process (ranks, run_all, a script, torchrun) or compares against"
        " upstream's harness; deselect with -m 'not slow'",
    )
    if os.environ.get("HARNESS_REPORT_SPAWNS"):
        _watch_process_starts()


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    """In a pytest-xdist worker (CI runs `-n 3 --dist loadscope`), the classes and modules with
    the most slow tests come first: each runs on one worker, and a long one handed out last
    would end the run with one worker busy and the others idle. Plain runs keep file order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow = Counter(_scope(item) for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[_scope(item)])  # stable: file order within a weight


def _scope(item: pytest.Item) -> str:
    """What loadscope keeps on one worker: the class of a method, else the module."""
    return item.nodeid.rsplit("::", 1)[0]


def _note_spawn(kind: str) -> None:
    if _current:
        _unmarked_spawners.setdefault(_current[-1], kind)
        if os.environ.get("HARNESS_REPORT_SPAWNS") == "refuse":
            raise RuntimeError("HARNESS_REPORT_SPAWNS=refuse: this unmarked test starts a process")


def _watch_process_starts() -> None:
    """Wrap the two ways a process starts from Python code here: subprocess and multiprocessing."""
    execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]
    start = multiprocessing.process.BaseProcess.start

    def watched_execute_child(self: Any, *args: Any, **kwargs: Any) -> Any:
        _note_spawn("subprocess")
        return execute_child(self, *args, **kwargs)

    def watched_start(self: Any) -> None:
        _note_spawn("multiprocessing")
        start(self)

    subprocess.Popen._execute_child = watched_execute_child  # type: ignore[attr-defined]
    multiprocessing.process.BaseProcess.start = watched_start  # type: ignore[method-assign]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    watched = item.get_closest_marker("slow") is None
    if watched:
        _current.append(item.nodeid)
    try:
        return (yield)
    finally:
        if watched:
            _current.pop()


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)  # set in an xdist worker
    if workeroutput is not None:
        workeroutput["unmarked_spawners"] = dict(_unmarked_spawners)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """An xdist worker finished: its unmarked spawners join the controller's list."""
    _unmarked_spawners.update(getattr(node, "workeroutput", {}).get("unmarked_spawners", {}))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _unmarked_spawners:
        return
    terminalreporter.section("tests without the slow mark that started a process")
    for nodeid, kind in sorted(_unmarked_spawners.items()):
        terminalreporter.write_line(f"{nodeid} ({kind})")
