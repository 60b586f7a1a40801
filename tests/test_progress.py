"""harness.runner.progress: the progress line, and the thread that prints it."""

from __future__ import annotations

import io
import signal
import threading
import time
import unittest

from harness.outcome.report import TestReport
from harness.runner.lifecycle import STOP_SIGNALS
from harness.runner.progress import Progress


def blocked_signals(thread: threading.Thread) -> set:
    """The signals `thread` blocks, read from /proc (Linux)."""
    with open(f"/proc/self/task/{thread.native_id}/status") as f:
        mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigBlk:"))
    return {signal.Signals(n) for n in range(1, 65) if mask & (1 << (n - 1)) and n < 32}


class ProgressTest(unittest.TestCase):
    def test_periodic_lines_name_the_running_test(self) -> None:
        out = io.StringIO()
        progress = Progress(2, out, verbosity=1, interval=0.05)
        progress.begin(1)
        self.addCleanup(progress.close)
        progress.start("mod.Class.test_slow")
        deadline = time.monotonic() + 10
        while "running mod.Class.test_slow" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)
        self.assertIn("[0/2]", out.getvalue())
        self.assertIn("running mod.Class.test_slow", out.getvalue())
        progress.finish(TestReport("mod.Class.test_slow", "mod", "failed", "boom"))
        self.assertIn("FAIL  mod.Class.test_slow", out.getvalue())

    def test_verbose_lines_give_a_skips_reason(self) -> None:
        out = io.StringIO()
        progress = Progress(2, out, verbosity=2, interval=30.0)
        progress.finish(TestReport("mod.C.test_a", "mod", "skipped", "needs 2 GPUs", duration=0.5))
        progress.finish(TestReport("mod.C.test_b", "mod", "passed"))
        self.assertEqual(out.getvalue().splitlines(), [
            "[1/2] skip  mod.C.test_a (0.50s): needs 2 GPUs",
            "[2/2] ok    mod.C.test_b (0.00s)",
        ])

    def test_its_thread_leaves_stop_signals_to_the_main_thread(self) -> None:
        """A Ctrl-C the kernel handed to the progress thread went unnoticed while the main
        thread slept in a test (seen once in CI as a run that ignored SIGINT)."""
        progress = Progress(1, io.StringIO(), verbosity=1, interval=30.0)
        progress.begin(1)
        self.addCleanup(progress.close)
        thread = next(t for t in threading.enumerate() if t.name == "harness-progress")
        deadline = time.monotonic() + 10
        while not set(STOP_SIGNALS) <= blocked_signals(thread) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertLessEqual(set(STOP_SIGNALS), blocked_signals(thread))
        self.assertFalse(set(STOP_SIGNALS) & blocked_signals(threading.main_thread()))


if __name__ == "__main__":
    unittest.main()
