"""`run_all.py` serial against `run_all.py -j auto`, side by side in one run.

Two workloads: the suites in test_cases/, and a synthetic file of 40 small 2-rank tests (fresh
rank processes, each test all-reduces one tensor on its own gloo group), written to a
temporary folder. Each round runs every workload serially and with `-j` (alternating which
goes first, so both see the same machine load) and prints, per side, the median wall time,
the CPU time of the run and everything it started (user + system), the closing line, and the
ratio serial/parallel. The machine's cores and load average are printed too: on a loaded
machine the figures say more about the load than about `-j`.

    python benchmarks/bench_parallel.py [--rounds 1] [--jobs auto] [--skip-suites]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_TIMEOUT_S = 3600
SYNTHETIC_TESTS = 40

SYNTHETIC = textwrap.dedent('''
    """{count} small 2-rank tests: each all-reduces one tensor on its own gloo group."""

    import torch
    import torch.distributed as dist

    from harness import MultiProcessTestCase, run_tests


    class TestSmall(MultiProcessTestCase):
        @property
        def world_size(self) -> int:
            return 2

        def setUp(self) -> None:
            super().setUp()
            self._spawn_processes()


    def _body(self) -> None:
        dist.init_process_group(
            "gloo", init_method=self.init_method, rank=self.rank, world_size=self.world_size
        )
        value = torch.ones(4)
        dist.all_reduce(value)
        self.assertEqual(value, torch.full((4,), 2.0))
        dist.destroy_process_group()


    for _i in range({count}):
        setattr(TestSmall, f"test_{{_i:02d}}", _body)

    if __name__ == "__main__":
        run_tests()
''')


def run(args: List[str]) -> Tuple[float, float, str]:
    """One `python run_all.py ARGS -q`: wall seconds, CPU seconds (it and its descendants),
    closing line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "run_all.py", *args, "-q"], cwd=ROOT, capture_output=True, text=True,
        timeout=RUN_TIMEOUT_S, env={**os.environ, "PYTHONPATH": ROOT},
    )
    wall = time.monotonic() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = done.stdout.strip().splitlines()
    closing = lines[-1] if lines else f"(no output; exit {done.returncode})"
    if done.returncode not in (0, 1) or not lines:
        raise SystemExit(f"run_all.py {' '.join(args)} exited {done.returncode}: "
                         f"{closing}\n{done.stderr[-2000:]}")
    return wall, cpu, closing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="runs of each side")
    parser.add_argument("--jobs", default="auto", help="the -j of the parallel side")
    parser.add_argument("--skip-suites", action="store_true", help="only the synthetic file")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} cores; load average at start {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-parallel-") as folder:
        synthetic = os.path.join(folder, "test_synthetic.py")
        with open(synthetic, "w") as f:
            f.write(SYNTHETIC.format(count=SYNTHETIC_TESTS))
        workloads = {f"synthetic ({SYNTHETIC_TESTS} 2-rank tests)": [synthetic]}
        if not args.skip_suites:
            workloads["suites (test_cases/)"] = []
        results: Dict[Tuple[str, str], List[Tuple[float, float, str]]] = {}
        for round_ in range(args.rounds):
            for name, paths in workloads.items():
                sides = [("serial", paths), (f"-j {args.jobs}", [*paths, "-j", args.jobs])]
                for side, command in sides if round_ % 2 == 0 else sides[::-1]:
                    results.setdefault((name, side), []).append(run(command))
                    wall, cpu, closing = results[(name, side)][-1]
                    print(f"  round {round_ + 1} {name:34s} {side:8s} wall {wall:7.1f} s  "
                          f"cpu {cpu:7.1f} s  {closing}", flush=True)
    print(f"medians over {args.rounds} round(s); load average at end {os.getloadavg()[0]:.1f}")
    for name in workloads:
        serial = [statistics.median(x[i] for x in results[(name, "serial")]) for i in (0, 1)]
        side = [statistics.median(x[i] for x in results[(name, f"-j {args.jobs}")])
                for i in (0, 1)]
        print(f"  {name}: serial wall {serial[0]:.1f} s cpu {serial[1]:.1f} s; "
              f"-j {args.jobs} wall {side[0]:.1f} s cpu {side[1]:.1f} s; "
              f"serial/parallel wall {serial[0] / side[0]:.2f}x")


if __name__ == "__main__":
    main()
