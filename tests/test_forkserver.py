"""harness.process.forkserver: a runner stops the helpers it started; a killed runner's forkserver
cleans up after it; test code that starts ranks when imported (no main guard) ends the run with
one line instead of a chain of forkservers.

Each test runs a small script (written to a temp dir) in a fresh interpreter with a private
TMPDIR, because the forkserver and resource tracker are per process.
"""

from __future__ import annotations

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
from typing import Any, Dict, List

import pytest

from tests.fixtures import child_env

WAIT_S = 240.0
ORPHAN_WAIT_S = 5.0  # after SIGKILL of the runner, for the forkserver to clean up and exit

PRELUDE = '''
import json
import multiprocessing
import os
import sys

from harness.process import forkserver


def start_forkserver():
    """Start the forkserver as a multi-process test does; check that it forks a child."""
    ctx = forkserver.context("harness.process.rank")
    child = ctx.Process(target=os.getpid)
    child.start()
    child.join()
    assert child.exitcode == 0, child.exitcode
    return multiprocessing.forkserver._forkserver._forkserver_address
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
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
class ForkserverLifetime(unittest.TestCase):
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
            [sys.executable, str(script)], env=child_env({"TMPDIR": str(self.tmp)}),
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
MAX_PROCESSES = 2 + 2  # world size + 2: runner, forkserver or resource tracker, ranks


def session_processes(sid: int) -> List[int]:
    """The live (not zombie) processes of session `sid`."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if entry.isdigit() and fields[0] != "Z" and int(fields[3]) == sid:
            pids.append(int(entry))
    return pids


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
        most, deadline = 0, time.monotonic() + WAIT_S
        while proc.poll() is None and time.monotonic() < deadline:
            most = max(most, len(session_processes(proc.pid)))
            time.sleep(0.01)
        out, err = proc.communicate(timeout=WAIT_S)
        time.sleep(0.5)  # what the run started has exited with it
        self.assertEqual(session_processes(proc.pid), [], "processes left running")
        self.assertEqual(proc.returncode, 2, out + err)
        self.assertLessEqual(most, MAX_PROCESSES)
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
