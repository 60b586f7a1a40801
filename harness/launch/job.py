"""Job: what a launcher runs in each rank of one test, built by the front end that runs it.

A launcher (harness/launch/launcher.py) never sees a test runner's object: the unittest
classes build their job from themselves (`RankedTestCase.job`), the pytest plugin one from a
marked item or a RankPool's call (harness/pytest_plugin/run.py). Each rank finds
what it runs by `module` and `qualname` (and `method`, for a test class) and gets `inputs`
with it; the parent reads `world_size`, `timeout` and `shared_key` to start, supervise and
reuse the ranks. A job crosses to rank processes by pickling, so everything in it but
`local_class` is plain data.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Hashable, Optional, Tuple

# Before a runner's deadline, time to stop the ranks (each mode gives a rank about 2 s to
# dump its stack or unwind) and to report: a quarter of the time left, at least 2.5 s and at
# most 5 s, and never more than 60% of it (a short deadline still leaves the ranks time).
MAX_REPORT_MARGIN_S = 5.0
MIN_REPORT_MARGIN_S = 2.5
MIN_TIMEOUT_S = 0.1


def timeout_before(left: float) -> float:
    """The ranks' timeout when a runner's deadline is `left` seconds away (pytest-timeout's
    `--timeout 10`: 7.5 s), so that the harness's hang report comes before the runner's own."""
    margin = min(MAX_REPORT_MARGIN_S, max(MIN_REPORT_MARGIN_S, left * 0.25), left * 0.6)
    return max(MIN_TIMEOUT_S, math.floor((left - margin) * 10) / 10)


@dataclass(frozen=True)
class Job:
    """One test as every launcher runs it.

    `module`/`qualname` name the class whose instance runs as each rank: the test's own class
    (its test `method`), or the rank program a front end runs its tests with (the pytest
    plugin's, which finds the user's function from `inputs`). `shared_key` names the set of
    shared ranks that runs the job (None: fresh ranks or threads).
    """

    test_id: str  # the test's id, for messages and reports
    module: str
    qualname: str
    method: str
    world_size: int
    timeout: float  # seconds: the test's wall-clock limit
    inputs: Any = None  # what every rank gets with the test (RankContext.inputs)
    devices: Tuple[int, ...] = ()  # the accelerator index of each rank (empty on CPU)
    shared_key: Optional[Hashable] = None
    fake_pg: bool = False  # upstream's `fake_pg` of a class: its ranks use the fake backend
    # The class itself, for launchers whose ranks run in this process (threads, simulated
    # ranks, torchrun): it may be local to a function. Never sent to a rank process.
    local_class: Optional[type] = field(default=None, compare=False, repr=False)

    def for_processes(self) -> Job:
        """This job as it crosses to a rank process (which imports its class by name)."""
        return dataclasses.replace(self, local_class=None)

    def with_timeout(self, timeout: float) -> Job:
        return dataclasses.replace(self, timeout=timeout)

    @property
    def importable(self) -> bool:
        """Whether a rank process can find the class by module and qualified name."""
        return "<locals>" not in self.qualname

    def program(self) -> Any:
        """The class whose instance runs as each rank (imported by name where it is not here)."""
        if self.local_class is not None:
            return self.local_class
        return load_class(self.module, self.qualname)


def load_class(module: str, qualname: str) -> Any:
    """The class a job names, found by its module and qualified name."""
    import importlib

    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise LookupError(
                f"test class {qualname} not found in module {module}: "
                "multi-process test classes must be defined at module level"
            )
    return target
