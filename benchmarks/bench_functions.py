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
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from tests.fixtures import procs  # noqa: E402 - the one /proc reader of tests and benchmarks

TAIL_CHARS = 4000
GROUP_EXIT_WAIT_S = 10.0  # how long a run's helpers (forkserver, pool workers) may take to exit

_MARKED = '''
import pytest
import torch
import torch.distributed as dist


@pytest.mark.ranks(2, mode="__MODE__")
@pytest.mark.parametrize("i", range(__N__))
def test_all_reduce(rank, world_size, i):
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t)
    assert t.item() == 3
'''

_CLASS = '''
import torch
import torch.distributed as dist

from harness import MultiProcessTestCase


class TestAllReduce(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2


def _all_reduce(self):
    dist.init_process_group(
        "gloo", init_method=self.init_method, rank=self.rank, world_size=self.world_size
    )
    t = torch.ones(1) * (self.rank + 1)
    dist.all_reduce(t)
    assert t.item() == 3
    dist.destroy_process_group()


for _i in range(__N__):
    setattr(TestAllReduce, f"test_all_reduce_{_i:03d}", _all_reduce)
'''

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


class RunFailed(Exception):
    """A variant's pytest run did not pass all its tests."""


@dataclass
class Run:
    """One pytest run of a variant: each test's seconds (in run order) and the run's wall time."""

    tests: List[float]
    wall: float
    leftovers: List[str] = field(default_factory=list)

    @property
    def per_test(self) -> float:
        return statistics.median(self.tests[1:])

    @property
    def outside(self) -> float:
        return self.wall - sum(self.tests)


def group_members(pgid: int) -> List[int]:
    """The processes in process group `pgid`, from /proc."""
    return [p.pid for p in procs.processes() if p.pgrp == pgid]


def stop_group(pgid: int, wait_s: float) -> List[int]:
    """Wait up to `wait_s` for group `pgid` to empty; kill what is left; return its pids."""
    deadline = time.monotonic() + wait_s
    while True:
        left = group_members(pgid)
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    if left:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            time.sleep(1.0)
    return left


def read_junit(path: str, expected: int) -> List[float]:
    """Each test's seconds (setup + call + teardown) from pytest's junit report, in run order."""
    suite = ElementTree.parse(path).getroot().find("testsuite")
    if suite is None:
        raise RunFailed(f"{path}: no testsuite")
    times, names = [], []
    for case in suite.iter("testcase"):
        names.append(f"{case.get('classname')}::{case.get('name')}")
        if any(child.tag in ("failure", "error", "skipped") for child in case):
            raise RunFailed(f"{names[-1]} did not pass")
        times.append(float(case.get("time", "nan")))
    if len(times) != expected:
        raise RunFailed(f"{len(times)} tests reported, {expected} expected: {', '.join(names)}")
    return times


