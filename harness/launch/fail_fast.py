"""The one fail-fast policy of every launch mode: when the ranks still running a test are stopped.

Upstream's multi-process base stops the other ranks as soon as one rank's process exits with
its test's error code; its thread base waits for every thread, and under torchrun nothing
stops them. Here fresh processes, shared processes, threads and torchrun follow one rule,
`FailFast`: once a rank ended the test (it failed there, or it skipped the whole test), the
ranks still running get `GRACE_S` seconds more, then are stopped, their stacks taken first.

- The grace: a failure that every rank meets (the same assertion, a collective they all
  enter) is reported by each rank itself rather than as ranks stopped mid-way; it is short,
  so a peer left waiting for the rank that failed costs seconds, not the test's timeout.
- A skip counts: a rank that skipped leaves its peers waiting for it in their next
  collective, and the test would otherwise end as a timeout.
- Never while a rank is debugged (`--debug-rank`): the others wait for the person.

What counts as the test failing in a rank is harness/outcome/rank_record.py's
(`RankRecord.failed`, from `fails_rank` of each event), the same rule the verdict uses.
"""

from __future__ import annotations

import time
from typing import Iterable, Optional

from harness import settings
from harness.outcome.rank_record import RankRecord

GRACE_S = 3.0  # once a rank ended the test, how long the others may still run and report


def ended_test(record: RankRecord) -> bool:
    """Whether this rank ended the whole test: it failed there, or skipped the test."""
    return record.failed or record.skip_reason() is not None


class FailFast:
    """One test's fail-fast clock, asked by its launcher while the ranks run."""

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self.grace_s = grace_s
        self._ended_at: Optional[float] = None

    def stop_at(self, records: Iterable[RankRecord]) -> float:
        """When (time.monotonic()) to stop the ranks still running: `grace_s` after a rank
        was first seen ending the test; never (inf) before that, nor while one is debugged."""
        if (
            self._ended_at is None
            and settings.debug_rank() is None
            and any(ended_test(record) for record in records)
        ):
            self._ended_at = time.monotonic()
        return float("inf") if self._ended_at is None else self._ended_at + self.grace_s

    @property
    def triggered(self) -> bool:
        """Whether a rank ended the test (so a stop is fail-fast's, not the timeout's)."""
        return self._ended_at is not None
