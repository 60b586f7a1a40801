"""harness.RankPool and the `rank_pool` fixture (harness/pytest_plugin/pool.py).

The one-line errors are checked here, in this process: each is raised before a rank starts.
What the ranks do is checked as a user runs it: one pytest subprocess on a small project (a
conftest that keeps a session pool in `pytest.pool`, as torchmetrics' does, and a test module
with helpers), its outcome read from the output and what the ranks left in $POOL_OUT.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, NamedTuple

import pytest
import torch

import harness
from harness.pytest_plugin import pool
from harness.pytest_plugin.pool import RankPool
from tests.fixtures import user_pytest_env


def module_level(rank: int, world_size: int, *args: object, **kwargs: object) -> int:
    return rank


class TestOneLineErrors:
    """Bad input, said in one line naming what is wrong, before any rank starts."""

    @pytest.mark.parametrize("size", [0, -1])
    def test_a_world_size_below_one(self, size: int) -> None:
        with pytest.raises(ValueError, match=f"^RankPool: world size {size} is below 1"):
            RankPool(size)

    def test_a_world_size_that_is_no_number(self) -> None:
        with pytest.raises(TypeError, match="^RankPool: world size '2' is not an int$"):
            RankPool("2")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="RankPool.run: world size 0 is below 1"):
            RankPool(2).run(module_level, world_size=0)

    def test_an_unknown_option_is_both_errors_python_and_the_marker_use(self) -> None:
        for error in (TypeError, ValueError):
            with pytest.raises(error, match=r"^RankPool: unknown option 'colour' \(known: mode,"):
                RankPool(2, colour="red")
        with pytest.raises(TypeError, match="unknown option 'backend'"):
            harness.RankPool(2)(backend="gloo")  # the call makes a pool: the same options

    def test_an_unknown_option_value(self) -> None:
        with pytest.raises(ValueError, match="^RankPool: unknown mode 'bogus'"):
            RankPool(2, mode="bogus")
        with pytest.raises(ValueError, match="^RankPool: unknown device 'tpu'"):
            RankPool(2, device="tpu")
        with pytest.raises(ValueError, match="RankPool: skip_leak_checks: unknown check 'nope'"):
            RankPool(2, skip_leak_checks="nope")

    @pytest.mark.parametrize("method", ["map", "starmap"])
    def test_a_number_of_items_other_than_the_world_size(self, method: str) -> None:
        with pytest.raises(ValueError, match=(
            f"^RankPool.{method}: 3 items for a pool of 2 ranks; give one item per rank"
        )):
            getattr(RankPool(2), method)(module_level, [(1,), (2,), (3,)])

    def test_a_starmap_item_that_is_no_tuple(self) -> None:
        with pytest.raises(TypeError, match=r"^RankPool.starmap: item 1 \(int\) is not a tuple"):
            RankPool(2).starmap(module_level, [(1,), 2])

    def test_a_call_after_close(self) -> None:
        with RankPool(2) as closed:
            pass
        for call in (lambda: closed.run(module_level), lambda: closed.map(abs, [1, 2])):
            with pytest.raises(ValueError, match=r"^RankPool.\w+: the pool is closed"):
                call()
        assert closed.join() is None  # nothing pending

    def test_a_pool_after_the_session_ended(self, monkeypatch: pytest.MonkeyPatch) -> None:
        ended = pool._Now()
        ended.ended = True
        monkeypatch.setattr(pool, "_NOW", ended)
        with pytest.raises(RuntimeError, match="^RankPool.run: the pytest session has ended"):
            RankPool(2).run(module_level)
        monkeypatch.setattr(pool, "_NOW", pool._Now())
        with pytest.raises(RuntimeError, match="^RankPool.map: no pytest session is running"):
            RankPool(2).map(module_level, [1, 2])


class TestRefusedFunctions:
    """`fn` must be found in the ranks by module and name: anything else is one line naming
    it by its qualified name, never by the repr of what it carries."""

    def test_a_lambda_and_a_nested_function(self) -> None:
        def nested(rank: int, world_size: int) -> int:
            return rank

        with pytest.raises(TypeError) as lam:
            RankPool(2).run(lambda rank, world_size: rank)
        assert "<lambda> is not a module-level function" in str(lam.value)
        with pytest.raises(TypeError) as local:
            RankPool(2).starmap(nested, [(0, 2), (1, 2)])
        assert str(local.value).startswith(
            "RankPool.starmap: TestRefusedFunctions.test_a_lambda_and_a_nested_function"
            ".<locals>.nested is not a module-level function")

    def test_a_partial_of_a_local_function_names_the_function_not_its_arguments(self) -> None:
        def local(rank: int, world_size: int, weights: torch.Tensor) -> int:
            return rank

        bound = functools.partial(local, weights=torch.arange(1000.0))
        with pytest.raises(TypeError) as refused:
            RankPool(2).run(bound)
        text = str(refused.value)
        assert "functools.partial of TestRefusedFunctions." in text and "local" in text, text
        assert "\n" not in text and "tensor" not in text, text

    def test_a_callable_object_and_a_builtin(self) -> None:
        with pytest.raises(TypeError, match="^RankPool.run: a RankPool object is not a module"):
            RankPool(2).run(RankPool(2))
        with pytest.raises(TypeError, match="^RankPool.map: abs is not a module-level"):
            RankPool(2).map(abs, [1, 2])

    def test_an_argument_that_cannot_travel_is_named_by_its_type(self) -> None:
        lock = threading.Lock()
        for call, named in (
            (lambda: RankPool(2).run(module_level, 1, lock), "argument 1 of module_level"),
            (lambda: RankPool(2).run(module_level, guard=lock), "argument guard of module_level"),
            (lambda: RankPool(2).map(module_level, [1, lock]), "item 1 of module_level"),
            (lambda: RankPool(2).run(functools.partial(module_level, lock)),
             "bound argument 0 of module_level"),
        ):
            with pytest.raises(TypeError) as refused:
                call()
            text = str(refused.value)
            assert named in text and "(lock) cannot be sent to the rank processes" in text, text
            assert "\n" not in text, text


class TestThePool:
    def test_is_exported_from_the_package(self) -> None:
        assert harness.RankPool is RankPool

    def test_options_are_fixed_when_made_and_calling_it_makes_another(self) -> None:
        made = RankPool(3, mode="fresh", timeout=5)
        assert made.world_size == 3
        assert repr(made) == ("RankPool(3, mode='fresh', device='auto', init=True, timeout=5, "
                              "skip_leak_checks=())")
        other = made(4, device="cpu")
        assert repr(other) == ("RankPool(4, mode='fresh', device='cpu', init=True, timeout=5, "
                               "skip_leak_checks=())")
        assert made(skip_leak_checks="environ").world_size == 3

    def test_the_fixture_is_a_pool_of_two_shared_ranks(self, rank_pool: RankPool) -> None:
        assert repr(rank_pool) == repr(RankPool(2, mode="shared"))
        assert repr(rank_pool(4, mode="fresh")) == repr(RankPool(4, mode="fresh"))


# -- as a user runs it -------------------------------------------------------------------------

CONFTEST = '''
import os
from pathlib import Path

import pytest

from harness import RankPool


def pytest_configure(config):
    pytest.pool = RankPool(2)  # torchmetrics' session pool, as a port keeps it


def pytest_sessionfinish(session):
    pytest.pool.close()
    pytest.pool.join()


def after_the_session(rank, world_size):
    return rank


def pytest_unconfigure(config):
    try:
        RankPool(2).run(after_the_session)
    except RuntimeError as error:
        Path(os.environ["POOL_OUT"], "after_session").write_text(str(error))
'''

TESTS = '''
import functools
import os
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from harness import RankPool


def note(name, values):
    with open(Path(os.environ["POOL_OUT"], name), "a") as f:
        f.write(" ".join(str(value) for value in values) + "\\n")


def ranked(rank, world_size, base, device="unset", mode="unset"):
    t = torch.ones(1) * rank
    dist.all_reduce(t)
    return rank, world_size, base, t.item(), device, mode


def pid(rank, world_size):
    return os.getpid(), os.getppid()


def square(x):
    return x * x, dist.get_rank(), dist.get_world_size()


def scaled(weights, scale, rank):
    t = weights * scale + rank
    dist.all_reduce(t)
    return t.tolist()


def _helper(rank, world_size):  # torchmetrics' shape: the helper's worker gets (rank, size)
    assert (dist.get_rank(), dist.get_world_size()) == (rank, world_size)
    return os.getpid(), os.getppid()


def run_distributed():  # a helper of the module: it reaches the conftest's pool
    return pytest.pool.starmap(_helper, [(rank, 2) for rank in range(2)])


def pids_by_a_new_pool():  # a helper that makes a pool per call
    return RankPool(2).run(pid)


def test_run_in_rank_order(rank_pool):
    assert rank_pool.run(ranked, 10) == [(0, 2, 10, 1.0, "unset", "unset"),
                                         (1, 2, 10, 1.0, "unset", "unset")]


def test_every_keyword_reaches_the_function(rank_pool):
    got = rank_pool.run(ranked, 1, device="cuda:7", mode="fresh")
    assert [value[4:] for value in got] == [("cuda:7", "fresh")] * 2
    # world_size= picks the set of that size; fn gets it positionally
    assert rank_pool.run(ranked, 0, world_size=3) == [(r, 3, 0, 3.0, "unset", "unset")
                                                      for r in range(3)]


def test_map_and_starmap_item_r_to_rank_r(rank_pool):
    assert rank_pool.map(square, [3, 4]) == [(9, 0, 2), (16, 1, 2)]
    assert rank_pool.starmap(scaled, [(torch.ones(2), 2.0, 0), (torch.ones(2), 3.0, 1)]) == [
        [6.0, 6.0], [6.0, 6.0]]


def test_a_partial_of_a_module_level_function(rank_pool):
    bound = functools.partial(ranked, base=5, device="meta")
    assert rank_pool.run(bound) == [(r, 2, 5, 1.0, "meta", "unset") for r in range(2)]
    weighted = functools.partial(scaled, torch.arange(2.0))
    assert rank_pool.starmap(weighted, [(1.0, 0), (1.0, 1)]) == [[1.0, 3.0], [1.0, 3.0]]


def test_the_session_pool_reached_by_a_helper():
    pids = run_distributed()
    note("session_pool", [p for p, _ in pids])
    note("forkservers", [parent for _, parent in pids])
    assert len(set(pids)) == 2


def test_pools_with_equal_options_share_one_set(rank_pool):
    first = [p for p, _ in run_distributed()]
    assert [p for p, _ in rank_pool.run(pid)] == first
    assert [[p for p, _ in pids_by_a_new_pool()] for _ in range(3)] == [first] * 3
    assert [p for p, _ in RankPool(2, timeout=30).run(pid)] == first


def test_another_mode_and_size(rank_pool):
    fresh = rank_pool(3, mode="fresh")
    first, second = fresh.run(pid), fresh.run(pid)
    note("fresh", [p for p, _ in first + second])
    assert len({p for p, _ in first + second}) == 6  # new ranks for each call
    assert fresh.map(square, [1, 2, 3]) == [(1, 0, 3), (4, 1, 3), (9, 2, 3)]
    threads = rank_pool(mode="threads")
    assert threads.run(ranked, 1) == [(r, 2, 1, 1.0, "unset", "unset") for r in range(2)]


def pool_fails(rank, world_size):
    assert rank == 0, "pool rank disagrees"


def test_a_rank_fails_the_calling_test(rank_pool):
    rank_pool.run(pool_fails)


def a_lock(rank, world_size):
    return threading.Lock()


def test_a_value_that_cannot_come_back(rank_pool):
    rank_pool.run(a_lock)
'''


class Session(NamedTuple):
    output: str
    left: Dict[str, List[str]]  # the notes the run left in $POOL_OUT, by name


def run_session(folder: Path, files: Dict[str, str]) -> Session:
    """pytest on these files, written into `folder`, as a user runs it."""
    for name, text in files.items():
        (folder / name).write_text(text)
    out = folder / "out"
    out.mkdir()
    env = user_pytest_env(POOL_OUT=str(out), COLUMNS="200")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "harness.pytest_plugin", "-p", "no:cacheprovider",
         "-q", "-rfE"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=300,
    )
    left = {path.name: path.read_text().splitlines() for path in out.iterdir()}
    return Session(done.stdout + done.stderr, left)


def _running(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Session:
    return run_session(tmp_path_factory.mktemp("pool"),
                       {"conftest.py": CONFTEST, "test_pools.py": TESTS})


@pytest.mark.slow
@pytest.mark.timeout(360)
class TestAsAUserRunsIt:
    def test_every_shape_passes_and_a_rank_failure_fails_its_test(self, session: Session) -> None:
        assert "2 failed, 7 passed" in session.output, session.output[-4000:]
        assert ("FAILED test_pools.py::test_a_rank_fails_the_calling_test - rank 1: "
                "AssertionError: pool rank disagrees") in session.output, session.output[-4000:]
        assert re.search(  # both ranks fail: either may be first
            r"FAILED test_pools.py::test_a_value_that_cannot_come_back - rank \d: TypeError: "
            r"RankPool.run: a_lock returned lock, which cannot be sent back to the test",
            session.output), session.output[-4000:]

    def test_a_rank_failure_points_at_the_users_code(self, session: Session) -> None:
        report = session.output[session.output.index("_ test_a_rank_fails_the_calling_test _"):]
        assert 'assert rank == 0, "pool rank disagrees"' in report, report
        assert "pool.py" not in report and "in_rank.py" not in report, report

    def test_a_pool_after_the_session_is_a_one_line_error(self, session: Session) -> None:
        assert session.left["after_session"] == [
            "RankPool.run: the pytest session has ended; a pool runs only while the session does"
        ]

    def test_nothing_is_left_running_after_the_session(self, session: Session) -> None:
        started = {int(pid) for name in ("session_pool", "forkservers", "fresh")
                   for line in session.left[name] for pid in line.split()}
        assert len(started) == 2 + 6 + 1, session.left  # one forkserver for them all
        deadline = time.monotonic() + 10
        while any(map(_running, started)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in started if _running(pid)] == []
