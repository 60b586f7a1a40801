"""harness/launch/job.py: what a launcher runs, as it crosses to a rank process."""

from __future__ import annotations

import pickle
import unittest

from harness.launch.job import Job, load_class


class Named(unittest.TestCase):
    def test_x(self) -> None:
        pass


def job_of(cls: type) -> Job:
    return Job(test_id="t", module=cls.__module__, qualname=cls.__qualname__, method="test_x",
               world_size=2, timeout=5.0, local_class=cls)


class JobTest(unittest.TestCase):
    def test_a_rank_process_gets_it_without_the_class_and_finds_the_class_by_name(self) -> None:
        sent = pickle.loads(pickle.dumps(job_of(Named).for_processes()))
        self.assertIsNone(sent.local_class)
        self.assertIs(sent.program(), Named)
        self.assertEqual(sent, job_of(Named))  # the class itself is not part of the job

    def test_a_class_local_to_a_function_runs_only_in_this_process(self) -> None:
        class Local(Named):
            pass

        job = job_of(Local)
        self.assertFalse(job.importable)
        self.assertIs(job.program(), Local)
        with self.assertRaisesRegex(LookupError, "must be defined at module level"):
            job.for_processes().program()

    def test_with_timeout_changes_only_the_timeout(self) -> None:
        job = job_of(Named)
        self.assertEqual(job.with_timeout(1.5), Job(**{**job.__dict__, "timeout": 1.5}))

    def test_load_class_follows_the_qualified_name(self) -> None:
        self.assertIs(load_class(__name__, "JobTest"), JobTest)
