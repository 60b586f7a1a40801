"""Per-test cost of marked pytest functions against the class-based test and process pools.

Six ways of writing the same trivial 2-rank test (an all_reduce of one tensor on gloo), each a
generated pytest file of N copies of it, run by `python -m pytest` side by side in one run
(the variants' order rotates from round to round, so machine load falls on all alike):

- fresh:         @pytest.mark.ranks(2) (mode="fresh": new rank processes and group per test);
- shared:        @pytest.mark.ranks(2, mode="shared") (one set of ranks and group per module);
- threads:       @pytest.mark.ranks(2, mode="threads") (thread ranks, the threaded backend);
- class:         the harness's MultiProcessTestCase, the group made in the test (fresh ranks);
- pool_per_test: DeepSpeed's DistributedTest style: each test makes a new forkserver
                 Pool(2), starmaps a worker that inits a gloo group (a fresh FileStore),
                 all-reduces and destroys it, then closes the pool;
- pool_session:  torchmetrics' style: a session fixture holds one spawn Pool(2) whose workers
                 init a gloo group once (the pool's initializer); each test starmaps the
                 all_reduce.

A test's time is pytest's own (setup + call + teardown, from a --junitxml report). Per
variant it prints the median per test without the first test, the first test's time (a
pool's or shared set's start; the last test carries their stop, which the median absorbs),
the whole pytest process's wall time (interpreter, imports, collection and the harness's
forkserver start, which the plugin keeps out of the tests' times, included) and that divided
by N; medians over the rounds. Then the project's targets,
each PASS or FAIL: fresh at least 10x faster than pool_per_test, fresh within 1.2x of class,
shared at most 10 ms a test. Exits 1 only when a variant's pytest run fails (its output's
tail is printed), else 0. Everything is removed at the end: the generated files, pytest's
temporary folders and any process a run left behind (reported as a problem).

    python benchmarks/bench_functions.py [--tests 20] [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import runs  # noqa: E402 - what the pytest-session benchmarks share

_MARKED = '''
import pytest
import torch
import torch.distributed as dist

''' + runs.MARKED_ALL_REDUCE

_CLASS = '''
import torch
import torch.distributed as dist

from harness import MultiProcessTestCase


class TestAllReduce(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

''' + runs.CLASS_ALL_REDUCE

_POOL_PER_TEST = '''
import multiprocessing

import pytest
import torch
import torch.distributed as dist

WORLD_SIZE = 2


def _worker(rank, world_size, init_method):
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()


@pytest.mark.parametrize("i", range(__N__))
def test_all_reduce(tmp_path, i):
    init_method = f"file://{tmp_path / 'store'}"
    pool = multiprocessing.get_context("forkserver").Pool(WORLD_SIZE)
    try:
        args = [(rank, WORLD_SIZE, init_method) for rank in range(WORLD_SIZE)]
        results = pool.starmap_async(_worker, args).get(120)
    except BaseException:
        pool.terminate()
        raise
    else:
        pool.close()
    finally:
        pool.join()
    assert results == [3.0] * WORLD_SIZE
'''

_POOL_SESSION = '''
import multiprocessing

import pytest
import torch
import torch.distributed as dist

WORLD_SIZE = 2


def _init_worker(ranks, init_method):
    rank = ranks.get()
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=WORLD_SIZE)


def _all_reduce():
    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return t.item()


@pytest.fixture(scope="session")
def pool(tmp_path_factory):
    ctx = multiprocessing.get_context("spawn")
    ranks = ctx.Queue()
    for rank in range(WORLD_SIZE):
        ranks.put(rank)
    init_method = f"file://{tmp_path_factory.mktemp('store') / 'store'}"
    pool = ctx.Pool(WORLD_SIZE, initializer=_init_worker, initargs=(ranks, init_method))
    try:
        yield pool
    except BaseException:
        pool.terminate()
        raise
    else:
        pool.close()
    finally:
        pool.join()


@pytest.mark.parametrize("i", range(__N__))
def test_all_reduce(pool, i):
    assert pool.starmap_async(_all_reduce, [()] * WORLD_SIZE).get(120) == [3.0] * WORLD_SIZE
'''

VARIANTS: Dict[str, str] = {
    "fresh": _MARKED.replace("__MODE__", "fresh"),
    "shared": _MARKED.replace("__MODE__", "shared"),
    "threads": _MARKED.replace("__MODE__", "threads"),
    "class": _CLASS,
    "pool_per_test": _POOL_PER_TEST,
    "pool_session": _POOL_SESSION,
}


@dataclass
class Run:
    """One pytest run of a variant: each test's seconds (in run order) and the run's wall time."""

    tests: List[float]
    wall: float
    leftovers: List[str] = field(default_factory=list)

    @property
    def per_test(self) -> float:
        return runs.median_without_first(self.tests)

    @property
    def outside(self) -> float:
        return self.wall - sum(self.tests)


def run_variant(name: str, workdir: str, tests: int, run_id: str, timeout: float) -> Run:
    """Run the variant's generated file (already in `workdir`) once, in its own process group."""
    done = runs.run_pytest(workdir, f"test_{name}.py", run_id, timeout, junit_tests=tests)
    return Run(done.times, done.wall, done.leftovers)


