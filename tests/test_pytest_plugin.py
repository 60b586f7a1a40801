"""harness/pytest_plugin.py: multi-rank tests under pytest, as a user runs them.

Each test runs pytest in a subprocess on a small user file in a temp dir (no conftest, no
pytest settings), so what is checked is what a user sees: the headline, the frames, the
captured sections, assertion rewriting inside a rank process, pytest-timeout, the entry
point, `--debug-rank`. Each subprocess checks several things: a pytest start costs seconds.
"""

from __future__ import annotations

import importlib.util
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, List

import pytest

import harness
from tests.fixtures import user_pytest_env

ROOT = Path(harness.__file__).resolve().parent.parent

USER_FILE = '''
import time

import torch
import torch.distributed as dist

from harness import MultiProcessTestCase, MultiThreadedTestCase


class TestPlainMP(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_fails_on_rank1(self):
        value = 9.0
        print(f"hello from rank {self.rank}")
        if self.rank == 1:
            self.assertTrue(value == 99.0, msg="rank 1 expected 99")

    def test_bare_assert(self):
        x = 10
        if self.rank == 0:
            assert x == 0

    def test_passes(self):
        print(f"pass output rank {self.rank}")


class TestGroup(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _init(self):
        dist.init_process_group(
            "gloo", init_method=self.init_method, rank=self.rank, world_size=self.world_size
        )

    def test_crash(self):
        self._init()
        t = torch.ones(1)
        if self.rank == 1:
            import os
            os.abort()
        dist.all_reduce(t)
        dist.all_reduce(t)

    def test_hang(self):
        self._init()
        t = torch.ones(1)
        if self.rank == 1:
            time.sleep(60)
        dist.all_reduce(t)


class TestThreads(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_thread_fail(self):
        x = 3
        if self.rank == 1:
            assert x == 4
'''


def run_pytest(tmp_path: Path, *args: str, entry_point: bool = False) -> str:
    """pytest on the user file in `tmp_path`; its output. With `entry_point`, the plugin is
    found only through a `pytest11` entry point (a distribution's metadata on the path)."""
    (tmp_path / "test_user.py").write_text(USER_FILE)
    path = [str(ROOT)]
    if entry_point:
        info = tmp_path / "site" / "userpkg-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: userpkg\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(
            "[pytest11]\nharness.pytest_plugin = harness.pytest_plugin\n"
        )
        path.append(str(tmp_path / "site"))
    env = user_pytest_env(PYTHONPATH=os.pathsep.join(path), COLUMNS="300")
    plugin = [] if entry_point else ["-p", "harness.pytest_plugin"]
    command = [sys.executable, "-m", "pytest", *plugin, "-p", "no:cacheprovider",
               "test_user.py", *args]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    return done.stdout + done.stderr


def failure_section(output: str, test: str) -> str:
    """The report pytest printed for one failing test (between its header and the next)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("_") and f" {test} " in line)
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].startswith(("__", "=="))),
        len(lines),
    )
    return "\n".join(lines[start:end])


@pytest.mark.slow
def test_failures_lead_with_the_rank_and_show_the_users_frames(tmp_path: Path) -> None:
    out = run_pytest(tmp_path, "-rA", "--tb=short", "-k", "not hang")
    # The headline: the failing rank and its exception line.
    assert (
        "FAILED test_user.py::TestPlainMP::test_fails_on_rank1 - rank 1: AssertionError: "
        "False is not true : rank 1 expected 99"
    ) in out, out
    assert "FAILED test_user.py::TestThreads::test_thread_fail - rank 1: AssertionError: " \
        "assert 3 == 4" in out, out
    # Assertion rewriting inside a rank process (forked from the forkserver).
    assert "FAILED test_user.py::TestPlainMP::test_bare_assert - rank 0: AssertionError: " \
        "assert 10 == 0" in out, out
    # The rank's own frames, none of the harness's.
    report = failure_section(out, "TestPlainMP.test_fails_on_rank1")
    assert "test_user.py:23: in test_fails_on_rank1" in report, report
    assert 'self.assertTrue(value == 99.0, msg="rank 1 expected 99")' in report
    assert "harness/" not in report, report
    # Each rank's output in pytest's captured sections, for failures and (-rP) passes.
    assert "Captured stdout+stderr call (rank 1)" in report
    assert "hello from rank 1" in report
    passes = out[out.index("PASSES"):]
    assert "pass output rank 0" in passes and "pass output rank 1" in passes, passes
    # A crash: the crashing rank leads with its stack, the peer's reset comes after, labelled.
    crash = failure_section(out, "TestGroup.test_crash")
    assert "E   rank 1: died by signal SIGABRT" in crash, crash
    assert "test_user.py:53: in test_crash" in crash and "os.abort()" in crash
    assert "rank 0 raised as a consequence" in crash
    assert "Extension modules" not in crash and "Current thread" not in crash
    assert "FAILED test_user.py::TestGroup::test_crash - rank 1: died by signal SIGABRT" in out


@pytest.mark.slow
@pytest.mark.timeout(180)  # a limit of its own: a harness that never times out fails here
def test_hang_report_beats_pytest_timeout_and_tb_line_points_at_the_users_line(
    tmp_path: Path,
) -> None:
    if importlib.util.find_spec("pytest_timeout") is None:
        pytest.skip("pytest-timeout is not installed")
    # The plugin comes from a pytest11 entry point here (as in a project that installed it).
    out = run_pytest(
        tmp_path, "--timeout", "8", "--tb=line", "-k", "hang or fails_on_rank1",
        entry_point=True,
    )
    assert "Timeout (>" not in out, out  # pytest-timeout's own report never came
    assert "test_user.py:61: rank 1: timed out after" in out, out
    assert "test_user.py:23: rank 1: AssertionError: False is not true : rank 1 expected 99" in out
    assert "2 failed" in out


GPU_ONLY_FILE = """
from harness import MultiProcessTestCase, skip_if_lt_x_gpu
from harness.process import forkserver


