"""harness.threads.spawn: upstream's spawn_threads_and_init_comms, on the harness's threads."""

from __future__ import annotations

import threading
import time
import unittest
from typing import List

import pytest
import torch
import torch.distributed as dist

from harness import TestCase, spawn_threads_and_init_comms
from harness.threads import backend as threaded_pg
from tests.upstream_probe import compare

SEEN: List[int] = []
SEEN_LOCK = threading.Lock()


def _spawned() -> type:
    """The decorated tests (made here, so that test collectors do not run them on their own)."""

    class Spawned(TestCase):
        @spawn_threads_and_init_comms(world_size=3)
        def test_sum(self) -> None:
            value = torch.full((2,), float(dist.get_rank()))
            dist.all_reduce(value)
            self.assertEqual(value, torch.full((2,), 3.0))
            self.assertEqual(dist.get_world_size(), 3)
            self.assertEqual(dist.get_backend(), threaded_pg.BACKEND_NAME)
            with SEEN_LOCK:
                SEEN.append(dist.get_rank())

        @spawn_threads_and_init_comms
        def test_bare_decorator_has_upstreams_default_world_size(self) -> None:
            self.assertEqual(dist.get_world_size(), 4)

        @spawn_threads_and_init_comms(world_size=2)
        def test_assertion_on_one_rank(self) -> None:
            value = torch.ones(1)
            dist.all_reduce(value)
            if dist.get_rank() == 1:
                self.assertEqual(value.item(), 3.0, "wrong sum")

        @spawn_threads_and_init_comms(world_size=2)
        def test_error_while_the_other_waits(self) -> None:
            if dist.get_rank() == 0:
                raise ValueError("broken rank")
            dist.barrier()  # released when rank 0 fails, instead of hanging

        @spawn_threads_and_init_comms(world_size=2)
        def test_skip(self) -> None:
            self.skipTest("not here")

        @spawn_threads_and_init_comms(world_size=2, timeout=0.5)
        def test_hang(self) -> None:
            if dist.get_rank() == 1:
                time.sleep(1.0)

    return Spawned


def _run(name: str) -> unittest.TestResult:
    result = unittest.TestResult()
    _spawned()(name).run(result)
    return result


class SpawnThreadsTest(unittest.TestCase):
    def test_every_rank_runs_the_body_in_its_own_group(self) -> None:
        SEEN.clear()
        result = _run("test_sum")
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertEqual(sorted(SEEN), [0, 1, 2])
        self.assertFalse(dist.is_initialized())  # the caller's world is back
        self.assertTrue(_run("test_bare_decorator_has_upstreams_default_world_size")
                        .wasSuccessful())

    def test_a_failing_rank_fails_the_test_with_its_traceback(self) -> None:
        result = _run("test_assertion_on_one_rank")
        self.assertEqual(len(result.failures), 1)
        text = result.failures[0][1]
        self.assertIn("Thread 1 exited with exception:", text)
        self.assertIn("wrong sum", text)

    def test_an_exception_is_an_error_and_releases_the_others(self) -> None:
        started = time.monotonic()
        result = _run("test_error_while_the_other_waits")
        self.assertLess(time.monotonic() - started, 30)
        self.assertEqual(len(result.errors), 1)
        self.assertIn("Thread 0 exited with exception:", result.errors[0][1])
        self.assertIn("ValueError: broken rank", result.errors[0][1])

    def test_a_skip_skips(self) -> None:
        result = _run("test_skip")
        self.assertEqual([reason for _, reason in result.skipped], ["not here"])

    def test_a_hang_times_out_naming_the_thread(self) -> None:
        result = _run("test_hang")
        self.assertEqual(len(result.errors), 1)
        self.assertIn("Thread 1 terminated or timed out after 0.5 seconds", result.errors[0][1])

    def test_bad_world_size_is_one_line(self) -> None:
        class Bad(TestCase):
            @spawn_threads_and_init_comms(world_size=0)
            def test_x(self) -> None:
                pass

        result = unittest.TestResult()
        Bad("test_x").run(result)
        self.assertIn("world_size must be >= 1, got 0", result.errors[0][1])


SPAWN_PROBE = """
import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import spawn_threads_and_init_comms
from torch.testing._internal.common_utils import TestCase, run_tests


class TestSpawn(TestCase):
    @spawn_threads_and_init_comms(world_size=2)
    def test_sum(self):
        value = torch.ones(1)
        dist.all_reduce(value)
        self.assertEqual(value.item(), 2.0)

    @spawn_threads_and_init_comms
    def test_default_world_size(self):
        self.assertEqual(dist.get_world_size(), 4)

    @spawn_threads_and_init_comms(world_size=2)
    def test_wrong_sum(self):
        value = torch.ones(1)
        dist.all_reduce(value)
        self.assertEqual(value.item(), 3.0)

    @spawn_threads_and_init_comms(world_size=2)
    def test_raises(self):
        raise ValueError("broken")

    @spawn_threads_and_init_comms(world_size=2)
    def test_skips(self):
        self.skipTest("not here")


if __name__ == "__main__":
    run_tests()
"""


@pytest.mark.slow
class SpawnMatchesUpstreamTest(unittest.TestCase):
    """Differential: the same file with upstream's decorator under both harnesses."""

    def test_same_outcome_per_test_id(self) -> None:
        theirs, ours, shown = compare(SPAWN_PROBE)
        self.assertEqual(len(theirs), 5, shown)
        # Deliberate: a thread's AssertionError is a failure here, an error upstream (which
        # turns every thread's exception into a RuntimeError).
        self.assertEqual(theirs.pop("TestSpawn.test_wrong_sum"), "error")
        self.assertEqual(ours.pop("TestSpawn.test_wrong_sum"), "failure")
        self.assertEqual(ours, theirs, shown)


if __name__ == "__main__":
    unittest.main()
