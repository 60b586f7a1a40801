"""Time a trivial 2-rank FSDP test on thread ranks: this harness vs upstream's, side by side.

benchmarks/ may import torch.testing._internal (the upstream peer); harness/ never does.
Both sides run the same body (wrap a small model in FullyShardedDataParallel, train 3
steps) as a unittest case, timed around `case.run(result)`, so thread start-up,
process-group setup, the body and the join are all counted. Runs alternate between the
two harnesses; medians are reported.

    python benchmarks/bench_multithread.py [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import unittest
import warnings
from typing import Callable, List

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.testing._internal import common_fsdp  # the upstream peer
from torch.testing._internal.distributed import multi_threaded_pg

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness import FSDPTestMultiThread, settings  # noqa: E402

STEPS = 3


def fsdp_steps(rank: int) -> None:
    """The test body both harnesses run: FSDP on a small model, STEPS training steps."""
    device = settings.rank_device(rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    model = FullyShardedDataParallel(nn.Linear(16, 16), device_id=device)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS):
        model(torch.randn(4, 16, device=device)).sum().backward()
        optim.step()
        optim.zero_grad()


class Ours(FSDPTestMultiThread):
    @property
    def world_size(self) -> int:
        return 2

    def test_fsdp(self) -> None:
        fsdp_steps(self.rank)


class Upstream(common_fsdp.FSDPTestMultiThread):
    @property
    def world_size(self) -> int:
        return 2

    def test_fsdp(self) -> None:
        fsdp_steps(self.rank)


def use_upstream_backend() -> None:
    """Both projects name their backend `threaded`; hand the name to upstream's for its run."""
    dist.Backend.register_backend(
        "threaded", multi_threaded_pg._create_threaded_pg, devices=["cpu", "cuda"]
    )


def run_once(cls: type, before: Callable[[], None]) -> float:
    before()
    result = unittest.TestResult()
    case = cls("test_fsdp")
    start = time.perf_counter()
    case.run(result)
    elapsed = time.perf_counter() - start
    if not result.wasSuccessful() or result.skipped:
        problems = result.failures + result.errors + result.skipped
        raise SystemExit(f"{cls.__name__} did not pass: {problems}")
    return elapsed


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per harness")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    sides = {"this harness": (Ours, lambda: None), "upstream": (Upstream, use_upstream_backend)}
    for cls, before in sides.values():  # warm-up: imports, first-use caches
        run_once(cls, before)
    times: dict = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, (cls, before) in sides.items():
            times[name].append(run_once(cls, before))
    medians = {name: statistics.median(t) * 1000 for name, t in times.items()}
    print(f"2-rank FSDP test ({STEPS} steps) on threads, device {settings.device_type()}, "
          f"torch {torch.__version__}, {args.repeats} runs each")
    for name, t in times.items():
        print(f"  {name:13s} median {medians[name]:7.1f} ms   "
              f"min {min(t) * 1000:7.1f} ms   max {max(t) * 1000:7.1f} ms")
    ratio = medians["this harness"] / medians["upstream"]
    print(f"  ratio this/upstream: {ratio:.2f} ({'faster' if ratio < 1 else 'slower'})")


if __name__ == "__main__":
    main(sys.argv[1:])
