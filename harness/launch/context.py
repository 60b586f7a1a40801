"""What an instance learns when it runs as one rank: the explicit context its launcher hands it.

A launcher builds one `RankContext` per rank and calls `attach_rank(context)` on the instance
that runs as the rank (a test class's, or a front end's rank program) before running it; the
case and the code it calls (parametrize.run_subtests, the bases' cleanups) read it from
`case.rank_context` instead of private attributes found by name. Code a test calls that is
not handed the instance (compat/cpu_defaults.py's adaptations) asks `running_rank()`, which
the launcher sets around the run (`running_as_rank`).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator

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
    job sends every rank with the test (`Job.inputs`: a pytest function's call and fixture
    values), None for a test class, whose ranks re-create everything from its name.
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


_RUNNING = threading.local()


def running_rank() -> Any:
    """The instance running as a rank in this thread (a test class's rank instance, a front
    end's rank program: each has `id()`), else None."""
    return getattr(_RUNNING, "instance", None)


@contextlib.contextmanager
def running_as_rank(instance: Any) -> Iterator[None]:
    """While the launcher runs `instance` as this thread's rank: `running_rank()` is it."""
    previous = running_rank()
    _RUNNING.instance = instance
    try:
        yield
    finally:
        _RUNNING.instance = previous
