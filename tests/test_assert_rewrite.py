"""harness/process/assert_rewrite.py: what a rank process needs to fail an `assert` as pytest
would in its own process (the end-to-end runs are tests/test_pytest_functions.py)."""

from __future__ import annotations

import sys
import unittest
from unittest import mock

from _pytest.assertion import util

from harness.process import assert_rewrite


class Explanation(unittest.TestCase):
    def setUp(self) -> None:
        saved = util._reprcompare
        self.addCleanup(setattr, util, "_reprcompare", saved)
        meta_path = list(sys.meta_path)
        self.addCleanup(setattr, sys, "meta_path", meta_path)
        # this very pytest run may have asked its ranks for rewriting: give its settings back
        names, explain = list(assert_rewrite._names), list(assert_rewrite._explain_settings)
        self.addCleanup(assert_rewrite._names.__setitem__, slice(None), names)
        self.addCleanup(assert_rewrite._explain_settings.__setitem__, slice(None), explain)
        # pytest explains more on a CI machine (CI or BUILD_NUMBER set): these tests are off it
        off_ci = mock.patch.dict("os.environ", {"CI": "", "BUILD_NUMBER": ""})
        off_ci.start()
        self.addCleanup(off_ci.stop)

    def test_a_failed_comparison_is_explained_as_pytest_does(self) -> None:
        explain = assert_rewrite._explainer(0, 8, 640)
        text = explain("==", [1, 2, 3], [1, 2, 4])
        assert text is not None
        self.assertIn("At index 2 diff: 3 != 4", text)
        self.assertIn("Use -v to get more diff", text)
        self.assertIsNone(explain("==", 1, 2))  # nothing to add to `assert 1 == 2`

    def test_on_a_ci_machine_the_whole_diff_is_shown_as_pytest_shows_it(self) -> None:
        with mock.patch.dict("os.environ", {"CI": "true"}):
            text = assert_rewrite._explainer(0, 0, 0)("==", [1, 2, 3], [1, 2, 4])
        assert text is not None
        self.assertIn("Full diff", text)
        self.assertNotIn("Use -v to get more diff", text)

    def test_long_explanations_are_cut_unless_verbose(self) -> None:
        left, right = list(range(100)), list(range(1, 101))
        cut = assert_rewrite._explainer(1, 8, 640)("==", left, right)  # -v: a full diff
        whole = assert_rewrite._explainer(2, 8, 640)("==", left, right)
        assert cut is not None and whole is not None
        self.assertIn("use '-vv' to show", cut)
        self.assertNotIn("use '-vv' to show", whole)
        self.assertGreater(whole.count("\n"), cut.count("\n"))

    def test_the_run_settings_reach_the_rank_through_its_environment(self) -> None:
        assert_rewrite.rewrite_in_ranks(["test_user"], verbosity=2, truncation=(0, 0))
        env = assert_rewrite.settings()
        self.assertEqual(env, {assert_rewrite.REWRITE_ENV: "test_user",
                               assert_rewrite.EXPLAIN_ENV: "2,0,0"})
        util._reprcompare = None
        assert_rewrite.install(env)
        self.assertIsNotNone(util._reprcompare)
        text = util._reprcompare("==", list(range(100)), list(range(1, 101)))
        self.assertNotIn("use '-vv' to show", text)

    def test_nothing_is_installed_outside_pytest(self) -> None:
        assert_rewrite.rewrite_in_ranks([])
        self.assertEqual(assert_rewrite.settings(), {})
        util._reprcompare = None
        assert_rewrite.install({})
        self.assertIsNone(util._reprcompare)


if __name__ == "__main__":
    unittest.main()