class TestOnGpus(MultiProcessTestCase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()

    @skip_if_lt_x_gpu(2)
    def test_needs_two(self):
        pass


def test_no_forkserver_was_started():
    assert "forkserver" not in forkserver.helper_pids()
"""


@pytest.mark.slow
def test_a_session_of_gpu_tests_on_a_cpu_machine_starts_no_forkserver(tmp_path: Path) -> None:
    (tmp_path / "test_gpu_only.py").write_text(GPU_ONLY_FILE)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "harness.pytest_plugin", "-p", "no:cacheprovider",
         "-q", "-rs", "test_gpu_only.py"],
        cwd=tmp_path, env=user_pytest_env(HARNESS_DEVICE="cpu"),
        capture_output=True, text=True, timeout=300,
    )
    assert "1 passed, 1 skipped" in done.stdout, done.stdout[-3000:]


@pytest.mark.slow
def test_debug_rank_gets_the_terminal_for_breakpoint(tmp_path: Path) -> None:
    (tmp_path / "test_debug.py").write_text(textwrap.dedent('''
        import pytest

        from harness import MultiProcessTestCase

        @pytest.mark.ranks(2)
        def test_marked(rank):
            assert rank in (0, 1)

        class TestDebug(MultiProcessTestCase):
            @property
            def world_size(self):
                return 2

            def setUp(self):
                super().setUp()
                self._spawn_processes()

            def test_step(self):
                secret = 40 + self.rank
                if self.rank == 1:
                    breakpoint()
                assert secret in (40, 41)
    '''))
    env = user_pytest_env(HARNESS_TIMEOUT="5")  # --debug-rank outlasts a timeout
    command = [sys.executable, "-m", "pytest", "-p", "harness.pytest_plugin",
               "-p", "no:cacheprovider", "-q", "test_debug.py", "--debug-rank", "1"]
    seen = _in_terminal(command, tmp_path, env, after="(Pdb)", answers=["p secret", "c"])
    assert "[harness] rank 1 has this terminal" in seen, seen
    # each test the rank runs is named as the user knows it (a marked function: its node id)
    assert "[harness] rank 1 runs test_debug.py::test_marked: breakpoint()" in seen, seen
    assert "[harness] rank 1 runs test_debug.TestDebug.test_step" in seen, seen
    assert "41" in seen, seen
    assert "2 passed" in seen, seen


def _in_terminal(
    command: List[str], cwd: Path, env: Dict[str, str], after: str, answers: List[str]
) -> str:
    """Run `command` with a pseudo-terminal as its controlling terminal; type `answers`,
    one at each `after` prompt (a few seconds apart, past the timeout); the text it showed."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: its own session, the pty its terminal
        os.chdir(cwd)
        os.execve(command[0], command, env)
    seen, pending = "", list(answers)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(fd, 4096).decode(errors="replace")
                except OSError:  # the child closed the terminal: it exited
                    break
                if not chunk:
                    break
                seen += chunk
            if pending and seen.count(after) > len(answers) - len(pending):
                time.sleep(6)  # longer than HARNESS_TIMEOUT: the timeout must wait for us
                os.write(fd, (pending.pop(0) + "\n").encode())
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        os.close(fd)
    return seen


XDIST_FILE = '''
import enum

from harness import MultiProcessTestCase, MultiThreadedTestCase


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class TestGridOverProcesses(MultiProcessTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_grid(self):
        self.run_subtests({"color": [Color.RED, Color.BLUE]}, self._check)

    def _check(self, color):
        self.assertEqual(color, Color.BLUE)


class TestGridOverThreads(MultiThreadedTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_grid_passes(self):
        self.run_subtests({"color": [Color.RED, Color.BLUE]}, lambda color: None)
'''


@pytest.mark.slow
def test_under_xdist_grid_points_with_any_params_reach_the_controller(tmp_path: Path) -> None:
    if importlib.util.find_spec("xdist") is None:
        pytest.skip("pytest-xdist is not installed")
    (tmp_path / "test_grid.py").write_text(XDIST_FILE)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "harness.pytest_plugin", "-p", "no:cacheprovider",
         "-n", "1", "-rA", "test_grid.py"],
        cwd=tmp_path, env=user_pytest_env(COLUMNS="300"), capture_output=True,
        text=True, timeout=600,
    )
    out = done.stdout + done.stderr
    assert "DumpError" not in out and "can't serialize" not in out, out
    # The failing grid point, its params shown by their repr (pytest's own counting: the
    # failed grid point, and both tests).
    assert ("SUBFAILED(color='<Color.RED: 1>') test_grid.py::TestGridOverProcesses::test_grid"
            in out), out
    assert "1 failed, 2 passed" in out, out
