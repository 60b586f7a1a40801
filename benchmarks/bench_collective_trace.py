"""What recording collectives for hang reports costs: on against off, side by side in one run.

Process ranks record through torch's flight recorder (TORCH_FR_BUFFER_SIZE, set by the
harness unless the user set it; 0 turns it off); thread ranks through the threaded
backend's own log (turned off here by keeping no entry). For each mode, the same 2-rank
test (init, N all_reduces, destroy) runs alternately with recording on and off, so both
see the same machine load; the script prints the median time per test and per collective.

    python benchmarks/bench_collective_trace.py [--runs 15] [--collectives 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import unittest
from typing import Callable, Dict, List
from unittest import mock

import torch
import torch.distributed as dist

if __name__ == "__main__":  # rank processes import this module too: keep them quiet
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness import FSDPTest, FSDPTestMultiThread, skip_if_lt_x_gpu  # noqa: E402
from harness.compat.flight_recorder import BUFFER_SIZE_ENV  # noqa: E402
from harness.threads import world as thread_world

COLLECTIVES_ENV = "BENCH_COLLECTIVES"


@skip_if_lt_x_gpu(2, allow_cpu=True)  # FSDP's bases skip on CPU unless it is allowed
class _Body:
    @property
    def world_size(self) -> int:
        return 2

    def test_collectives(self) -> None:
        value = torch.ones(1024)
        for _ in range(int(os.environ.get(COLLECTIVES_ENV, "200"))):
            dist.all_reduce(value)


class BenchProcesses(_Body, FSDPTest):
    pass


class BenchThreads(_Body, FSDPTestMultiThread):
    pass


def run_once(case: type) -> float:
    test = case("test_collectives")
    result = unittest.TestResult()
    started = time.perf_counter()
    test.run(result)
    elapsed = time.perf_counter() - started
    if not result.wasSuccessful():
        raise SystemExit(f"{case.__name__} failed: {(result.failures + result.errors)[0][1]}")
    return elapsed


def process_recording(on: bool) -> mock._patch:
    return mock.patch.dict(os.environ, {BUFFER_SIZE_ENV: "2000" if on else "0"})


def thread_recording(on: bool) -> mock._patch:
    if on:
        return mock.patch.dict(os.environ, {})
    return mock.patch.object(thread_world, "ENTERED_KEPT", 0)


def measure(case: type, recording: Callable[[bool], mock._patch], runs: int) -> Dict[str, float]:
    times: Dict[bool, List[float]] = {True: [], False: []}
    run_once(case)  # warm-up (the forkserver's start, first imports)
    for _ in range(runs):
        for on in (True, False):
            with recording(on):
                times[on].append(run_once(case))
    return {"on": statistics.median(times[True]), "off": statistics.median(times[False])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--collectives", type=int, default=200)
    args = parser.parse_args()
    os.environ[COLLECTIVES_ENV] = str(args.collectives)
    print(f"2 ranks, {args.collectives} all_reduce of 1024 floats per test, {args.runs} runs")
    print(f"{'mode':<10}{'on ms/test':>12}{'off ms/test':>13}{'cost':>8}{'us/collective':>15}")
    for name, case, recording in (
        ("processes", BenchProcesses, process_recording),
        ("threads", BenchThreads, thread_recording),
    ):
        found = measure(case, recording, args.runs)
        extra = found["on"] - found["off"]
        print(
            f"{name:<10}{found['on'] * 1e3:>12.1f}{found['off'] * 1e3:>13.1f}"
            f"{extra / found['off'] * 100:>7.1f}%{extra / args.collectives * 1e6:>15.1f}"
        )


if __name__ == "__main__":
    main()
