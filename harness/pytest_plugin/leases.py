"""Which accelerators a test's ranks use: rank r gets device r, except under pytest-xdist.

Workers of one pytest-xdist run test side by side; two tests must not put their ranks on
the same device. The controller makes a folder of device locks for the run (`open_locks`,
in its pytest_configure: its workers inherit the variable) and removes it at the end
(`close_locks`); a test's `lease` takes one lock file per device (fcntl, so a killed worker
holds none), all it needs or none, waiting until enough are free, and lets them go when its
ranks are done. The device count comes in as an argument, so tests can fake it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from typing import Iterator, List, Tuple

LOCKS_ENV = "HARNESS_DEVICE_LOCKS"
POLL_S = 0.05


def open_locks(accelerators: int) -> None:
    """In an xdist controller on a machine with accelerators: the run's lock folder."""
    if accelerators > 0 and LOCKS_ENV not in os.environ:
        os.environ[LOCKS_ENV] = tempfile.mkdtemp(prefix="harness-devices-")


def close_locks() -> None:
    """Remove the run's lock folder (the controller's, at the end of the run)."""
    folder = os.environ.pop(LOCKS_ENV, None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def lease(device_type: str, world_size: int, accelerators: int) -> Iterator[Tuple[int, ...]]:
    """The device index of each rank, held for the block: none on CPU; rank r's own device r
    (modulo the count, for torchrun's nodes) outside pytest-xdist; under it, devices no other
    worker holds."""
    folder = os.environ.get(LOCKS_ENV)
    if device_type == "cpu":
        yield ()
    elif not folder or not os.environ.get("PYTEST_XDIST_WORKER"):
        yield tuple(rank % max(1, accelerators) for rank in range(world_size))
    else:
        held = _take(folder, world_size, accelerators)
        try:
            yield tuple(index for index, _ in held)
        finally:
            for _, fd in held:
                os.close(fd)  # closing the descriptor drops its lock


def _take(folder: str, world_size: int, accelerators: int) -> List[Tuple[int, int]]:
    """(device, locked fd) for `world_size` free devices, waiting until that many are free."""
    while True:
        held: List[Tuple[int, int]] = []
        for index in range(accelerators):
            fd = os.open(os.path.join(folder, f"device{index}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            held.append((index, fd))
            if len(held) == world_size:
                return held
        for _, fd in held:  # not enough: hold none while waiting, so no two tests deadlock
            os.close(fd)
        time.sleep(POLL_S)
