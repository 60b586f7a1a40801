"""harness.threads.warning_filters: each rank thread captures and filters its own warnings; a
warning a rank thread shows goes into that rank's output (shown with a failure), not onto the
runner's stderr, as a process rank's."""

import os
import threading
import unittest
import warnings
from unittest import mock

from harness import MultiThreadedTestCase
from harness.threads.warning_filters import per_thread_warnings


class PerThreadWarningsTest(unittest.TestCase):
    def test_interleaved_blocks_each_capture_their_own_thread(self):
        """Thread A leaves its block while B is still inside: B must still capture."""
        a_entered, b_entered, a_left = threading.Event(), threading.Event(), threading.Event()
        captured = {}

        def thread_a():
            with warnings.catch_warnings(record=True) as log:
                a_entered.set()
                b_entered.wait(10)
                warnings.warn("from a", UserWarning, stacklevel=2)
            captured["a"] = [str(w.message) for w in log]
            a_left.set()

        def thread_b():
            a_entered.wait(10)
            case = unittest.TestCase()
            with case.assertWarnsRegex(UserWarning, "from b"):
                b_entered.set()
                a_left.wait(10)
                warnings.warn("from b", UserWarning, stacklevel=2)
            captured["b"] = "ok"

        with per_thread_warnings():
            threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
        self.assertEqual(captured, {"a": ["from a"], "b": "ok"})

    def test_the_same_warning_is_captured_every_time(self):
        with per_thread_warnings():
            for _ in range(3):
                with warnings.catch_warnings(record=True) as log:
                    warnings.warn("repeated", UserWarning, stacklevel=2)
                self.assertEqual(len(log), 1)

    def test_filters_set_in_a_block_stay_in_its_thread(self):
        other_log = []
        ignoring, other_done = threading.Event(), threading.Event()

        def ignorer():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ignoring.set()
                other_done.wait(10)
                with warnings.catch_warnings(record=True) as log:
                    warnings.warn("ignored", UserWarning, stacklevel=2)
                other_log.append(("ignorer", len(log)))

        def other():
            ignoring.wait(10)
            with warnings.catch_warnings(record=True) as log:
                warnings.warn("seen", UserWarning, stacklevel=2)
            other_log.append(("other", len(log)))
            other_done.set()

        with per_thread_warnings():
            threads = [threading.Thread(target=ignorer), threading.Thread(target=other)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
        self.assertEqual(sorted(other_log), [("ignorer", 0), ("other", 1)])

    def test_error_filter_raises_in_that_thread(self):
        with per_thread_warnings():
            with warnings.catch_warnings():
                warnings.filterwarnings("error", message="bad", category=UserWarning)
                with self.assertRaises(UserWarning):
                    warnings.warn("bad thing", UserWarning, stacklevel=2)
                warnings.warn("fine thing", UserWarning, stacklevel=2)

    def test_process_state_is_restored(self):
        before = (warnings.filters[:], warnings.showwarning, warnings.catch_warnings,
                  warnings.simplefilter, warnings.filterwarnings)
        with per_thread_warnings():
            self.assertIsNot(warnings.catch_warnings, before[2])
        after = (warnings.filters[:], warnings.showwarning, warnings.catch_warnings,
                 warnings.simplefilter, warnings.filterwarnings)
        self.assertEqual(after, before)


def _warning_ranks() -> type:
    """Thread-rank tests that warn as torch does (made here so that no loader collects them)."""

    class Warns(MultiThreadedTestCase):
        @property
        def world_size(self) -> int:
            return 2

        def setUp(self) -> None:
            super().setUp()
            self._spawn_threads()

        def test_passes(self) -> None:
            warnings.warn("FSDP is switching to use NO_SHARD", UserWarning, stacklevel=1)

        def test_fails_on_rank_1(self) -> None:
            warnings.warn("FSDP is switching to use NO_SHARD", UserWarning, stacklevel=1)
            self.assertNotEqual(self.rank, 1, "planned")

    return Warns


class RankThreadWarningsTest(unittest.TestCase):
    def run_case(self, name: str, show_output: str = "") -> "tuple[unittest.TestResult, list]":
        """Run the test; also what reached warnings.showwarning (the runner's stderr)."""
        result, shown = unittest.TestResult(), []

        def showwarning(message, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
            shown.append(str(message))

        with mock.patch.dict(os.environ, {"HARNESS_SHOW_OUTPUT": show_output}), \
                mock.patch.object(warnings, "showwarning", showwarning):
            _warning_ranks()(name).run(result)
        return result, shown

    def test_a_passing_tests_warnings_are_not_shown(self) -> None:
        result, shown = self.run_case("test_passes")
        self.assertTrue(result.wasSuccessful())
        self.assertEqual(shown, [])

    def test_a_failures_report_has_each_ranks_warning(self) -> None:
        result, shown = self.run_case("test_fails_on_rank_1")
        self.assertEqual(shown, [])
        [(_, report)] = result.failures
        for rank in (0, 1):
            self.assertIn(f"[rank {rank}] ", report)
        self.assertIn("UserWarning: FSDP is switching to use NO_SHARD", report)

    def test_shown_live_with_show_output(self) -> None:
        result, shown = self.run_case("test_passes", show_output="1")
        self.assertTrue(result.wasSuccessful())
        self.assertEqual(shown, ["FSDP is switching to use NO_SHARD"] * 2)

if __name__ == "__main__":
    unittest.main()
