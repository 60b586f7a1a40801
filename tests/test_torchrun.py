"""run_all.py launched by torchrun: each process is a rank, tests run in-process, rank 0 reports.

Multi-rank tests run through TorchrunLauncher: the ranks exchange their records and reach one
verdict. Covers: a default group created and destroyed per test (repeated init on torchrun's
store), grid points across ranks, a skip on one rank, a failure on one rank failing the test
with that rank's traceback, a rank that does not report in time stopping the run, a world size
other than the launched one skipping, JUnit XML from rank 0, a launcher without torchrun's
agent store (opted in with HARNESS_LAUNCHED=1), stray launch variables that are not a launch
(against upstream's harness), and real suite tests
(`torchrun --standalone --nproc-per-node 2 run_all.py -k ...`).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, List, Tuple
from unittest import mock

import pytest
import torch.distributed as dist

from harness import MultiProcessTestCase, settings
from harness.process import torchrun as torchrun_launcher
from tests.fixtures import REPO, child_env, upstream_diff

RANKS = "tests.fixtures.torchrun_ranks"
TORCHRUN = shutil.which("torchrun")


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def torchrun(*args: str) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc-per-node 2 run_all.py ARGS` (as `python -m` for a
    torchrun that is not on PATH)."""
    launcher: List[str] = (
        [TORCHRUN] if TORCHRUN else [sys.executable, "-m", "torch.distributed.run"]
    )
    with tempfile.TemporaryDirectory() as tmp:  # torchrun's agent leaves its log folder there
        return subprocess.run(
            [*launcher, "--standalone", "--nproc-per-node", "2", "run_all.py", *args],
            cwd=REPO, env=child_env({"TMPDIR": tmp}), capture_output=True, text=True,
            timeout=600,
        )


