"""A whole pytest session of a small file: the harness's marked functions against a session
pool and a per-test spawn.

The same 4 trivial 2-rank tests (a gloo all_reduce of one tensor, the sum asserted), written
three ways, each a generated pytest file run as `python -m pytest FILE -q -p no:cacheprovider`
side by side in one run (the variants' order rotates from round to round, so machine load
falls on all alike):

- harness:      @pytest.mark.ranks(2) functions (mode="fresh", the default: new rank
                processes and group per test, forked from the harness's forkserver, which
                starts once per session), with `-p harness.pytest_plugin`;
- session_pool: torchmetrics' shape (its tests/unittests/conftest.py): a session fixture
                holds one `torch.multiprocessing` spawn Pool(2), whose workers a starmap of a
                set-up function puts in one gloo group (env:// on 127.0.0.1, a free port);
                each test starmaps the all_reduce on ranks 0 and 1;
- mp_spawn:     each test calls `torch.multiprocessing.spawn(worker, nprocs=2)`, the common
                hand-rolled shape: the worker inits gloo (a file:// store in tmp_path),
                all-reduces, asserts, destroys the group.

The two variants without the harness run with its pytest plugin disabled (`-p
no:harness.pytest_plugin`: the package's entry point would load it), as in a project that
does not use it. What is timed is the session's wall clock: from the start of the pytest
command to its end (interpreter start, imports, collection, the forkserver's or the pool's
start, the tests, the pool's stop), the median over the rounds per variant. Then the
project's target, PASS or FAIL: the harness's session at most 0.7x the session pool's.
Exits 1 only when a variant's pytest run fails (its output's tail is printed), else 0.
Everything is removed at the end: the generated files, pytest's temporary folders and any
process a run left behind (reported as a problem).

    python benchmarks/bench_session.py [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import runs  # noqa: E402 - what the pytest-session benchmarks share

TARGET_RATIO = 0.7  # the harness's session at most this times the session pool's

_HARNESS = '''
import pytest
import torch
import torch.distributed as dist

''' + runs.MARKED_ALL_REDUCE.replace("__MODE__", "fresh")

_SESSION_POOL = '''
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2
WAIT_S = 120


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _set_up_group(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def _tear_down_group(rank, world_size):
    dist.barrier()  # so that each worker takes one of the two tasks
    dist.destroy_process_group()


def _all_reduce(rank, world_size):
    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return t.item()


def _on_ranks(pool, fn, *args):
    return pool.starmap_async(fn, [(r, WORLD_SIZE, *args) for r in range(WORLD_SIZE)]).get(WAIT_S)


@pytest.fixture(scope="session")
def pool():
    pool = mp.get_context("spawn").Pool(WORLD_SIZE)
    try:
        _on_ranks(pool, _set_up_group, _free_port())
        yield pool
        _on_ranks(pool, _tear_down_group)
    except BaseException:
        pool.terminate()
        raise
    else:
        pool.close()
    finally:
        pool.join()


@pytest.mark.parametrize("i", range(__N__))
def test_all_reduce(pool, i):
    assert _on_ranks(pool, _all_reduce) == [3.0] * WORLD_SIZE
'''

_MP_SPAWN = '''
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2


def _worker(rank, world_size, init_method):
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    try:
        t = torch.ones(1) * (rank + 1)
        dist.all_reduce(t)
        assert t.item() == 3
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("i", range(__N__))
def test_all_reduce(tmp_path, i):
    mp.spawn(_worker, args=(WORLD_SIZE, f"file://{tmp_path / 'store'}"), nprocs=WORLD_SIZE)
'''

VARIANTS: Dict[str, str] = {
    "harness": _HARNESS,
    "session_pool": _SESSION_POOL,
    "mp_spawn": _MP_SPAWN,
}


@dataclass
class Run:
    """One pytest session of a variant: its wall time, and what it left behind."""

    wall: float
    leftovers: List[str] = field(default_factory=list)


def run_variant(name: str, workdir: str, tests: int, run_id: str, timeout: float) -> Run:
    """Run the variant's generated file (already in `workdir`) once, in its own process group,
    timing the whole pytest command."""
    done = runs.run_pytest(workdir, f"test_{name}.py", run_id, timeout,
                           plugin=name == "harness", expect=f"{tests} passed")
    return Run(done.wall, done.leftovers)


def summarize(rounds: List[Run]) -> Dict[str, Any]:
    """The median session over the rounds, with its range, in s."""
    walls = [r.wall for r in rounds]
    return {"wall_s": statistics.median(walls), "min_s": min(walls), "max_s": max(walls),
            "rounds_s": walls}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all variants (>= 1)")
    parser.add_argument("--tests", type=int, default=4, help="tests per file (>= 1)")
    args = runs.parse_args(parser, "seconds per pytest run", min_tests=1)
    runs.exit_on_signals()

    with runs.work_folder("bench-session-", runs.test_files(VARIANTS, args.tests)) as workdir:
        results = runs.run_rounds(
            lambda name, run_id: run_variant(name, workdir, args.tests, run_id, args.timeout),
            list(VARIANTS), args.rounds, lambda run: f"{run.wall:.2f} s",
        )
    if results is None:
        return 1

    medians = {name: summarize(variant_runs) for name, variant_runs in results.items()}
    pool_s = medians["session_pool"]["wall_s"]
    print(runs.header(f"a pytest session of {args.tests} trivial 2-rank gloo tests", args.rounds))
    print(f"{'variant':<14}{'session s':>10}{'min-max s':>14}{'vs session_pool':>17}")
    for name, m in medians.items():
        spread = f"{m['min_s']:.2f}-{m['max_s']:.2f}"
        print(f"{name:<14}{m['wall_s']:>10.2f}{spread:>14}{m['wall_s'] / pool_s:>16.2f}x")
    ratio = medians["harness"]["wall_s"] / pool_s
    passed = ratio <= TARGET_RATIO
    print(f"harness session <= {TARGET_RATIO}x session_pool: {runs.verdict(passed)} "
          f"({ratio:.2f}x)")
    problems = runs.problems(results)
    runs.print_problems(problems)
    runs.write_json(args.json, args.tests, args.rounds, medians, problems,
                    target=runs.target("harness / session_pool", ratio, f"<= {TARGET_RATIO}x",
                                       passed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
