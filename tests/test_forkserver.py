"""harness.process.forkserver: a runner stops the helpers it started; a killed runner's forkserver
cleans up after it; test code that starts ranks when imported (no main guard) ends the run with
one line instead of a chain of forkservers.

Each test runs a small script (written to a temp dir) in a fresh interpreter with a private
TMPDIR, because the forkserver and resource tracker are per process.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
from pathlib import Path
from typing import Any, Dict, List, Tuple
from unittest import mock

import pytest

from harness.process import forkserver
from tests import zygote
from tests.fixtures import child_env, procs

WAIT_S = 240.0
ORPHAN_WAIT_S = 5.0  # after SIGKILL of the runner, for the forkserver to clean up and exit

PRELUDE = '''
import json
import multiprocessing
import os
import sys

from harness.process import forkserver, mp_forkserver


def start_forkserver():
    """Start the forkserver as a multi-process test does (as a runner does before its first
    test, with START_AS_FORK=1); check that it forks a child."""
    if os.environ.get("START_AS_FORK") == "1":
        assert forkserver.start_as_fork([]), "not started as a fork"
    ctx = forkserver.context("harness.process.rank")
    child = ctx.Process(target=os.getpid)
    child.start()
    child.join()
    assert child.exitcode == 0, child.exitcode
    return mp_forkserver.SERVER._forkserver_address  # the harness's own server's socket
'''

STOP_AND_RESTART = PRELUDE + '''

if __name__ == "__main__":
    report = {"before": forkserver.helper_pids()}
    before = forkserver.helper_pids()
    for round in ("first", "second"):  # stopping must not break starting again
        address = start_forkserver()
        pids = forkserver.helper_pids()
        forkserver.stop_helpers(before)
        report[round] = {
            "helpers": sorted(pids),
            "alive_after_stop": [p for p in pids.values() if os.path.exists(f"/proc/{p}")],
            "running_after_stop": forkserver.helper_pids(),
            "socket_left": os.path.exists(address),
            "socket_folder_kept": os.path.isdir(os.path.dirname(address)),
        }
    print(json.dumps(report), flush=True)
'''

KEEP_WHAT_RAN_BEFORE = PRELUDE + '''

if __name__ == "__main__":
    start_forkserver()
    before = forkserver.helper_pids()
    forkserver.stop_helpers(before)  # they were running before this "run": not its to stop
    print(json.dumps({"before": before, "after": forkserver.helper_pids()}), flush=True)
'''

KILLED_RUNNER = PRELUDE + '''

if __name__ == "__main__":
    address = start_forkserver()
    print(json.dumps({"helpers": forkserver.helper_pids(), "socket": address}), flush=True)
    sys.stdin.read()  # until killed
'''

GROUP_SIGNAL = PRELUDE + '''

import signal
import time


def rank_has_default_stop_signals():
    handlers = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)]
    sys.exit(0 if handlers == [signal.SIG_DFL, signal.SIG_DFL] else 1)


if __name__ == "__main__":
    start_forkserver()
    pid = forkserver.helper_pids()["forkserver"]
    os.kill(pid, signal.SIGTERM)  # as a signal to the whole process group would
    os.kill(pid, signal.SIGHUP)
    time.sleep(0.5)
    survived = os.waitpid(pid, os.WNOHANG) == (0, 0)
    ctx = forkserver.context("harness.process.rank")
    child = ctx.Process(target=rank_has_default_stop_signals)
    child.start()
    child.join()
    print(json.dumps({"survived": survived, "rank_exitcode": child.exitcode}), flush=True)
'''


NVML_CHECK = PRELUDE + '''

def forkserver_setting(queue):
    queue.put(os.environ.get(forkserver.NVML_CHECK_ENV))


if __name__ == "__main__":
    ctx = forkserver.context("harness.process.rank")
    queue = ctx.SimpleQueue()
    child = ctx.Process(target=forkserver_setting, args=(queue,))
    child.start()
    seen = queue.get()
    child.join()
    print(json.dumps({"forkserver": seen, "runner": os.environ.get(forkserver.NVML_CHECK_ENV)}))
'''


def alive(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    found = procs.process(pid)
    return found is not None and found.state != "Z"


@pytest.mark.slow
class ForkserverLifetime(unittest.TestCase):
    """The forkserver started as an interpreter (`python -m unittest`, pytest)."""

    env: Dict[str, str] = {}

    def setUp(self) -> None:
        self.tmp = self.temp_dir()
        self.scripts = self.temp_dir()

    def temp_dir(self) -> Path:
        folder = tempfile.TemporaryDirectory()
        self.addCleanup(folder.cleanup)
        return Path(folder.name)

    def start(self, source: str) -> subprocess.Popen:
        script = self.scripts / "script.py"
        script.write_text(textwrap.dedent(source))
        proc = subprocess.Popen(
            [sys.executable, str(script)], env=child_env({"TMPDIR": str(self.tmp), **self.env}),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )
        self.addCleanup(proc.wait)  # cleanups run last-in first: kill, then reap
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        return proc

    def run_script(self, source: str) -> Dict[str, Any]:
        proc = self.start(source)
        out, err = proc.communicate(timeout=WAIT_S)
        self.assertEqual(proc.returncode, 0, err)
        return json.loads(out)

    def test_stop_helpers_stops_and_reaps_what_the_run_started(self) -> None:
        report = self.run_script(STOP_AND_RESTART)
        self.assertEqual(report["before"], {})
        for round in ("first", "second"):
            with self.subTest(round=round):
                state = report[round]
                self.assertEqual(state["helpers"], ["forkserver", "resource tracker"])
                self.assertEqual(state["alive_after_stop"], [])
                self.assertEqual(state["running_after_stop"], {})
                self.assertFalse(state["socket_left"])
                # a deliberate stop leaves multiprocessing's temp folder to the living runner
                self.assertTrue(state["socket_folder_kept"])
        self.assertEqual(os.listdir(self.tmp), [])  # removed at the script's exit

    def test_helpers_running_before_are_left_alone(self) -> None:
        report = self.run_script(KEEP_WHAT_RAN_BEFORE)
        self.assertEqual(sorted(report["before"]), ["forkserver", "resource tracker"])
        self.assertEqual(report["after"], report["before"])

    def test_group_signals_spare_the_forkserver_not_its_ranks(self) -> None:
        """SIGTERM/SIGHUP to the process group: the forkserver stays to reap its ranks until
        the runner stops it; ranks forked from it still die of these signals."""
        report = self.run_script(GROUP_SIGNAL)
        self.assertEqual(report, {"survived": True, "rank_exitcode": 0})

    def test_forkserver_checks_cuda_through_nvml_so_its_forks_can_use_cuda(self) -> None:
        """torch.cuda.is_available() at import (suites and their imports call it) would
        initialise the CUDA driver in the forkserver and leave every rank unable to use CUDA;
        the forkserver asks NVML instead. The runner's own environment is left as it was."""
        report = self.run_script(NVML_CHECK)
        self.assertEqual(report, {"forkserver": "1", "runner": None})

    def test_forkserver_of_a_killed_runner_removes_its_socket_folder_and_exits(self) -> None:
        proc = self.start(KILLED_RUNNER)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            self.fail(f"the script failed: {proc.communicate(timeout=60)[1]}")
        started = json.loads(line)
        folder = Path(started["socket"]).parent
        self.assertEqual(list(self.tmp.iterdir()), [folder])
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        deadline = time.monotonic() + ORPHAN_WAIT_S
        pids = started["helpers"].values()
        while any(alive(pid) for pid in pids) or list(self.tmp.iterdir()):
            if time.monotonic() > deadline:
                self.assertEqual([pid for pid in pids if alive(pid)], [])
                self.assertEqual(list(self.tmp.iterdir()), [])
            time.sleep(0.05)