@pytest.mark.slow
class TestTorchrunRun(unittest.TestCase):
    """One torchrun run of the fixture's passing, failing and skipping classes (one run, as
    each costs three interpreters importing torch); each test reads its part."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory()
        cls.proc = torchrun(
            RANKS, "-k", "TestRanks", "-k", "TestContinuousRanks", "-k", "TestRankFailure",
            "-k", "TestWorldSize", "--save-xml", cls.tmp.name,
        )

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    def cases(self, cls: str) -> Dict[str, ET.Element]:
        report = Path(self.tmp.name, f"TEST-{RANKS}.{cls}.xml")
        return {case.get("name"): case for case in ET.parse(report).getroot().iter("testcase")}

    def test_every_test_passes_with_a_fresh_group_each(self) -> None:
        # 3 tests all-reduce in their own default group; the 4th skips on the last rank only;
        # the 2 tests of the shared-process class each get a class group of their own.
        self.assertEqual(last_line(self.proc.stdout), "5 passed, 2 failed, 2 skipped",
                         self.proc.stdout + self.proc.stderr)
        for cls in ("TestRanks", "TestContinuousRanks"):
            for name, case in self.cases(cls).items():
                with self.subTest(test=f"{cls}.{name}"):
                    outcome = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
                    expected = ["skipped"] if name == "test_skips_on_last_rank" else []
                    self.assertEqual(outcome, expected)

    def test_rank_0_alone_reports(self) -> None:
        self.assertEqual(self.proc.stdout.count("5 passed, 2 failed, 2 skipped"), 1)
        row = next(line for line in self.proc.stdout.splitlines() if line.startswith(RANKS))
        self.assertEqual(row.split()[1:5], ["5", "2", "2", "6"])  # 6 grid points

    def test_junit_xml_written_once(self) -> None:
        self.assertEqual(
            list(self.cases("TestRanks")),
            ["test_all_reduce", "test_all_reduce_again", "test_grid", "test_skips_on_last_rank"],
        )

    def test_failure_on_one_rank_fails_the_test(self) -> None:
        self.assertEqual(self.proc.returncode, 1)
        report = self.proc.stdout
        self.assertIn(f"FAIL: {RANKS}.TestRankFailure.test_fails_on_rank_1", report)
        self.assertIn("rank 1 raised:", report)
        self.assertNotIn("rank 0 raised", report)
        self.assertIn("rank 1 disagrees on purpose", report)
        self.assertIn("grid point (point=2) failed", report)
        self.assertIn("rank 1 failed this grid point", report)
        self.assertNotIn("(point=1)", report)

    def test_a_world_size_other_than_the_launched_one_skips(self) -> None:
        skipped = self.cases("TestWorldSize")["test_needs_three_ranks"].find("skipped")
        self.assertEqual(skipped.get("message"),
                         "needs world size 3, torchrun launched 2 processes")


@pytest.mark.slow
class TestTorchrunFailures(unittest.TestCase):
    def test_failfast_stops_every_rank_at_the_same_test(self) -> None:
        proc = torchrun(RANKS, "-k", "TestRankFailure", "-x")
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertEqual(last_line(proc.stdout), "0 passed, 1 failed, 0 skipped")
        self.assertNotIn("out of step", proc.stdout)  # rank 1 stopped too, and said it is done

    @pytest.mark.timeout(180)  # a limit of its own: a harness that never times out fails here
    def test_a_rank_that_does_not_finish_stops_the_run(self) -> None:
        proc = torchrun(RANKS, "-k", "TestRankLags")
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("timed out after 3 s with rank 1 still running", proc.stdout)
        self.assertIn("--- stack of rank 1 ---", proc.stdout)  # posted by rank 1 itself
        self.assertIn("in test_lags_on_rank_1\n    time.sleep(60)", proc.stdout)
        self.assertIn("run stopped: rank(s) 1 did not finish within 3s", proc.stdout)
        self.assertEqual(last_line(proc.stdout), "0 passed, 1 failed, 0 skipped")

    def test_a_rank_that_failed_stops_the_others_after_the_grace(self) -> None:
        # Rank 1 would sleep 60 s (timeout 30 s): the fail-fast policy stops it once rank 0 failed.
        proc = torchrun(RANKS, "-k", "TestRankFailFast")
        self.assertEqual(last_line(proc.stdout), "0 passed, 1 failed, 0 skipped",
                         proc.stdout + proc.stderr)
        self.assertIn("ValueError: rank 0 gives up early", proc.stdout)
        self.assertIn("rank 1 was still running and was stopped", proc.stdout)
        self.assertIn("in test_fails_on_rank_0\n    time.sleep(60)", proc.stdout)
        self.assertNotIn("timed out", proc.stdout)
        self.assertNotIn("out of step", proc.stdout)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
class TestOtherLaunchers(unittest.TestCase):
    def test_without_torchruns_agent_store_rank_0_hosts_it(self) -> None:
        port = str(free_port())
        procs = [
            subprocess.Popen(
                [sys.executable, "run_all.py", RANKS, "-k", "TestRanks"],
                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=child_env({"RANK": str(rank), "WORLD_SIZE": "2", "HARNESS_LAUNCHED": "1",
                               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}),
            )
            for rank in (0, 1)
        ]
        outputs = [proc.communicate(timeout=300) for proc in procs]
        self.assertEqual([proc.returncode for proc in procs], [0, 0], outputs)
        self.assertEqual(last_line(outputs[0][0]), "3 passed, 0 failed, 1 skipped")
        self.assertEqual(outputs[1][0], "")


class TestTorchrunHere(unittest.TestCase):
    """The launcher's functions in this process, with a launch environment of one rank."""

    def env(self, rank: str = "0", world_size: str = "1") -> Dict[str, str]:
        """What torchrun's agent sets for a worker (its own variables included)."""
        return {"RANK": rank, "WORLD_SIZE": world_size, "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()), "TORCHELASTIC_RUN_ID": "test",
                "GROUP_RANK": "0", "LOCAL_WORLD_SIZE": world_size}

    def test_stray_launch_variables_are_not_a_launch(self) -> None:
        """RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT left in the environment (a pod, an env://
        test) change nothing; HARNESS_LAUNCHED=1 opts in for launchers that set only those."""
        stray = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29500"}
        with mock.patch.dict(os.environ, child_env(stray), clear=True):
            self.assertIsNone(torchrun_launcher.this_run())
            self.assertEqual(4, MultiProcessTestCase.world_size)
            os.environ["HARNESS_LAUNCHED"] = "1"
            self.assertEqual((0, 1), settings.torchrun_env())
            self.assertEqual(1, MultiProcessTestCase.world_size)  # the launched processes

    def test_who_reports(self) -> None:
        with mock.patch.dict(os.environ, child_env(), clear=True):
            self.assertIsNone(torchrun_launcher.this_run())  # not launched: this process reports
        with mock.patch.dict(os.environ, self.env(rank="1", world_size="2")):
            run = torchrun_launcher.this_run()
            self.assertEqual((run.rank, run.world_size), (1, 2))
            self.assertFalse(run.reports_here)
        with mock.patch.dict(os.environ, self.env(rank="0", world_size="2")):
            self.assertTrue(torchrun_launcher.this_run().reports_here)

    def test_malformed_launch_env_names_it(self) -> None:
        with mock.patch.dict(os.environ, self.env(rank="zero")):
            with self.assertRaisesRegex(settings.HarnessConfigError, "RANK='zero'"):
                torchrun_launcher.this_run()

    def test_a_single_rank_runs_here_and_leaves_no_group(self) -> None:
        with mock.patch.dict(os.environ, self.env()):
            launcher = torchrun_launcher.TorchrunLauncher(torchrun_launcher.this_run())
            job = _rank_cases()[0]("test_group").job()
            launcher.start(job)
            records, timed_out = launcher.join(job)
            launcher.close()
        self.assertIsNone(timed_out)
        self.assertEqual([(r.rank, r.pid) for r in records], [(0, os.getpid())])
        self.assertEqual([e.kind for e in records[0].events], ["success", "done"])
        self.assertFalse(dist.is_initialized())  # the test left its group: the launcher took it

    def test_a_world_size_other_than_the_launched_one_is_a_skip(self) -> None:
        with mock.patch.dict(os.environ, self.env(world_size="1")):
            with self.assertRaisesRegex(unittest.SkipTest, "needs world size 2, torchrun "
                                                           "launched 1 processes"):
                run = torchrun_launcher.this_run()
                torchrun_launcher.TorchrunLauncher(run).start(_rank_cases()[1]("test_nothing"))


