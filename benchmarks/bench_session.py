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
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from tests.fixtures import procs  # noqa: E402 - the one /proc reader of tests and benchmarks

TAIL_CHARS = 4000
GROUP_EXIT_WAIT_S = 10.0  # how long a run's helpers (forkserver, pool workers) may take to exit
TARGET_RATIO = 0.7  # the harness's session at most this times the session pool's
PLUGIN = "harness.pytest_plugin"

_HARNESS = '''
import pytest
import torch
import torch.distributed as dist


@pytest.mark.ranks(2)
@pytest.mark.parametrize("i", range(__N__))
def test_all_reduce(rank, world_size, i):
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t)
    assert t.item() == 3
'''

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


class RunFailed(Exception):
    """A variant's pytest run did not pass all its tests."""


@dataclass
class Run:
    """One pytest session of a variant: its wall time, and what it left behind."""

    wall: float
    leftovers: List[str] = field(default_factory=list)


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


def run_variant(name: str, workdir: str, tests: int, run_id: str, timeout: float) -> Run:
    """Run the variant's generated file (already in `workdir`) once, in its own process group,
    timing the whole pytest command."""
    basetemp = os.path.join(workdir, f"basetemp-{run_id}")
    tmp = os.path.join(workdir, f"tmp-{run_id}")
    os.mkdir(tmp)
    plugin = PLUGIN if name == "harness" else f"no:{PLUGIN}"
    command = [
        sys.executable, "-m", "pytest", f"test_{name}.py", "-q", "-p", "no:cacheprovider",
        "-p", plugin, f"--basetemp={basetemp}",
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
    text = output.decode(errors="replace")
    if child.returncode != 0 or f"{tests} passed" not in text:
        raise RunFailed(f"exit code {child.returncode}; cwd {workdir}\n$ {' '.join(command)}\n"
                        f"{text[-TAIL_CHARS:]}")
    leftovers = [f"{len(left)} process(es) still running after it ({left})"] if left else []
    stray = sorted(os.listdir(tmp))
    if stray:
        leftovers.append(f"left in its TMPDIR: {', '.join(stray[:5])}")
    return Run(wall, leftovers)


def summarize(runs: List[Run]) -> Dict[str, Any]:
    """The median session over the rounds, with its range, in s."""
    walls = [r.wall for r in runs]
    return {"wall_s": statistics.median(walls), "min_s": min(walls), "max_s": max(walls),
            "rounds_s": walls}


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all variants (>= 1)")
    parser.add_argument("--tests", type=int, default=4, help="tests per file (>= 1)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per pytest run")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers here")
    args = parser.parse_args()
    if args.tests < 1 or args.rounds < 1:
        parser.error("--tests and --rounds must be at least 1")
    for sig in (signal.SIGTERM, signal.SIGHUP):  # so that the clean-up below runs
        signal.signal(sig, _raise_exit)

    workdir = tempfile.mkdtemp(prefix="bench-session-")
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
                print(f"  round {round_ + 1}: {name} {runs[name][-1].wall:.2f} s",
                      file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    medians = {name: summarize(variant_runs) for name, variant_runs in runs.items()}
    pool_s = medians["session_pool"]["wall_s"]
    print(f"a pytest session of {args.tests} trivial 2-rank gloo tests, {args.rounds} round(s), "
          f"{os.cpu_count()} cores, torch {_torch_version()}; medians over the rounds")
    print(f"{'variant':<14}{'session s':>10}{'min-max s':>14}{'vs session_pool':>17}")
    for name, m in medians.items():
        spread = f"{m['min_s']:.2f}-{m['max_s']:.2f}"
        print(f"{name:<14}{m['wall_s']:>10.2f}{spread:>14}{m['wall_s'] / pool_s:>16.2f}x")
    ratio = medians["harness"]["wall_s"] / pool_s
    passed = ratio <= TARGET_RATIO
    print(f"harness session <= {TARGET_RATIO}x session_pool: {'PASS' if passed else 'FAIL'} "
          f"({ratio:.2f}x)")
    problems = [f"{name}: {note}" for name, rs in runs.items() for r in rs for note in r.leftovers]
    for problem in problems:
        print(f"  problem: {problem}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({
                "tests": args.tests, "rounds": args.rounds, "cpu_count": os.cpu_count(),
                "variants": medians, "problems": problems,
                "target": {"target": "harness / session_pool", "value": ratio,
                           "limit": f"<= {TARGET_RATIO}x", "passed": passed},
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
