"""Nothing left behind on any exit, and no silent green.

Each test starts a runner (`run_all.py`, or a suite file that calls `run_tests()`) as a
subprocess in its own session with a private TMPDIR, stops it the way CI or a user would
(SIGTERM, SIGHUP, SIGKILL) or lets it finish, then checks its exit code, its closing line,
the JUnit XML of the tests that finished, that no process of its session is left, and
that nothing is left in its TMPDIR. The suites they run are written into temp dirs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from harness.runner import lifecycle
from tests.fixtures import REPO, child_env, procs

WAIT_S = 240.0  # to start torch, the forkserver and the ranks on a loaded 2-core machine
ORPHAN_WAIT_S = 5.0  # after SIGKILL of the runner: the forkserver's and ranks' clean-up (~1.5 s)

SLOW_SUITE = '''
import os
import time
from pathlib import Path

from harness import MultiProcessTestCase, run_tests


class TestStopped(MultiProcessTestCase):
    @property
    def world_size(self) -> int:
        return 2

    def test_a_quick(self) -> None:
        self.assertEqual(self.world_size, 2)

    def test_b_blocks(self) -> None:
        Path(os.environ["SIGNAL_TEST_MARKERS"], f"rank{self.rank}").touch()
        time.sleep(float(os.environ.get("SIGNAL_TEST_SLEEP", "300")))

    def test_c_after(self) -> None:
        self.assertEqual(self.world_size, 2)


if __name__ == "__main__":
    run_tests()
'''

ASAN_SUITE = '''
import sys

from harness import TEST_WITH_DEV_DBG_ASAN, TestCase, run_tests

if TEST_WITH_DEV_DBG_ASAN:
    print("Skip dev-asan as torch + multiprocessing spawn have known issues", file=sys.stderr)
    sys.exit(0)


class TestNeverLoaded(TestCase):
    def test_x(self) -> None:
        self.assertTrue(True)


if __name__ == "__main__":
    run_tests()
'''

RAISING_SUITE = 'raise RuntimeError("this suite cannot load on purpose")\n'
EXITING_SUITE = 'import sys\nprint("no configuration, giving up")\nsys.exit(3)\n'


def session_processes(sid: int) -> List[str]:
    """Every process (zombies included) whose session id is `sid`, as `pid state command`."""
    found = []
    for process in procs.processes():
        command = procs.command_line(process.pid)
        if process.session == sid and command is not None:  # None: exited while we looked
            found.append(f"{process.pid} {process.state} {command[:120]}")
    return found


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def xml_cases(folder: Path) -> List[str]:
    """`classname.name` of every <testcase> in the JUnit files of `folder`."""
    return sorted(
        f"{case.get('classname')}.{case.get('name')}"
        for path in folder.glob("TEST-*.xml")
        for case in ET.parse(path).getroot().iter("testcase")
    )


class RunnerInASession(unittest.TestCase):
    """A runner subprocess in its own session with a private TMPDIR, and the checks."""

    def setUp(self) -> None:
        self.dirs = {name: self.temp_dir() for name in ("tmp", "suites", "xml", "markers")}
        self.proc: Optional[subprocess.Popen] = None
        self.addCleanup(self.kill_session)

    def temp_dir(self) -> Path:
        folder = tempfile.TemporaryDirectory()
        self.addCleanup(folder.cleanup)
        return Path(folder.name)

    def kill_session(self) -> None:
        """If a check failed with the runner or its processes alive, end them."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=60)
        for line in session_processes(self.proc.pid):
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def write_suite(self, name: str, source: str) -> Path:
        path = self.dirs["suites"] / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        return path

    def start(self, args: List[str], env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
        """Start `python ARGS` from the suites' folder in a new session, TMPDIR private."""
        settings = {
            "TMPDIR": str(self.dirs["tmp"]),
            "SIGNAL_TEST_MARKERS": str(self.dirs["markers"]),
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            [sys.executable, *args], cwd=self.dirs["suites"], env=child_env(settings),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        return self.proc

    def run_to_end(self, args: List[str], env: Optional[Dict[str, str]] = None
                   ) -> Tuple[int, str, str]:
        proc = self.start(args, env)
        out, err = proc.communicate(timeout=WAIT_S)
        return proc.returncode, out, err

    def wait_for_ranks_in_test_b(self) -> None:
        """Until both ranks of test_b_blocks are inside the test (test_a has finished)."""
        deadline = time.monotonic() + WAIT_S
        while len(list(self.dirs["markers"].iterdir())) < 2:
            assert self.proc is not None
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                self.fail(f"the runner ended early ({self.proc.returncode}):\n{out}\n{err}")
            self.assertLess(time.monotonic(), deadline, "ranks never reached test_b_blocks")
            time.sleep(0.1)

    def stop_mid_run(self, args: List[str], signum: int, group: bool = False
                     ) -> Tuple[int, str, str]:
        """Start the slow suite, signal the runner (or its whole process group) while
        test_b_blocks runs, and wait for it to exit."""
        proc = self.start(args)
        self.wait_for_ranks_in_test_b()
        if group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
        return proc.returncode, out, err

    def assert_nothing_left(self) -> None:
        """Right after the runner exited: no process of its session, no file in its TMPDIR."""
        assert self.proc is not None
        self.assertEqual(session_processes(self.proc.pid), [])
        self.assertEqual(sorted(os.listdir(self.dirs["tmp"])), [])

    def assert_only_test_a_in_xml(self, classname: str) -> None:
        self.assertEqual(xml_cases(self.dirs["xml"]), [f"{classname}.test_a_quick"])


@pytest.mark.slow
class TestStopSignals(RunnerInASession):
    """SIGTERM and SIGHUP stop a run as Ctrl-C does: ranks stopped, what finished reported
    (table, XML), `interrupted: ...` as the closing line, exit 128 + the signal's number."""

    def check_run_all(self, signum: int, code: int, group: bool = False) -> None:
        self.write_suite("test_stopped", SLOW_SUITE)
        args = [str(REPO / "run_all.py"), "test_stopped.py", "--save-xml", str(self.dirs["xml"])]
        returncode, out, err = self.stop_mid_run(args, signum, group)
        self.assertEqual(returncode, code, out + err)
        name = signal.Signals(signum).name
        self.assertIn(f"run stopped: interrupted by {name}", out)
        row = next(line for line in out.splitlines() if line.startswith("test_stopped "))
        self.assertEqual(row.split()[1:4], ["1", "0", "0"])
        self.assertEqual(last_line(out), "interrupted: 1 passed, 0 failed, 0 skipped")
        self.assert_only_test_a_in_xml("test_stopped.TestStopped")
        self.assert_nothing_left()

    def check_run_tests(self, signum: int, code: int) -> None:
        self.write_suite("test_stopped", SLOW_SUITE)
        args = ["test_stopped.py", "-v", f"--save-xml={self.dirs['xml']}"]
        returncode, out, err = self.stop_mid_run(args, signum)
        self.assertEqual(returncode, code, out + err)
        self.assertIn("test_b_blocks (__main__.TestStopped.test_b_blocks) ... interrupted", err)
        self.assertIn("Ran 2 tests", err)
        self.assertIn(f"run stopped: interrupted by {signal.Signals(signum).name}", err)
        self.assertEqual(last_line(err), "interrupted: 1 passed, 0 failed, 0 skipped")
        self.assert_only_test_a_in_xml("TestStopped")
        self.assert_nothing_left()

    def test_sigterm_to_run_all(self) -> None:
        self.check_run_all(signal.SIGTERM, 143)

    def test_sighup_to_run_all(self) -> None:
        self.check_run_all(signal.SIGHUP, 129)

    def test_sigterm_to_run_alls_whole_process_group(self) -> None:
        # what `timeout` and many CI runners do: every process of the group gets it
        self.check_run_all(signal.SIGTERM, 143, group=True)

    def test_sigterm_to_a_suite_run_by_run_tests(self) -> None:
        self.check_run_tests(signal.SIGTERM, 143)

    def test_sighup_to_a_suite_run_by_run_tests(self) -> None:
        self.check_run_tests(signal.SIGHUP, 129)


@pytest.mark.slow
class TestKilledRunner(RunnerInASession):
    def test_sigkill_of_run_all_leaves_nothing_within_seconds(self) -> None:
        """The ranks and the forkserver notice that the runner is gone: they remove their
        folders (the test's private dir, the forkserver's `pymp-*` socket folder) and exit."""
        self.write_suite("test_stopped", SLOW_SUITE)
        returncode, _, _ = self.stop_mid_run(
            [str(REPO / "run_all.py"), "test_stopped.py"], signal.SIGKILL
        )
        self.assertEqual(returncode, -signal.SIGKILL)
        assert self.proc is not None
        deadline = time.monotonic() + ORPHAN_WAIT_S
        while session_processes(self.proc.pid) or os.listdir(self.dirs["tmp"]):
            if time.monotonic() > deadline:
                self.assert_nothing_left()  # fails, listing what is left
            time.sleep(0.1)


@pytest.mark.slow
class TestNormalExit(RunnerInASession):
    """A finished run has stopped and reaped every process it started before it exits."""

    def test_run_all_leaves_no_process_behind(self) -> None:
        self.write_suite("test_stopped", SLOW_SUITE)
        code, out, err = self.run_to_end(
            [str(REPO / "run_all.py"), "test_stopped.py", "-k", "test_a", "-k", "test_c"]
        )
        self.assertEqual(code, 0, out + err)
        self.assertEqual(last_line(out), "2 passed, 0 failed, 0 skipped")
        self.assert_nothing_left()

    def test_run_tests_leaves_no_process_behind(self) -> None:
        self.write_suite("test_stopped", SLOW_SUITE)
        code, out, err = self.run_to_end(["test_stopped.py", "-k", "test_a"])
        self.assertEqual(code, 0, out + err)
        self.assertIn("Ran 1 test", err)
        self.assert_nothing_left()


@pytest.mark.slow
class TestSuitesStoppingAtImport(RunnerInASession):
    """A suite that exits or raises at import is reported, never silently dropped."""

    def test_asan_exit_0_at_import_is_a_skipped_suite_with_its_reason(self) -> None:
        self.write_suite("test_asan_only", ASAN_SUITE)
        code, out, err = self.run_to_end(
            [str(REPO / "run_all.py"), "test_asan_only.py", "--save-xml", str(self.dirs["xml"])],
            env={"PYTORCH_TEST_WITH_DEV_DBG_ASAN": "1"},
        )
        self.assertEqual(code, 0, out + err)  # only skips happened: exit 0, and it says so
        row = next(line for line in out.splitlines() if line.startswith("test_asan_only "))
        self.assertEqual(row.split()[1:4], ["0", "0", "1"])
        self.assertTrue(row.endswith(
            "skipped at import: Skip dev-asan as torch + multiprocessing spawn have known issues"
        ), row)
        self.assertEqual(last_line(out), "0 passed, 0 failed, 1 skipped")
        self.assertEqual(xml_cases(self.dirs["xml"]), ["test_asan_only.ImportSkipped.test_import"])
        self.assert_nothing_left()

    def test_raising_or_exiting_nonzero_at_import_is_an_error(self) -> None:
        self.write_suite("test_raises_at_import", RAISING_SUITE)
        self.write_suite("test_exits_3_at_import", EXITING_SUITE)
        self.write_suite("test_asan_only", ASAN_SUITE)  # loads fine without the ASAN knob
        code, out, err = self.run_to_end([
            str(REPO / "run_all.py"), "test_raises_at_import.py", "test_exits_3_at_import.py",
            "test_asan_only.py", "--save-xml", str(self.dirs["xml"]),
        ])
        self.assertEqual(code, 1, out + err)
        self.assertIn("ERROR: test_raises_at_import.ImportFailure.test_import", out)
        self.assertIn('raise RuntimeError("this suite cannot load on purpose")', out)
        self.assertIn("ERROR: test_exits_3_at_import.ImportFailure.test_import", out)
        rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("test_")}
        self.assertTrue(rows["test_raises_at_import"].endswith(
            "error at import: RuntimeError: this suite cannot load on purpose"
        ), rows)
        self.assertTrue(rows["test_exits_3_at_import"].endswith("error at import: SystemExit: 3"))
        self.assertEqual(last_line(out), "1 passed, 2 failed, 0 skipped")
        errors = {
            case.get("classname"): case.find("error")
            for path in self.dirs["xml"].glob("TEST-*.xml")
            for case in ET.parse(path).getroot().iter("testcase")
        }
        self.assertEqual(errors["test_raises_at_import.ImportFailure"].get("type"), "RuntimeError")
        self.assertEqual(errors["test_exits_3_at_import.ImportFailure"].get("type"), "SystemExit")
        self.assert_nothing_left()


class TestRunScope(unittest.TestCase):
    """In-process: what run_scope() does to the signal handlers of the program calling it."""

    def setUp(self) -> None:
        self.saved = {signum: signal.getsignal(signum) for signum in lifecycle.STOP_SIGNALS}
        self.addCleanup(lambda: [signal.signal(s, h) for s, h in self.saved.items()])

    def test_sigterm_and_sighup_interrupt_like_ctrl_c_and_exit_codes(self) -> None:
        for signum, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)):
            with self.subTest(signal=signum.name):
                with self.assertRaises(KeyboardInterrupt) as caught, lifecycle.run_scope():
                    os.kill(os.getpid(), signum)
                    time.sleep(5)  # the handler runs at the next bytecode; never reached
                self.assertEqual(lifecycle.signal_of(caught.exception), signum)
                self.assertEqual(lifecycle.exit_code(signum), code)

    def test_previous_handlers_are_restored_and_a_custom_ctrl_c_handler_kept(self) -> None:
        seen: List[int] = []
        signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
        signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
        custom = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        with lifecycle.run_scope():
            self.assertIsNot(signal.getsignal(signal.SIGTERM), custom[signal.SIGTERM])
            self.assertIs(signal.getsignal(signal.SIGINT), custom[signal.SIGINT])
            os.kill(os.getpid(), signal.SIGINT)  # the program's own handler still gets it
            time.sleep(0.01)
        self.assertIs(signal.getsignal(signal.SIGTERM), custom[signal.SIGTERM])
        self.assertIs(signal.getsignal(signal.SIGINT), custom[signal.SIGINT])
        self.assertIs(signal.getsignal(signal.SIGHUP), signal.SIG_IGN)
        self.assertEqual(seen, [signal.SIGINT])

    def test_signal_inside_deferred_block_is_raised_when_it_ends(self) -> None:
        steps: List[str] = []
        with self.assertRaises(KeyboardInterrupt), lifecycle.run_scope():
            with lifecycle.deferred_signals():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.01)
                steps.append("block finished")
            steps.append("after the block")  # not reached: raised when the block ended
        self.assertEqual(steps, ["block finished"])

    def test_a_second_stop_signal_does_not_cut_the_cleanup(self) -> None:
        steps: List[str] = []
        with self.assertRaises(KeyboardInterrupt), lifecycle.run_scope():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            finally:
                os.kill(os.getpid(), signal.SIGHUP)
                time.sleep(0.01)
                steps.append("cleanup finished")
        self.assertEqual(steps, ["cleanup finished"])


if __name__ == "__main__":
    unittest.main()
