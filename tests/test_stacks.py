"""harness.outcome.stacks: one stack format for every rank, faulthandler's noise filtered.

Dumps and tracebacks are written by hand in the formats faulthandler and Python use, so the
parsing and filtering are checked without crashing a process (tests/test_multiprocess.py
does that).
"""

from __future__ import annotations

import os
import unittest

import harness
from harness.outcome import stacks
from harness.outcome.stacks import Frame

HARNESS = os.path.dirname(os.path.abspath(harness.__file__))
USER = "/home/me/test_user.py"
THREADING = os.path.abspath(__import__("threading").__file__)
MP = os.path.join(os.path.dirname(THREADING), "multiprocessing", "process.py")

CRASH_DUMP = f"""\
Fatal Python error: Aborted

Thread 0x00007f4b39d296c0 (most recent call first):
  File "/usr/lib/python3.11/selectors.py", line 415 in select
  File "{HARNESS}/process/rank.py", line 277 in _clean_up_when_orphaned
  File "{THREADING}", line 1002 in _bootstrap

Current thread 0x00007f4b5dbd4b80 (most recent call first):
  File "{USER}", line 39 in test_crash
  File "{HARNESS}/single_process/testcase.py", line 249 in join_or_run
  File "{MP}", line 108 in run
  File "<string>", line 1 in <module>

Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)
"""


class Format(unittest.TestCase):
    def test_the_single_process_machinery_is_hidden_and_the_kit_is_not(self) -> None:
        for name in ("testcase.py", "comparison.py", "subtests.py", "parametrize.py"):
            path = os.path.join(HARNESS, "single_process", name)
            self.assertTrue(os.path.exists(path), path)
            self.assertTrue(stacks.is_hidden(path), path)
        self.assertFalse(stacks.is_hidden(os.path.join(HARNESS, "kit", "fsdp.py")))

    def test_crash_dump_becomes_the_crashing_threads_stack_most_recent_last(self) -> None:
        stack = stacks.from_faulthandler(CRASH_DUMP, crashed=True)
        self.assertEqual(stack, f'  File "{USER}", line 39, in test_crash')

    def test_hang_dump_keeps_the_main_thread(self) -> None:
        dump = CRASH_DUMP.replace("Current thread", "Thread")  # a dump on request
        self.assertEqual(stacks.from_faulthandler(dump), f'  File "{USER}", line 39, in test_crash')

    def test_fatal_error_is_taken_out_of_the_output(self) -> None:
        output = "hello\n" + CRASH_DUMP
        rest, dump = stacks.split_fatal_error(output)
        self.assertEqual(rest, "hello\n")
        self.assertEqual(dump, CRASH_DUMP)
        self.assertEqual(stacks.split_fatal_error("plain\n"), ("plain\n", ""))

    def test_a_process_rank_starts_at_multiprocessings_bootstrap(self) -> None:
        """A rank forked from a forkserver forked from pytest (an xdist worker) carries their
        frames below its own start: none of them is shown."""
        frames = [
            Frame("/venv/execnet/gateway_base.py", 1806, "serve"),
            Frame("/venv/xdist/remote.py", 427, "<module>"),
            Frame(MP, 314, "_bootstrap"), Frame(MP, 108, "run"), Frame(USER, 20, "test_x"),
        ]
        self.assertEqual(stacks.visible(frames), [Frame(USER, 20, "test_x")])

    def test_harness_frames_are_hidden_unless_nothing_else_is_left(self) -> None:
        frames = [
            Frame("<string>", 1, "<module>"), Frame(MP, 108, "run"),
            Frame(f"{HARNESS}/single_process/testcase.py", 249, "join_or_run"),
            Frame(USER, 20, "test_x"),
            Frame(f"{HARNESS}/single_process/testcase.py", 304, "assertEqual"),
            Frame(f"{HARNESS}/kit/models.py", 10, "forward"),  # the kit is the user's library
        ]
        self.assertEqual(stacks.visible(frames), [frames[3], frames[5]])
        internal = [Frame(f"{HARNESS}/outcome/merge.py", 1, "decide")]
        self.assertEqual(stacks.visible(internal), internal)

    def test_traceback_text_is_cleaned(self) -> None:
        text = (
            "Traceback (most recent call last):\n"
            f'  File "{HARNESS}/single_process/testcase.py", line 249, in join_or_run\n'
            "    return join()\n"
            f'  File "{USER}", line 20, in test_x\n'
            "    self.assertEqual(a, b)\n"
            "    ^^^^^^^^^^^^^^^^^^^^^^\n"
            "AssertionError: 9.0 != 99.0\n"
            "with a second line"
        )
        cleaned = stacks.clean_traceback(text)
        self.assertNotIn("join_or_run", cleaned)
        self.assertIn(f'  File "{USER}", line 20, in test_x\n    self.assertEqual(a, b)', cleaned)

    def test_format_frames_adds_source_lines(self) -> None:
        here = os.path.abspath(__file__)
        text = stacks.format_frames([Frame(here, 1, "<module>")])
        self.assertEqual(
            text, f'  File "{here}", line 1, in <module>\n'
            '    """harness.outcome.stacks: one stack format for every rank, faulthandler\'s noise '
            'filtered.'
        )


if __name__ == "__main__":
    unittest.main()