class ForkedForkserverLifetime(ForkserverLifetime):
    """The forkserver a runner starts as a fork of itself (`start_as_fork`): the same life."""

    env = {"START_AS_FORK": "1"}

    def test_forkserver_checks_cuda_through_nvml_so_its_forks_can_use_cuda(self) -> None:
        self.skipTest("started as a fork only where torch has no accelerator runtime built in")


WHERE_RANKS_COME_FROM = """
import json
import multiprocessing.forkserver
import os
import sys
import threading

from harness import MultiProcessTestCase, run_tests

SEEN_IN_RUNNER = []  # filled before the runs: empty in a fresh import of this file


class TestWhereRanksComeFrom(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_report(self):
        with open(f"/proc/{os.getppid()}/cmdline") as f:  # the forkserver's
            server = f.read().rstrip("\\0").split("\\0")
        # a rank may start a forkserver of its own: the lock guarding that must be free
        free = not multiprocessing.forkserver._forkserver._lock.locked()
        if self.rank == 0:
            with open(os.environ["REPORT"], "a") as f:
                f.write(json.dumps({"server": server, "seen": SEEN_IN_RUNNER, "free": free})
                        + "\\n")


if __name__ == "__main__":
    SEEN_IN_RUNNER.append("runner")
    for other_thread in (False, True):
        if other_thread:
            threading.Thread(target=threading.Event().wait, daemon=True).start()
        try:
            run_tests([sys.argv[0]])
        except SystemExit as end:
            assert end.code == 0, end.code
"""


