"""How rank processes start: a forkserver that already has torch and the test code imported.

A rank forked from it starts in milliseconds; a spawned interpreter (the fallback,
HARNESS_START_METHOD=spawn) spends seconds importing torch. The forkserver is started once
per test process, with `_preload` imported; modules added by `preload()` after that are
imported by each rank itself.

Python's forkserver is meant to preload the script that runs as `__main__` too, but up to
at least Python 3.12 the script's path never reaches it, so every rank would import the
script again (for a suite run as `python test_x.py`: the suite and all it imports, per rank,
per test). So harness/forkserver_main.py is preloaded last: imported in the forkserver
while MAIN_PATH_ENV names the script, it loads the script the way multiprocessing loads it
in a child, and forked ranks find it already imported. (Last, so that the script's own
imports of `harness` find the package fully initialised.)
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import sys
from multiprocessing import spawn
from typing import Any, List, Optional

from harness import devices

MAIN_PATH_ENV = "HARNESS_FORKSERVER_MAIN"

# What every rank would otherwise import itself, once per test: torch.distributed.tensor because
# torch.testing.assert_close (so every tensor assertEqual) imports it on first use, which costs a
# rank over a second; numpy because TestCase.setUp seeds it. Missing modules are skipped.
_preload: List[str] = [
    "torch", "torch.distributed", "torch.distributed.tensor", "numpy", "harness.testcase",
    "harness.rank",
]


def preload(*modules: str) -> None:
    """Import these modules in the forkserver too, so ranks do not import them per test.

    Takes effect only before the first multi-process test of this process starts the
    forkserver (a runner calls it with every suite module it is about to run).
    """
    _preload.extend(m for m in modules if m not in _preload and m != "__main__")


def context(test_module: str) -> Any:
    """The multiprocessing context ranks start from, with the forkserver running if used."""
    method = devices.start_method()
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        preload(test_module)
        ctx.set_forkserver_preload([*_preload, "harness.forkserver_main"])
        _ensure_running()
    return ctx


def _main_script() -> Optional[str]:
    """The path multiprocessing re-imports in a child as `__main__`, if it is a script."""
    main = sys.modules["__main__"]
    path = getattr(main, "__file__", None)
    if getattr(getattr(main, "__spec__", None), "name", None) is not None or path is None:
        return None
    if not os.path.isabs(path) and multiprocessing.process.ORIGINAL_DIR is not None:
        path = os.path.join(multiprocessing.process.ORIGINAL_DIR, path)
    return os.path.normpath(path)


def _ensure_running() -> None:
    """Start the forkserver if needed, with MAIN_PATH_ENV naming the script it should load."""
    script = _main_script()
    saved = os.environ.get(MAIN_PATH_ENV)
    if script is not None:
        os.environ[MAIN_PATH_ENV] = script
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if saved is None:
            os.environ.pop(MAIN_PATH_ENV, None)
        else:
            os.environ[MAIN_PATH_ENV] = saved


def load_main_script_in_forkserver() -> None:
    """In the forkserver (MAIN_PATH_ENV set): import the script ranks would re-import."""
    path = os.environ.get(MAIN_PATH_ENV)
    if not path or getattr(sys.modules["__main__"], "__file__", None) == path:
        return  # not the forkserver starting, or the script is loaded already
    try:
        spawn.import_main_path(path)
    except Exception:  # noqa: BLE001 - each rank imports the script again and reports the error
        return