def run_variant(name: str, workdir: str, tests: int, run_id: str, timeout: float) -> Run:
    """Run the variant's generated file (already in `workdir`) once, in its own process group."""
    basetemp = os.path.join(workdir, f"basetemp-{run_id}")
    tmp = os.path.join(workdir, f"tmp-{run_id}")
    os.mkdir(tmp)
    junit = os.path.join(workdir, f"junit-{run_id}.xml")
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "harness.pytest_plugin",
        "-p", "no:cacheprovider", f"--basetemp={basetemp}", f"--junitxml={junit}",
        f"test_{name}.py",
    ]
    env = dict(os.environ, TMPDIR=tmp, GLOO_SOCKET_IFNAME="lo")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    started = time.perf_counter()
    child = subprocess.Popen(
        command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = child.communicate(timeout=timeout)
        wall = time.perf_counter() - started
    except subprocess.TimeoutExpired:
        stop_group(child.pid, 0)
        output, _ = child.communicate()
        tail = output.decode(errors="replace")[-TAIL_CHARS:]
        raise RunFailed(f"timed out after {timeout:.0f} s\n$ {' '.join(command)}\n{tail}") from None
    except BaseException:  # interrupted: the run and all it started go
        stop_group(child.pid, 0)
        child.wait()
        raise
    left = stop_group(child.pid, GROUP_EXIT_WAIT_S)
    tail = output.decode(errors="replace")[-TAIL_CHARS:]
    if child.returncode != 0:
        raise RunFailed(f"exit code {child.returncode}; cwd {workdir}\n$ {' '.join(command)}\n"
                        f"{tail}")
    try:
        times = read_junit(junit, tests)
    except (RunFailed, OSError, ElementTree.ParseError) as error:
        raise RunFailed(f"{error}\n$ {' '.join(command)}\n{tail}") from None
    leftovers = [f"{len(left)} process(es) still running after it ({left})"] if left else []
    stray = sorted(os.listdir(tmp))
    if stray:
        leftovers.append(f"left in its TMPDIR: {', '.join(stray[:5])}")
    return Run(times, wall, leftovers)


def summarize(runs: List[Run], tests: int) -> Dict[str, Any]:
    """Medians over the rounds, in ms (wall in s)."""
    return {
        "per_test_ms": statistics.median(r.per_test for r in runs) * 1e3,
        "first_ms": statistics.median(r.tests[0] for r in runs) * 1e3,
        "wall_per_test_ms": statistics.median(r.wall / tests for r in runs) * 1e3,
        "wall_s": statistics.median(r.wall for r in runs),
        "outside_tests_s": statistics.median(r.outside for r in runs),
        "rounds": [
            {"per_test_ms": r.per_test * 1e3, "first_ms": r.tests[0] * 1e3, "wall_s": r.wall,
             "test_ms": [t * 1e3 for t in r.tests]}
            for r in runs
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


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=20, help="tests per variant (>= 2)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all variants (>= 1)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per pytest run")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers here")
    args = parser.parse_args()
    if args.tests < 2 or args.rounds < 1:
        parser.error("--tests must be at least 2 and --rounds at least 1")
    for sig in (signal.SIGTERM, signal.SIGHUP):  # so that the clean-up below runs
        signal.signal(sig, _raise_exit)

    workdir = tempfile.mkdtemp(prefix="bench-functions-")
    runs: Dict[str, List[Run]] = {name: [] for name in VARIANTS}
    try:
        with open(os.path.join(workdir, "pytest.ini"), "w") as f:
            f.write("[pytest]\n")  # this folder is the rootdir: no settings from above it
        for name, source in VARIANTS.items():
            with open(os.path.join(workdir, f"test_{name}.py"), "w") as f:
                f.write(source.replace("__N__", str(args.tests)))
        names = list(VARIANTS)
        for round_ in range(args.rounds):
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                try:
                    runs[name].append(
                        run_variant(name, workdir, args.tests, f"{name}-{round_}", args.timeout)
                    )
                except RunFailed as error:
                    print(f"variant {name} failed (round {round_ + 1}): {error}", file=sys.stderr)
                    return 1
                print(f"  round {round_ + 1}: {name} done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    medians = {name: summarize(variant_runs, args.tests) for name, variant_runs in runs.items()}
    print(f"{args.tests} trivial 2-rank gloo tests per variant, {args.rounds} round(s), "
          f"{os.cpu_count()} cores, torch {_torch_version()}; medians over the rounds")
    print(f"{'variant':<14}{'per test ms':>12}{'first ms':>10}{'wall/N ms':>11}{'wall s':>8}"
          f"{'outside s':>11}")
    for name, m in medians.items():
        print(f"{name:<14}{m['per_test_ms']:>12.1f}{m['first_ms']:>10.1f}"
              f"{m['wall_per_test_ms']:>11.1f}{m['wall_s']:>8.2f}{m['outside_tests_s']:>11.2f}")
    print("(per test: median without the first test; outside: wall minus the tests' times)")
    checks = targets(medians)
    for label, value, limit, passed in checks:
        unit = "" if label.endswith("(ms)") else "x"
        print(f"  {label:<22}{value:>9.2f}{unit:<2} target {limit:<9}"
              f"{'PASS' if passed else 'FAIL'}")
    problems = [f"{name}: {note}" for name, rs in runs.items() for r in rs for note in r.leftovers]
    for problem in problems:
        print(f"  problem: {problem}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({
                "tests": args.tests, "rounds": args.rounds, "cpu_count": os.cpu_count(),
                "variants": medians, "problems": problems,
                "targets": [{"target": label, "value": value, "limit": limit, "passed": passed}
                            for label, value, limit, passed in checks],
            }, f, indent=2)
    return 0


def _torch_version() -> Optional[str]:
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