@pytest.mark.slow
class RunnerStartsItsForkserverAsAFork(unittest.TestCase):
    def test_forked_when_alone_started_when_another_thread_runs(self) -> None:
        """`python FILE`: its first run forks the forkserver from the runner (no interpreter
        importing torch again); the second, with a thread running, starts one. Either way the
        ranks run a fresh import of the script, not the runner's module."""
        with tempfile.TemporaryDirectory() as folder:
            script, report = Path(folder, "where_ranks.py"), Path(folder, "report.jsonl")
            script.write_text(WHERE_RANKS_COME_FROM)
            proc = subprocess.run(
                [sys.executable, str(script)],
                env=child_env({"REPORT": str(report), **zygote.FRESH_INTERPRETER}),
                capture_output=True, text=True, timeout=WAIT_S,
            )
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
            forked, started = [json.loads(line) for line in report.read_text().splitlines()]
        self.assertEqual(forked["server"][1:], [str(script)])
        self.assertIn("from multiprocessing.forkserver import main", " ".join(started["server"]))
        self.assertEqual([forked["seen"], started["seen"]], [[], []])
        self.assertEqual([forked["free"], started["free"]], [True, True])

    def test_forked_under_python_m_unittest(self) -> None:
        with tempfile.TemporaryDirectory() as folder:
            Path(folder, "where_ranks.py").write_text(WHERE_RANKS_COME_FROM)
            report = Path(folder, "report.jsonl")
            proc = subprocess.run(
                [sys.executable, "-m", "unittest", "where_ranks"], cwd=folder,
                env=child_env({"REPORT": str(report), **zygote.FRESH_INTERPRETER}),
                capture_output=True, text=True,
                timeout=WAIT_S,
            )
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
            (forked,) = [json.loads(line) for line in report.read_text().splitlines()]
        self.assertEqual(forked["server"][1:], ["-m", "unittest", "where_ranks"])


class StartAsForkConditions(unittest.TestCase):
    """When `start_as_fork` forks (fork_forkserver stubbed: nothing is started here)."""

    def setUp(self) -> None:
        self.forks_made: List[Any] = []
        safe = [
            (forkserver.mp_forkserver, "fork_server", self.forks_made.append),
            (forkserver, "helper_pids", dict),
            (forkserver.threading, "active_count", lambda: 1),
            (forkserver, "_native_threads", lambda: forkserver._THREADS_AT_IMPORT),
            (forkserver, "_accelerator_built", lambda: False),
            (forkserver.settings, "start_method", lambda: "forkserver"),
        ]
        for target, name, value in safe:
            patcher = mock.patch.object(target, name, value)
            patcher.start()
            self.addCleanup(patcher.stop)

    def forks(self, *patch: Any, modules: Tuple[str, ...] = ()) -> bool:
        """Whether start_as_fork(modules) forks, with `patch` (target, name, value) applied."""
        with mock.patch.object(*patch) if patch else contextlib.nullcontext():
            forkserver.start_as_fork(modules)
        return bool(self.forks_made)

    def test_forks_when_safe(self) -> None:
        self.assertTrue(self.forks())

    def test_not_with_another_python_thread(self) -> None:
        self.assertFalse(self.forks(forkserver.threading, "active_count", lambda: 2))

    def test_not_with_a_native_thread_started_since_torch_was_imported(self) -> None:
        """Say OpenMP's pool, after a parallel op: a forked child hangs in its next one."""
        grown = forkserver._THREADS_AT_IMPORT | {"123456"}
        self.assertFalse(self.forks(forkserver, "_native_threads", lambda: grown))

    def test_not_with_an_accelerator_runtime_built_in(self) -> None:
        self.assertFalse(self.forks(forkserver, "_accelerator_built", lambda: True))

    def test_not_when_a_forkserver_runs(self) -> None:
        self.assertFalse(self.forks(forkserver, "helper_pids", lambda: {"forkserver": 1}))

    def test_not_when_ranks_are_spawned(self) -> None:
        self.assertFalse(self.forks(forkserver.settings, "start_method", lambda: "spawn"))

    def test_not_when_a_test_module_failed_to_import(self) -> None:
        self.addCleanup(forkserver._test_modules.remove, "tests.no_such_module")
        self.assertFalse(self.forks(modules=("tests.no_such_module",)))


# A user's first try: tests and the call that runs them, without `if __name__ == "__main__":`.
UNGUARDED_CLASS = """
import sys
import unittest

from harness import MultiProcessTestCase, run_tests


class TestNoGuard(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_one(self):
        pass

    def test_two(self):
        pass

"""
GUARD_MESSAGE = 'put the code that runs its tests under `if __name__ == "__main__":`'
# What the missing guard would start is a chain: each forkserver (or spawned rank) imports the
# script and starts the next one below itself. So the rule is the depth of the run's process
# tree, not how many processes it has at one instant (a loaded machine can show an exiting rank
# beside the next one): runner 0, forkserver or resource tracker 1, ranks 2.
MAX_DEPTH = 2


