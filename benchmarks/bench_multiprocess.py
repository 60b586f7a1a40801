"""Per-test cost of a trivial 2-rank test: this harness against upstream's MultiProcessTestCase.

Both run the same body (init a gloo group through a file, all_reduce, destroy) with fresh
processes for every test, interleaved in one run so both see the same machine load. Prints
each side's median and mean wall time per test, the ratio of the medians, and the memory
of a rank (RSS; PSS and private memory show what a forked rank shares with its forkserver).

    python benchmarks/bench_multiprocess.py [--runs 30] [--upstream-runs 5] [--spawn-runs 3]

benchmarks/ may import torch.testing._internal (the upstream peer); harness/ never does.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import unittest
from typing import Callable, Dict, List
from unittest import mock

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import (
    MultiProcessTestCase as UpstreamMultiProcessTestCase,
)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.process.multiprocess_case import MultiProcessTestCase  # noqa: E402

MEMORY_DIR_ENV = "BENCH_MEMORY_DIR"
logging.getLogger("torch.testing._internal.common_distributed").setLevel(logging.WARNING)


def rank_memory_kib() -> Dict[str, int]:
    """This process's RSS, PSS and private (unshared) memory in KiB, from /proc."""
    found: Dict[str, int] = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("Rss", "Pss", "Private_Clean", "Private_Dirty"):
                found[name] = int(rest.split()[0])
    return {
        "rss": found["Rss"],
        "pss": found["Pss"],
        "private": found["Private_Clean"] + found["Private_Dirty"],
    }


def trivial_body(rank: int, world_size: int, init_method: str, label: str) -> None:
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    value = torch.ones(4)
    dist.all_reduce(value)
    assert value[0].item() == world_size
    dist.destroy_process_group()
    if rank == 0 and os.environ.get(MEMORY_DIR_ENV):
        with open(os.path.join(os.environ[MEMORY_DIR_ENV], f"{label}.json"), "w") as f:
            json.dump(rank_memory_kib(), f)


class HarnessTrivial(MultiProcessTestCase):
    @property
    def world_size(self) -> int:
        return 2

    def test_trivial(self) -> None:
        label = os.environ.get("BENCH_LABEL", "harness")
        trivial_body(self.rank, self.world_size, self.init_method, label)


class UpstreamTrivial(UpstreamMultiProcessTestCase):
    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    @property
    def world_size(self) -> int:
        return 2

    def test_trivial(self) -> None:
        trivial_body(self.rank, self.world_size, f"file://{self.file_name}", "upstream")


def time_one(make_case: Callable[[], unittest.TestCase]) -> float:
    result = unittest.TestResult()
    start = time.perf_counter()
    make_case().run(result)
    elapsed = time.perf_counter() - start
    if not result.wasSuccessful():
        raise SystemExit(f"benchmark test failed: {result.failures or result.errors}")
    return elapsed


def summary(name: str, times: List[float]) -> str:
    ms = [t * 1000 for t in times]
    return (
        f"{name:<22} runs={len(ms):<3} median={statistics.median(ms):8.1f} ms  "
        f"mean={statistics.mean(ms):8.1f} ms  min={min(ms):8.1f} ms  max={max(ms):8.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="harness (forkserver) tests, >= 1")
    parser.add_argument("--upstream-runs", type=int, default=5, help="upstream tests")
    parser.add_argument("--spawn-runs", type=int, default=3, help="harness tests with spawn")
    args = parser.parse_args()
    if args.runs < 1 or args.upstream_runs < 0 or args.spawn_runs < 0:
        parser.error("--runs must be at least 1, the other counts at least 0")

    memory_dir = tempfile.mkdtemp(prefix="bench-memory-")
    try:
        os.environ[MEMORY_DIR_ENV] = memory_dir
        first = time_one(lambda: HarnessTrivial("test_trivial"))  # starts the forkserver
        harness: List[float] = []
        upstream: List[float] = []
        for i in range(max(args.runs, args.upstream_runs)):
            if i < args.upstream_runs:
                upstream.append(time_one(lambda: UpstreamTrivial("test_trivial")))
            if i < args.runs:
                harness.append(time_one(lambda: HarnessTrivial("test_trivial")))
        spawn: List[float] = []
        with mock.patch.dict(os.environ, {"HARNESS_START_METHOD": "spawn", "BENCH_LABEL": "spawn"}):
            for _ in range(args.spawn_runs):
                spawn.append(time_one(lambda: HarnessTrivial("test_trivial")))

        print(f"trivial 2-rank gloo test (init, all_reduce, destroy), {os.cpu_count()} cores")
        print(f"harness first test, forkserver start included: {first * 1000:.0f} ms")
        print(summary("harness (forkserver)", harness))
        if upstream:
            print(summary("upstream", upstream))
        if spawn:
            print(summary("harness (spawn)", spawn))
        if upstream:
            ratio = statistics.median(upstream) / statistics.median(harness)
            print(f"ratio of medians upstream / harness: {ratio:.1f}x")
        for label in ("harness", "upstream", "spawn"):
            path = os.path.join(memory_dir, f"{label}.json")
            if os.path.exists(path):
                with open(path) as f:
                    mem = json.load(f)
                print(
                    f"rank memory {label:<9} RSS={mem['rss'] / 1024:6.0f} MiB  "
                    f"PSS={mem['pss'] / 1024:6.0f} MiB  private={mem['private'] / 1024:6.0f} MiB"
                )
    finally:
        shutil.rmtree(memory_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
