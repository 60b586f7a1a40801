"""harness/process/assert_rewrite.py: what a rank process needs to fail an `assert` as pytest
would in its own process (the end-to-end runs are tests/test_pytest_functions.py)."""

from __future__ import annotations

import os
import sys
import tempfile
import textwrap
import unittest
from unittest import mock

from _pytest.assertion import util

from harness.compat import pytest_internals
from harness.process import assert_rewrite

USER_MODULE = textwrap.dedent("""
    def compare(rank):
        assert [1, 2, rank + 3] == [1, 2, 3]

    def with_message(rank):
        assert rank == 0, "the user's own message"
""")


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
        # pytest explains more on a CI machine (CI or BUILD_NUMBER set; before pytest 9, even
        # empty): these tests are off it
        off_ci = mock.patch.dict("os.environ")
        off_ci.start()
        self.addCleanup(off_ci.stop)
        for name in ("CI", "BUILD_NUMBER"):
            os.environ.pop(name, None)

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

    def test_a_verbosity_pytest_accepts_as_a_bool_reaches_the_rank(self) -> None:
        """A conftest's `config.option.verbose = True` (DeepSpeed's does): pytest reads 1."""
        assert_rewrite.rewrite_in_ranks(["test_user"], verbosity=True)  # type: ignore[arg-type]
        env = assert_rewrite.settings()
        self.assertEqual(env[assert_rewrite.EXPLAIN_ENV], "1,8,640")
        assert_rewrite.install(env)
        self.assertIsNotNone(util._reprcompare)

    def test_nothing_is_installed_outside_pytest(self) -> None:
        assert_rewrite.rewrite_in_ranks([])
        self.assertEqual(assert_rewrite.settings(), {})
        util._reprcompare = None
        assert_rewrite.install({})
        self.assertIsNone(util._reprcompare)

    def failure(self, function: str = "compare") -> str:
        """The message of a failed assert in a module imported as a rank imports it."""
        with tempfile.TemporaryDirectory() as folder:
            name = f"harness_rank_probe_{os.getpid()}"
            with open(os.path.join(folder, f"{name}.py"), "w") as file:
                file.write(USER_MODULE)
            sys.path.insert(0, folder)
            try:
                assert_rewrite.install({assert_rewrite.REWRITE_ENV: name})
                module = __import__(name)
                with self.assertRaises(AssertionError) as raised:
                    getattr(module, function)(2)
            finally:
                sys.path.remove(folder)
                sys.modules.pop(name, None)
        return str(raised.exception)

    def test_a_rank_assert_explains_itself_as_in_pytest(self) -> None:
        util._reprcompare = None
        message = self.failure()
        self.assertIn("assert [1, 2, 5] == [1, 2, 3]", message)
        self.assertIn("At index 2 diff: 5 != 3", message)

    def test_an_explainer_pytest_changed_leaves_the_plain_assert_and_one_line_why(self) -> None:
        changed = pytest_internals.PytestInternalsError(
            "_pytest.assertion.pytest_assertrepr_compare of pytest 9.9.0: TypeError: "
            "assertrepr_compare() takes 3 positional arguments\nbut 4 were given")
        with mock.patch.object(pytest_internals, "explain_comparison", side_effect=changed):
            message = self.failure()
        self.assertEqual(message.splitlines(), [
            "assert [1, 2, 5] == [1, 2, 3]",
            "  (harness: pytest's assertion explainer could not be used in the "
            "ranks: _pytest.assertion.pytest_assertrepr_compare of pytest 9.9.0: TypeError: "
            "assertrepr_compare() takes 3 positional arguments but 4 were given)",
        ])

    def test_a_plain_repr_of_what_cannot_be_explained_never_raises(self) -> None:
        class Unprintable:
            def __repr__(self) -> str:
                raise ValueError("no")

        self.assertEqual(assert_rewrite._plain_repr(Unprintable()),
                         "<Unprintable object: repr raised ValueError>")
        long = assert_rewrite._plain_repr("x" * 1000)
        self.assertEqual(len(long), 240)
        self.assertIn("...", long)

    def test_an_explainer_that_cannot_be_installed_is_named_in_each_assert(self) -> None:
        gone = pytest_internals.PytestInternalsError("_pytest.assertion.util._reprcompare: gone")
        with mock.patch.object(pytest_internals, "set_comparison_explainer", side_effect=gone):
            message = self.failure()
        self.assertIn("could not be used in the ranks: _pytest.assertion.util._reprcompare: "
                      "gone)", message.splitlines()[0])
        self.assertIn("assert [1, 2, 5] == [1, 2, 3]", message)  # still rewritten

    def test_rewriting_pytest_changed_leaves_plain_asserts_that_say_why(self) -> None:
        gone = pytest_internals.PytestInternalsError("_pytest.assertion.rewrite: moved")
        with mock.patch.object(pytest_internals, "rewrite_asserts", side_effect=gone):
            bare = self.failure()
            own = self.failure("with_message")
        self.assertEqual(bare, "(harness: pytest's assertion rewriting could not be used in "
                               "the ranks: _pytest.assertion.rewrite: moved)")
        self.assertEqual(own, "the user's own message")


if __name__ == "__main__":
    unittest.main()