def _session_parents(sid: int) -> Dict[int, int]:
    """pid -> parent pid of the live (not zombie) processes of session `sid`."""
    return {p.pid: p.ppid for p in procs.processes() if p.state != "Z" and p.session == sid}


def session_processes(sid: int) -> List[int]:
    """The live (not zombie) processes of session `sid`."""
    return sorted(_session_parents(sid))


def session_depth(sid: int) -> int:
    """How deep session `sid`'s process tree is (a process whose parent is outside the session,
    its leader, or a daemon reparented to init, is at depth 0)."""
    parents = _session_parents(sid)

    def depth(pid: int) -> int:
        steps = 0
        while parents.get(pid) in parents and steps <= len(parents):
            pid, steps = parents[pid], steps + 1
        return steps

    return max(map(depth, parents), default=0)


@pytest.mark.slow
@unittest.skipUnless(os.path.isdir("/proc/self"), "counts processes through /proc (Linux)")
class MissingMainGuard(unittest.TestCase):
    """Test code that starts ranks when it is imported would start them again in the forkserver
    importing it and in every rank (without end: each forkserver starts the next); the run ends
    at once instead, with one line naming the missing guard, exit code 2, nothing left."""

    def run_unguarded(self, args: List[str], source: str, extra_env: Dict[str, str],
                      under_pytest: bool = False) -> str:
        """Run `source` (written as test_noguard.py) with `args`; return its stderr (pytest:
        its stdout, where pytest reports the end of its session)."""
        tmp, folder = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
        self.addCleanup(lambda: os.rmdir(tmp))  # empty: nothing the run wrote is left
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", str(folder)], check=True))
        (folder / "test_noguard.py").write_text(source)
        env = child_env({"TMPDIR": str(tmp), **extra_env})
        env["PYTHONPATH"] = os.pathsep.join([str(folder), env["PYTHONPATH"]])
        proc = subprocess.Popen(
            [sys.executable, *args], cwd=folder, env=env, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.addCleanup(lambda: [os.kill(p, signal.SIGKILL) for p in session_processes(proc.pid)])
        deepest, deadline = 0, time.monotonic() + WAIT_S
        while proc.poll() is None and time.monotonic() < deadline:
            deepest = max(deepest, session_depth(proc.pid))
            time.sleep(0.01)
        out, err = proc.communicate(timeout=WAIT_S)
        time.sleep(0.5)  # what the run started has exited with it
        self.assertEqual(session_processes(proc.pid), [], "processes left running")
        self.assertEqual(proc.returncode, 2, out + err)
        self.assertLessEqual(deepest, MAX_DEPTH, "the run started a chain of processes")
        if under_pytest:
            out, err = "", "".join(line for line in out.splitlines() if GUARD_MESSAGE in line)
        self.assertEqual(out, "")
        self.assertEqual(len(err.splitlines()), 1, err)
        self.assertIn(GUARD_MESSAGE, err)
        self.assertIn("test_noguard.py", err)
        return err

    def test_script_that_runs_tests_on_import(self) -> None:
        self.run_unguarded(["test_noguard.py"], UNGUARDED_CLASS + "run_tests()\n", {})

    def test_script_calling_unittest_main_on_import(self) -> None:
        self.run_unguarded(["test_noguard.py"], UNGUARDED_CLASS + "unittest.main()\n", {})

    def test_spawned_ranks_importing_the_script(self) -> None:
        self.run_unguarded(
            ["test_noguard.py"], UNGUARDED_CLASS + "run_tests()\n",
            {"HARNESS_START_METHOD": "spawn"},
        )

    def test_module_imported_by_name_that_runs_its_tests(self) -> None:
        """Imported by a runner (here `python -m unittest`), the module is preloaded by name in
        the forkserver, whose own run of it started the next forkserver, and so on."""
        source = UNGUARDED_CLASS + (
            "unittest.main(module=__name__, argv=[sys.argv[0], 'TestNoGuard'], exit=False)\n"
        )
        self.run_unguarded(["-m", "unittest", "test_noguard"], source, {})

    def test_module_collected_by_pytest_that_runs_its_tests(self) -> None:
        """pytest captures stderr: the line ends the session through pytest.exit."""
        source = UNGUARDED_CLASS + (
            "unittest.main(module=__name__, argv=[sys.argv[0], 'TestNoGuard'], exit=False)\n"
        )
        self.run_unguarded(["-m", "pytest", "-q", "-p", "no:cacheprovider", "test_noguard.py"],
                           source, {}, under_pytest=True)


if __name__ == "__main__":
    unittest.main()
