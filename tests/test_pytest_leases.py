"""harness/pytest_plugin/leases.py: under pytest-xdist, a test's ranks hold devices no other
running test holds (the device count is faked: no accelerator needed)."""

from __future__ import annotations

import os
import threading
import time
from typing import Iterator

import pytest

from harness.pytest_plugin import leases


@pytest.fixture
def xdist_run(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A controller's lock folder and an xdist worker's variables, removed afterwards."""
    monkeypatch.delenv(leases.LOCKS_ENV, raising=False)
    leases.open_locks(accelerators=4)
    folder = os.environ[leases.LOCKS_ENV]
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    yield folder
    leases.close_locks()
    assert not os.path.exists(folder)


def test_cpu_gets_no_device_and_outside_xdist_rank_r_gets_device_r() -> None:
    with leases.lease("cpu", 2, accelerators=4) as held:
        assert held == ()
    with leases.lease("cuda", 3, accelerators=4) as held:
        assert held == (0, 1, 2)
    with leases.lease("cuda", 4, accelerators=2) as held:  # torchrun's nodes: local devices
        assert held == (0, 1, 0, 1)


def test_no_folder_without_accelerators(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(leases.LOCKS_ENV, raising=False)
    leases.open_locks(accelerators=0)
    assert leases.LOCKS_ENV not in os.environ


def test_two_tests_hold_different_devices_and_release_them(xdist_run: str) -> None:
    with leases.lease("cuda", 2, accelerators=4) as first:
        with leases.lease("cuda", 2, accelerators=4) as second:
            assert sorted(first + second) == [0, 1, 2, 3]
    with leases.lease("cuda", 4, accelerators=4) as everything:
        assert everything == (0, 1, 2, 3)


def test_a_test_waits_until_enough_devices_are_free(xdist_run: str) -> None:
    got = []

    def second_test() -> None:
        with leases.lease("cuda", 2, accelerators=4) as held:
            got.append(held)

    with leases.lease("cuda", 3, accelerators=4):
        waiter = threading.Thread(target=second_test, daemon=True)
        waiter.start()
        time.sleep(0.3)
        assert got == []  # only one device is free: it holds none and waits
    waiter.join(5)
    assert len(got) == 1 and len(got[0]) == 2