def _rank_cases() -> Tuple[type, type]:
    """Cases that TestTorchrunHere runs as ranks (made here so that no runner collects them)."""

    class OneRank(MultiProcessTestCase):
        """Leaves its group initialised on purpose."""

        @property
        def world_size(self) -> int:
            return 1

        @property
        def destroy_pg_upon_exit(self) -> bool:
            return False

        def test_group(self) -> None:
            dist.init_process_group("gloo", init_method=self.init_method, rank=0, world_size=1)

    class TwoRanks(MultiProcessTestCase):
        @property
        def world_size(self) -> int:
            return 2

        def test_nothing(self) -> None:
            """Never run: the launcher skips it first."""

    return OneRank, TwoRanks


STRAY_PROBE = textwrap.dedent('''
    import torch
    import torch.distributed as dist


    class TwoRanks(MultiProcessTestCase):
        world_size = 2

        def setUp(self):
            super().setUp()
            self._spawn_processes()

        def test_all_reduce(self):
            dist.init_process_group("gloo", init_method=f"file://{self.file_name}",
                                    rank=self.rank, world_size=self.world_size)
            value = torch.ones(1)
            dist.all_reduce(value)
            assert value.item() == 2.0, value


    if __name__ == "__main__":
        run_tests()
''')


@pytest.mark.slow
class TestStrayLaunchVariables(unittest.TestCase):
    def test_stray_variables_change_nothing_as_upstream(self) -> None:
        """A multi-rank test with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT in the environment
        (WORLD_SIZE=1: the old detection skipped it) runs as under upstream's harness."""
        stray = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(free_port())}
        names = {"common_distributed": ["MultiProcessTestCase"], "common_utils": ["run_tests"]}
        theirs = upstream_diff.outcomes(STRAY_PROBE, names, upstream=True, env=stray)
        ours = upstream_diff.outcomes(STRAY_PROBE, names, upstream=False, env=stray)
        self.assertEqual(theirs, {"TwoRanks.test_all_reduce": "passed"})
        self.assertEqual(ours, theirs)


@pytest.mark.slow
class TestRealSuite(unittest.TestCase):
    def test_suite_tests_under_torchrun(self) -> None:
        """Two FSDPTest tests: each initialises and destroys the default group in-process."""
        proc = torchrun(  # the suite's two quickest tests with grid points
            "test_fully_shard_frozen", "-k", "test_train_mixed_requires_grad_across_groups",
            "-k", "test_multi_forward_mixed_requires_grad",
        )
        self.assertEqual(proc.returncode, 0, proc.stdout[-3000:] + proc.stderr[-3000:])
        self.assertEqual(last_line(proc.stdout), "2 passed, 0 failed, 0 skipped")
        row = next(line for line in proc.stdout.splitlines() if line.startswith("test_cases."))
        self.assertGreater(int(row.split()[4]), 0)  # grid points ran in the ranks


if __name__ == "__main__":
    unittest.main()


@pytest.mark.slow
@pytest.mark.timeout(300)  # a limit of its own: agents that never meet fail here
def test_two_agents_on_loopback_with_a_c10d_rendezvous() -> None:
    """What the README promises across machines, on one: two torchrun agents (`--nnodes 2
    --nproc-per-node 1`) meet through a c10d rendezvous and run a suite test as its two ranks;
    rank 0 alone prints the report and writes the XML."""
    launcher: List[str] = (
        [TORCHRUN] if TORCHRUN else [sys.executable, "-m", "torch.distributed.run"]
    )
    test = "test_parity_with_non_frozen_fsdp"
    with tempfile.TemporaryDirectory() as tmp:
        xml_dir = os.path.join(tmp, "xml")
        command = [
            *launcher, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "harness-two-agents",
            "run_all.py", "test_fine_tune", "-k", test, "--save-xml", xml_dir,
        ]
        agents = [
            subprocess.Popen(command, cwd=REPO, env=child_env({"TMPDIR": tmp}),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        try:
            outputs = [agent.communicate(timeout=280) for agent in agents]
        finally:
            for agent in agents:
                agent.kill()
        codes = [agent.returncode for agent in agents]
        stdout = "".join(out for out, _ in outputs)
        assert codes == [0, 0], stdout + "".join(err for _, err in outputs)[-4000:]
        assert stdout.count("1 passed, 0 failed, 0 skipped") == 1, stdout  # one report
        reports = list(Path(xml_dir).glob("*.xml"))
        assert len(reports) == 1, reports
        cases = list(ET.parse(reports[0]).getroot().iter("testcase"))
        assert [case.get("name") for case in cases] == [test]
        assert [child.tag for child in cases[0]] in ([], ["system-out"], ["system-err"],
                                                     ["system-out", "system-err"])
