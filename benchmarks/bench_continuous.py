"""Shared-process mode against upstream's MultiProcContinuousTest and the fresh-process mode.

One class of N trivial 2-rank tests (each all-reduces one tensor on the default group) runs
in four ways, side by side in one run so all see the same machine load:

- shared: this harness's MultiProcContinuousTest (one set of ranks per class, forked from the
  forkserver, which is started and warmed up before timing: it serves every class of a run);
- upstream: torch.testing._internal's MultiProcContinuousTest (spawned ranks per class);
- fresh: this harness's MultiProcessTestCase (new ranks for every test, group per test);
- unchecked: shared without its leak checks (harness/process/leaks.py), whose cost is the
  difference to shared (also measured in-process: two snapshots and their comparison).

For each it prints the per-test time (median over the tests after the first, which also
pays the start) and the time of the whole class (start, tests, stop), plus the ratios.

    python benchmarks/bench_continuous.py [--tests 40] [--repeat 3]

benchmarks/ may import torch.testing._internal (the upstream peer); harness/ never does.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import statistics
import sys
import time
import unittest
from typing import Any, Dict, List, Tuple

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import (
    MultiProcContinuousTest as UpstreamContinuous,
)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.process import forkserver, leaks  # noqa: E402
from harness.process.continuous import MultiProcContinuousTest  # noqa: E402
from harness.process.multiprocess_case import MultiProcessTestCase  # noqa: E402

logging.getLogger("torch.testing._internal.common_distributed").setLevel(logging.WARNING)
MAX_TESTS = 200


def _shared_body(self: Any) -> None:
    value = torch.ones(1)
    dist.all_reduce(value)
    self.assertEqual(value.item(), 2.0)


def _fresh_body(self: Any) -> None:
    dist.init_process_group(
        "gloo", init_method=self.init_method, rank=self.rank, world_size=self.world_size
    )
    _shared_body(self)
    dist.destroy_process_group()


class Shared(MultiProcContinuousTest):
    world_size = 2


class SharedUnchecked(MultiProcContinuousTest):
    """Shared, without leak checks: the difference to Shared is what the checks cost."""

    world_size = 2
    skip_leak_checks = leaks.CHECKS


class Upstream(UpstreamContinuous):
    world_size = 2

    @classmethod
    def backend_str(cls) -> str:
        return "gloo"


class Fresh(MultiProcessTestCase):
    @property
    def world_size(self) -> int:
        return 2


for _i in range(MAX_TESTS):
    setattr(Shared, f"test_{_i:03d}", _shared_body)
    setattr(SharedUnchecked, f"test_{_i:03d}", _shared_body)
    setattr(Upstream, f"test_{_i:03d}", _shared_body)
    setattr(Fresh, f"test_{_i:03d}", _fresh_body)


class TimingResult(unittest.TestResult):
    """Each test's wall time, from startTest to stopTest."""

    def __init__(self) -> None:
        super().__init__()
        self.times: List[float] = []
        self._started = 0.0

    def startTest(self, test: unittest.TestCase) -> None:  # noqa: N802 - unittest's naming
        super().startTest(test)
        self._started = time.perf_counter()

    def stopTest(self, test: unittest.TestCase) -> None:  # noqa: N802
        self.times.append(time.perf_counter() - self._started)
        super().stopTest(test)


def time_class(cls: type, tests: int) -> Tuple[float, float]:
    """(median seconds per test after the first, seconds for the whole class)."""
    names = [f"test_{i:03d}" for i in range(tests)]
    suite = unittest.TestSuite(cls(name) for name in names)
    result = TimingResult()
    # Upstream spawns its ranks; starting the forkserver fixed this process's default start
    # method to fork, which would make upstream's set_start_method("spawn") fail silently.
    previous = multiprocessing.get_start_method(allow_none=True)
    if cls is Upstream:
        multiprocessing.set_start_method("spawn", force=True)
    started = time.perf_counter()
    try:
        suite.run(result)
    finally:
        total = time.perf_counter() - started
        multiprocessing.set_start_method(previous, force=True)
    problems = result.failures + result.errors + result.skipped
    if problems or result.testsRun != tests:
        raise RuntimeError(f"{cls.__name__}: not every test passed: {problems}")
    if cls is Upstream:  # upstream leaves its class state set; a second run needs it reset
        Upstream._processes_spawned = False
    return statistics.median(result.times[1:]), total


def leak_check_cost(rounds: int = 1000) -> float:
    """Seconds per test of what a shared rank adds for the leak checks, measured here."""
    checks = leaks.CHECKS
    began = time.perf_counter()
    for _ in range(rounds):
        leaks.leaks(leaks.snapshot(checks), leaks.snapshot(checks))
    return (time.perf_counter() - began) / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=40, help="tests per class (2 to 200)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the three classes")
    args = parser.parse_args()
    if not 2 <= args.tests <= MAX_TESTS:
        parser.error(f"--tests must be between 2 and {MAX_TESTS}, got {args.tests}")
    forkserver.context(__name__)  # the forkserver is up before a run's first class ...
    time_class(Shared, 2)  # ... and done preloading: a rank forked from it once
    classes = (("shared", Shared), ("unchecked", SharedUnchecked), ("upstream", Upstream),
               ("fresh", Fresh))
    rows: Dict[str, List[Tuple[float, float]]] = {label: [] for label, _ in classes}
    for _ in range(args.repeat):
        for label, cls in classes:
            rows[label].append(time_class(cls, args.tests))
    print(f"{args.tests} trivial 2-rank tests per class, {args.repeat} round(s); medians:")
    medians = {
        label: (statistics.median(t for t, _ in runs), statistics.median(c for _, c in runs))
        for label, runs in rows.items()
    }
    for label, (per_test, whole) in medians.items():
        runs = ", ".join(f"{t * 1e3:.1f} ms / {c:.2f} s" for t, c in rows[label])
        print(f"  {label:9s} per test {per_test * 1e3:8.1f} ms   class {whole:7.2f} s   ({runs})")
    shared_test, shared_class = medians["shared"]
    print(f"  leak checks: {(shared_test - medians['unchecked'][0]) * 1e3:+.2f} ms a test side by "
          f"side (shared against unchecked); {leak_check_cost() * 1e3:.3f} ms a test in-process "
          "(two snapshots and their comparison, every default check)")
    for label in ("upstream", "fresh"):
        per_test, whole = medians[label]
        print(
            f"  shared vs {label}: per test {per_test / shared_test:.2f}x faster, "
            f"class {whole / shared_class:.2f}x faster"
        )


if __name__ == "__main__":
    main()
