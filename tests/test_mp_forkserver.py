"""harness/process/mp_forkserver.py: the harness's own forkserver, apart from multiprocessing's
process-wide one that a user's own pools use, in both directions.

A pytest session in a subprocess runs, in order: a user's forkserver pool (it starts the
process-wide server), two fresh ranked tests, the user's pool again, and a check. The pool's
workers report their parent (the user's server) and what they imported; the ranks report
their parent. Run twice: with the harness's server forked from the pytest process after
collection, and started as an interpreter (a thread of the user's conftest keeps the harness
from forking).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from harness.process import mp_forkserver
from tests.fixtures import child_env, procs

LEFTOVER_WAIT_S = 5.0  # for what the session started to exit after it

USER_POOL = '''
import multiprocessing
import os
import sys


def probe(_):
    """What a user's pool worker sees: its parent, and whether it imported what it never
    asked for."""
    return os.getppid(), "harness" in sys.modules, "torch" in sys.modules


def run_pool():
    with multiprocessing.get_context("forkserver").Pool(2) as pool:
        return pool.map(probe, range(2))
'''

SESSION = '''
import json
import os

import pytest
import torch
import torch.distributed as dist

import user_pool
from harness.process import mp_forkserver

SEEN = {}
HERE = os.path.dirname(os.path.abspath(__file__))


def test_users_pool_before():
    SEEN["before"] = user_pool.run_pool()


@pytest.mark.ranks(2)
@pytest.mark.parametrize("i", range(2))
def test_fresh_ranks(rank, i):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2
    with open(os.path.join(HERE, f"rank{rank}-{i}.json"), "w") as out:
        json.dump({"parent": os.getppid()}, out)


def test_users_pool_after():
    SEEN["after"] = user_pool.run_pool()
    ranks = [json.load(open(os.path.join(HERE, name)))
             for name in os.listdir(HERE) if name.startswith("rank")]
    harness_server = mp_forkserver.helper_pids()["forkserver"]
    with open(f"/proc/{harness_server}/cmdline") as server, open("/proc/self/cmdline") as me:
        forked = server.read() == me.read()  # a fork of this process, else an interpreter
    assert forked == (os.environ["EXPECT_SERVER"] == "forked"), "forked: {}".format(forked)
    user_servers = {parent for parent, _, _ in SEEN["before"] + SEEN["after"]}
    assert len(ranks) == 4
    assert {r["parent"] for r in ranks} == {harness_server}, "ranks not from the harness's server"
    assert harness_server not in user_servers, "the user's pool used the harness's server"
    assert len(user_servers) == 1, "the user's server changed between its uses"
    imported = [(h, t) for _, h, t in SEEN["before"] + SEEN["after"]]
    assert imported == [(False, False)] * 4, "the user's workers imported harness or torch"
'''

THREAD_IN_CONFTEST = '''
import threading

threading.Thread(target=threading.Event().wait, args=(600,), daemon=True).start()
'''


def run_pytest(folder: Path, args: List[str], env: Dict[str, str]) -> Tuple[str, str]:
    """pytest with the harness's plugin in `folder`, in a session of its own; its output, once
    it ended and nothing it started (forkserver, ranks, pool workers) is alive."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "harness.pytest_plugin", "-p", "no:cacheprovider",
         "-q", *args],
        cwd=folder, env=child_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    while True:
        left = [p for p in procs.processes() if p.session == proc.pid and p.state != "Z"]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for leftover in left:
        os.kill(leftover.pid, signal.SIGKILL)
    assert left == [], f"left running: {left}"
    return out, err


@pytest.mark.slow
@pytest.mark.parametrize("server", ["forked", "started", "forked in an xdist worker"])
def test_a_users_forkserver_pool_and_fresh_ranks_keep_apart(tmp_path: Path, server: str) -> None:
    """Also: the harness's server is a fork of the pytest process (or of the xdist worker),
    made when collection ended, where that is safe; an interpreter where it is not."""
    (tmp_path / "user_pool.py").write_text(USER_POOL)
    (tmp_path / "test_mixed.py").write_text(SESSION)
    if server == "started":
        (tmp_path / "conftest.py").write_text(THREAD_IN_CONFTEST)
    xdist = ["-n", "1"] if "xdist" in server else []
    expected = server.split()[0] if mp_forkserver.can_fork() else "started"  # 3.14: started
    out, err = run_pytest(tmp_path, [*xdist, "test_mixed.py"], {"EXPECT_SERVER": expected})
    assert "4 passed" in out, out[-3000:] + err[-2000:]


NOISY_RANK = '''
import logging
import threading
import warnings

import pytest


@pytest.mark.ranks(1)
def test_noisy(rank):
    warnings.warn("WARNED-IN-RANK")
    logging.getLogger("user").warning("LOGGED-IN-RANK")
    thread = threading.Thread(target=lambda: 1 / 0)
    thread.start()
    thread.join()
    assert False, "to see the rank's output"
'''


@pytest.mark.slow
@pytest.mark.parametrize("server", ["forked", "started"])
def test_a_ranks_warnings_logs_and_thread_errors_reach_its_output(
    tmp_path: Path, server: str
) -> None:
    """A rank forked from a server forked from pytest reports as one from a new interpreter:
    none of pytest's collection-time recorders (warnings, log handlers, thread hooks)."""
    (tmp_path / "test_noisy.py").write_text(NOISY_RANK)
    if server == "started":
        (tmp_path / "conftest.py").write_text(THREAD_IN_CONFTEST)
    out, _ = run_pytest(tmp_path, ["test_noisy.py"], {})
    for text in ("WARNED-IN-RANK", "LOGGED-IN-RANK", "ZeroDivisionError", "1 failed"):
        assert text in out, f"{text} missing:\n{out[-3000:]}"


GIVING_UP_CONFTEST = '''
import sys
import time

from harness.process import mp_forkserver


def pytest_collection_finish(session):
    def gives_up(listener_fd, alive_r):  # the server forked when the run loop starts
        time.sleep(3)  # the first test's ranks ask it meanwhile
        print("THE-SERVER-GAVE-UP", file=sys.stderr, flush=True)
        raise SystemExit(1)

    mp_forkserver.serve_requests = gives_up
'''

TWO_RANKED_TESTS = '''
import pytest


@pytest.mark.ranks(2)
def test_first(rank):
    pass


@pytest.mark.ranks(2)
def test_second(rank):
    pass
'''


@pytest.mark.slow
def test_a_forkserver_that_cannot_serve_fails_the_test_with_what_it_wrote(tmp_path: Path) -> None:
    """Its output in the failure; the session goes on, on a forkserver started anew."""
    (tmp_path / "conftest.py").write_text(GIVING_UP_CONFTEST)
    (tmp_path / "test_two.py").write_text(TWO_RANKED_TESTS)
    out, err = run_pytest(tmp_path, ["test_two.py"], {})
    assert "1 failed, 1 passed" in out, out[-3000:] + err[-2000:]
    assert "ForkserverError: the harness's forkserver could not start a rank" in out
    assert "THE-SERVER-GAVE-UP" in out
    assert "INTERNALERROR" not in out + err


def test_the_harness_server_is_not_the_process_wide_one() -> None:
    assert mp_forkserver.SERVER is not mp_forkserver.PROCESS_WIDE
    process = mp_forkserver.context().Process(target=print)
    assert isinstance(process, mp_forkserver.Process)
    assert mp_forkserver.context().get_start_method() == "forkserver"
