"""Hang reports name the collective each rank is in: the record, its wording, both modes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

import pytest

from harness.outcome import collective_trace
from harness.outcome.collective_trace import CollectiveCall

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def entry(name, seq, sizes, dtypes, retired, pg=("0", "default_pg"), p2p=False):
    return {
        "profiling_name": name, "collective_seq_id": seq, "input_sizes": sizes,
        "input_dtypes": dtypes, "retired": retired, "state": "scheduled",
        "process_group": list(pg), "is_p2p": p2p,
    }


def call(op, seq, completed, group=collective_trace.DEFAULT_GROUP, inputs=("float32[4]",)):
    return CollectiveCall(op, group, seq, inputs, completed)


class FromFlightRecorderTest(unittest.TestCase):
    def test_entries_become_calls(self):
        dump = json.dumps({"entries": [
            entry("gloo:all_reduce", 1, [[4]], ["Float"], True),
            entry(
                "gloo:broadcast", 2, [[2, 3], [5]], ["Double", "Byte"], False,
                pg=("1", "undefined"),
            ),
            entry("gloo:send", 0, [[4]], ["Float"], False, p2p=True),
            entry("nccl:all_gather", 3, [[8]], ["BFloat16"], False, pg=("2", "tp")),
        ]})
        self.assertEqual(collective_trace.from_flight_recorder(dump), [
            CollectiveCall("all_reduce", "the default group", 1, ("float32[4]",), True),
            CollectiveCall("broadcast", "group 1", 2, ("float64[2, 3]", "uint8[5]"), False),
            CollectiveCall("all_gather", "group 2 (tp)", 3, ("bfloat16[8]",), False),
        ])

    def test_empty_dump(self):
        self.assertEqual(collective_trace.from_flight_recorder("{}"), [])


class WordingTest(unittest.TestCase):
    def test_waiting_in_is_the_oldest_unfinished_call(self):
        calls = [
            call("all_reduce", 1, True), call("broadcast", 2, False), call("barrier", 3, False)
        ]
        self.assertEqual(collective_trace.waiting_in(calls), calls[1])
        self.assertIsNone(collective_trace.waiting_in(calls[:1]))

    def test_rank_lines(self):
        self.assertEqual(
            collective_trace.rank_line(0, [call("all_reduce", 7, False)]),
            "rank 0: waits in all_reduce #7 of the default group (float32[4])",
        )
        self.assertEqual(
            collective_trace.rank_line(1, [call("all_reduce", 6, True)]),
            "rank 1: not in a collective; last completed all_reduce #6 of the default group "
            "(float32[4])",
        )
        self.assertEqual(collective_trace.rank_line(2, []), "rank 2: entered no collective")
        self.assertEqual(
            collective_trace.rank_line(3, None), "rank 3: its collectives could not be read"
        )

    def test_disagreement_names_each_ranks_collective(self):
        calls = {0: [call("all_reduce", 7, False)], 1: [call("broadcast", 7, False)]}
        self.assertEqual(
            collective_trace.disagreement(calls),
            "ranks disagree: rank 0 waits in all_reduce #7 of the default group (float32[4]), "
            "rank 1 in broadcast #7 (float32[4])",
        )

    def test_disagreement_on_sequence_number_and_absent_rank(self):
        calls = {0: [call("all_reduce", 7, False)], 1: [call("all_reduce", 6, False)]}
        self.assertIn("rank 1 in all_reduce #6", collective_trace.disagreement(calls))
        calls = {0: [call("all_reduce", 7, False)], 1: [call("all_reduce", 6, True)]}
        self.assertIn("rank 1 is in no collective", collective_trace.disagreement(calls))

    def test_no_disagreement_when_all_wait_in_the_same_call_or_none_waits(self):
        same = {0: [call("all_reduce", 7, False)], 1: [call("all_reduce", 7, False)]}
        self.assertIsNone(collective_trace.disagreement(same))
        done = {0: [call("all_reduce", 7, True)], 1: [call("all_reduce", 7, True)]}
        self.assertIsNone(collective_trace.disagreement(done))

    def test_section_is_empty_when_nothing_is_known(self):
        self.assertEqual(collective_trace.collectives_section({0: None, 1: None}), "")
        section = collective_trace.collectives_section({0: [call("all_reduce", 1, False)], 1: None})
        self.assertEqual(section.splitlines()[0], "Collectives of each rank:")
        self.assertIn("rank 1: its collectives could not be read", section)


HANG_SUITE = textwrap.dedent('''
    import time

    import torch
    import torch.distributed as dist

    from harness import FSDPTest, FSDPTestMultiThread, run_tests, skip_if_lt_x_gpu


    class Mismatch:
        timeout = 8

        @property
        def world_size(self):
            return 2

        def test_mismatch(self):
            dist.all_reduce(torch.ones(4))
            if self.rank == 0:
                dist.all_reduce(torch.ones(4))
            else:
                dist.broadcast(torch.ones(2, 3, dtype=torch.float64), 0)

        def test_one_rank_elsewhere(self):
            if self.rank == 0:
                dist.all_reduce(torch.ones(4))
            else:
                time.sleep(60)


    @skip_if_lt_x_gpu(2, allow_cpu=True)  # FSDPTest skips on CPU unless it is allowed
    class TestProcesses(Mismatch, FSDPTest):
        pass


    class TestThreads(Mismatch, FSDPTestMultiThread):
        pass


    if __name__ == "__main__":
        run_tests()
''')


@pytest.mark.slow
@pytest.mark.timeout(240)  # a limit of its own: a harness that never times out fails here
class HangReportTest(unittest.TestCase):
    """A deliberate mismatch (rank 0 all_reduce, rank 1 broadcast) in both modes."""

    @classmethod
    def setUpClass(cls):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "hang_suite.py")
            with open(path, "w") as f:
                f.write(HANG_SUITE)
            # FSDPTest skips on a machine without accelerators unless the CPU is allowed.
            env = dict(os.environ, PYTHONPATH=REPO, HARNESS_ALLOW_CPU="1")
            done = subprocess.run(
                [sys.executable, path, "-v"], capture_output=True, text=True, timeout=240,
                cwd=tmp, env=env,
            )
        cls.output = done.stdout + done.stderr
        cls.returncode = done.returncode

    def report_of(self, test: str, kind: str = "FAIL") -> str:
        head = f"{kind}: {test}"
        self.assertIn(head, self.output)
        return self.output.split(head, 1)[1].split("\n=====", 1)[0]

    def test_processes_mismatch_hangs_and_names_both_collectives(self):
        # FSDPTest's setUp barrier is #1 of the default group, the first all_reduce #2.
        report = self.report_of("test_mismatch (__main__.TestProcesses.test_mismatch)", "ERROR")
        self.assertIn("timed out after 8 s", report)
        self.assertIn(
            "ranks disagree: rank 0 waits in all_reduce #3 of the default group (float32[4]), "
            "rank 1 in broadcast #3 (float64[2, 3])", report,
        )
        self.assertIn("rank 0: waits in all_reduce #3 of the default group (float32[4])", report)
        self.assertIn("rank 1: waits in broadcast #3 of the default group (float64[2, 3])", report)
        self.assertIn("--- stack of rank 1 ---", report)

    def test_threads_mismatch_fails_at_once_and_names_both_collectives(self):
        # the backend raises a CollectiveError (no assertion): an error, as upstream's verdict
        report = self.report_of("test_mismatch (__main__.TestThreads.test_mismatch)", "ERROR")
        self.assertIn("collective mismatch", report)
        self.assertIn(
            "ranks disagree: rank 0 waits in all_reduce #3 of the default group (float32[4]), "
            "rank 1 in broadcast #3 (float64[2, 3])", report,
        )

    def test_a_rank_outside_any_collective_is_named(self):
        for test in ("TestProcesses", "TestThreads"):
            with self.subTest(test):
                report = self.report_of(  # a timeout is an error, as upstream's
                    f"test_one_rank_elsewhere (__main__.{test}.test_one_rank_elsewhere)", "ERROR"
                )
                self.assertIn("timed out after 8 s", report)
                self.assertIn(
                    "ranks disagree: rank 0 waits in all_reduce #2 of the default group "
                    "(float32[4]), rank 1 is in no collective", report,
                )
                self.assertIn("rank 1: not in a collective; last completed barrier #1", report)

    def test_the_run_failed(self):
        self.assertEqual(self.returncode, 1, self.output[-2000:])


if __name__ == "__main__":
    unittest.main()