def summarize(rounds: List[Run], tests: int) -> Dict[str, Any]:
    """Medians over the rounds, in ms (wall in s)."""
    return {
        "per_test_ms": statistics.median(r.per_test for r in rounds) * 1e3,
        "first_ms": statistics.median(r.tests[0] for r in rounds) * 1e3,
        "wall_per_test_ms": statistics.median(r.wall / tests for r in rounds) * 1e3,
        "wall_s": statistics.median(r.wall for r in rounds),
        "outside_tests_s": statistics.median(r.outside for r in rounds),
        "rounds": [
            {"per_test_ms": r.per_test * 1e3, "first_ms": r.tests[0] * 1e3, "wall_s": r.wall,
             "test_ms": [t * 1e3 for t in r.tests]}
            for r in rounds
        ],
    }


def targets(medians: Dict[str, Dict[str, Any]]) -> List[Tuple[str, float, str, bool]]:
    """The project's targets: (description, value, limit, passed)."""
    fresh = medians["fresh"]["per_test_ms"]
    pool_ratio = medians["pool_per_test"]["per_test_ms"] / fresh
    class_ratio = fresh / medians["class"]["per_test_ms"]
    shared = medians["shared"]["per_test_ms"]
    return [
        ("pool_per_test / fresh", pool_ratio, ">= 10x", pool_ratio >= 10),
        ("fresh / class", class_ratio, "<= 1.2x", class_ratio <= 1.2),
        ("shared per test (ms)", shared, "<= 10 ms", shared <= 10),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=20, help="tests per variant (>= 2)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all variants (>= 1)")
    args = runs.parse_args(parser, "seconds per pytest run", min_tests=2)
    runs.exit_on_signals()

    with runs.work_folder("bench-functions-", runs.test_files(VARIANTS, args.tests)) as workdir:
        results = runs.run_rounds(
            lambda name, run_id: run_variant(name, workdir, args.tests, run_id, args.timeout),
            list(VARIANTS), args.rounds, lambda run: "done",
        )
    if results is None:
        return 1

    medians = {name: summarize(variant_runs, args.tests) for name, variant_runs in results.items()}
    print(runs.header(f"{args.tests} trivial 2-rank gloo tests per variant", args.rounds))
    print(f"{'variant':<14}{'per test ms':>12}{'first ms':>10}{'wall/N ms':>11}{'wall s':>8}"
          f"{'outside s':>11}")
    for name, m in medians.items():
        print(f"{name:<14}{m['per_test_ms']:>12.1f}{m['first_ms']:>10.1f}"
              f"{m['wall_per_test_ms']:>11.1f}{m['wall_s']:>8.2f}{m['outside_tests_s']:>11.2f}")
    print("(per test: median without the first test; outside: wall minus the tests' times)")
    checks = targets(medians)
    for label, value, limit, passed in checks:
        unit = "" if label.endswith("(ms)") else "x"
        print(f"  {label:<22}{value:>9.2f}{unit:<2} target {limit:<9}{runs.verdict(passed)}")
    problems = runs.problems(results)
    runs.print_problems(problems)
    runs.write_json(args.json, args.tests, args.rounds, medians, problems,
                    targets=[runs.target(*check) for check in checks])
    return 0


if __name__ == "__main__":
    sys.exit(main())
