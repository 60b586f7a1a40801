"""What a case learns when it runs as one rank: the explicit context its launcher hands it.

A launcher builds one `RankContext` per rank and calls `case.attach_rank(context)` before
running the case; the case and the code it calls (parametrize.run_subtests, the bases'
cleanups) read it from `case.rank_context` instead of private attributes found by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict

from harness.outcome.rank_record import ReportingResult

GridSync = Callable[[Dict[str, Any], bool], bool]


def _always_in_step(params: Dict[str, Any], passed: bool) -> bool:
    return True


@dataclass
class RankContext:
    """One rank's view of its run: who it is, how it reports, how it meets its peers.

    `grid_sync(params, passed)` is called after every grid point and returns False when the
    ranks cannot stay in step (the rest of the grid is then abandoned); `init_method` and
    `file_name` are the test's rendezvous ("" where the mode has none); `inputs` is what the
    supervising case sends every rank with the test (`RankedTestCase.rank_inputs`: a pytest
    function's call and fixture values), None for a test class.
    """

    rank: int
    world_size: int
    result: ReportingResult
    init_method: str = ""
    file_name: str = ""
    grid_sync: GridSync = _always_in_step
    grid_points: int = 0
    inputs: Any = None

    def grid_point_done(self, params: Dict[str, Any], passed: bool) -> bool:
        """Count the grid point, then meet the other ranks; whether the grid may go on."""
        self.grid_points += 1
        return self.grid_sync(params, passed)

    @property
    def failed(self) -> bool:
        """Whether the test itself already failed in this rank (its peers may be out of step)."""
        return self.result.failed
