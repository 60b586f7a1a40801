"""The one interface every way of running ranks implements.

A supervising case (harness/launch/case.py) does not know how its ranks run: it asks its
launcher to `start` them in setUp, to `join` them in the test method, and to `close`
whatever is left. Each mode (fresh processes, shared processes, threads, torchrun, ranks
simulated in one process) is one Launcher; the verdict is the same for all of them, because
they all hand back one RankRecord per rank.
"""

from __future__ import annotations

import abc
import unittest
from typing import List, Optional, Tuple

from harness.outcome.rank_record import RankRecord


class Launcher(abc.ABC):
    """Runs one test's ranks and reports what each did."""

    @abc.abstractmethod
    def start(self, case: unittest.TestCase) -> None:
        """Start the ranks running `case`'s test (called from the supervising case's setUp)."""

    @abc.abstractmethod
    def join(self, case: unittest.TestCase) -> Tuple[List[RankRecord], Optional[float]]:
        """Wait for the ranks: every rank's record, and the timeout that stopped them (else
        None)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop whatever still runs and remove what the ranks wrote; safe to call twice."""
