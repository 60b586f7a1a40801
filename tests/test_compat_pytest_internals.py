"""harness.compat.pytest_internals: each private pytest symbol the harness uses exists and
behaves as the harness expects with the installed pytest. A failure names the symbol and the
pytest version: a new pytest that moved or changed one fails here, in the project's own tests,
not silently in a user's ranks."""

from __future__ import annotations

import ast
import os
import sys
import textwrap
import types
import unittest
from importlib import import_module
from unittest import mock

import pytest
from _pytest.assertion import util

from harness.compat import pytest_internals
from harness.compat.pytest_internals import PytestInternalsError

SOURCE = textwrap.dedent("""
    def compare(rank):
        assert [1, 2, rank + 3] == [1, 2, 3]
""").encode()


def about(symbol: str) -> str:
    return f"{symbol} with pytest {pytest.__version__}"


def rewritten_module() -> types.ModuleType:
    """SOURCE imported as pytest's import hook would import it."""
    tree = ast.parse(SOURCE)
    pytest_internals.rewrite_asserts(tree, SOURCE, "probe.py")
    module = types.ModuleType("probe")
    exec(compile(tree, "probe.py", "exec", dont_inherit=True), vars(module))
    return module


class PrivateSymbols(unittest.TestCase):
    def setUp(self) -> None:
        saved = util._reprcompare
        self.addCleanup(setattr, util, "_reprcompare", saved)
        util._reprcompare = None
        env = mock.patch.dict(os.environ)  # off a CI machine: before pytest 9, even empty is on
        env.start()
        self.addCleanup(env.stop)
        for name in ("CI", "BUILD_NUMBER"):
            os.environ.pop(name, None)

    def failure_of(self, module: types.ModuleType) -> str:
        with self.assertRaises(AssertionError) as raised:
            module.compare(2)
        return str(raised.exception)

    def test_rewrite_asserts_rewrites_as_pytests_import_hook(self) -> None:
        module = rewritten_module()
        self.assertIn("assert [1, 2, 5] == [1, 2, 3]", self.failure_of(module),
                      about("_pytest.assertion.rewrite.rewrite_asserts"))
        self.assertTrue(pytest_internals.was_rewritten(module),
                        about("the @pytest_ar global of a rewritten module"))
        self.assertFalse(pytest_internals.was_rewritten(unittest))

    def test_rewritten_asserts_read_the_explainer_set_for_this_process(self) -> None:
        pytest_internals.set_comparison_explainer(lambda op, left, right: "the rank's text")
        self.assertIn("the rank's text", self.failure_of(rewritten_module()),
                      about("_pytest.assertion.util._reprcompare"))

    def test_a_failed_comparison_is_explained_and_cut_as_pytest_does(self) -> None:
        symbol = about("_pytest.assertion.pytest_assertrepr_compare and .truncate")
        lines = pytest_internals.explain_comparison("==", [1, 2, 3], [1, 2, 4], 0, 8, 640)
        self.assertIsNotNone(lines, symbol)
        assert lines is not None
        self.assertEqual(lines[0], "[1, 2, 3] == [1, 2, 4]", symbol)
        self.assertIn("At index 2 diff: 3 != 4", lines, symbol)
        self.assertIsNone(pytest_internals.explain_comparison("==", 1, 2, 0, 8, 640), symbol)
        left, right = list(range(100)), list(range(1, 101))
        cut = pytest_internals.explain_comparison("==", left, right, 1, 8, 640)
        whole = pytest_internals.explain_comparison("==", left, right, 2, 8, 640)
        uncut = pytest_internals.explain_comparison("==", left, right, 1, 0, 0)
        assert cut is not None and whole is not None and uncut is not None
        self.assertIn("use '-vv' to show", cut[-1], symbol)
        self.assertLessEqual(len(cut), 8 + 2, symbol)  # pytest's limit, its footer
        self.assertGreater(len(whole), 100, symbol)
        self.assertNotIn("use '-vv' to show", whole[-1] + uncut[-1], symbol)

    def test_a_changed_signature_is_reported_naming_the_symbol_and_version(self) -> None:
        def older(config, op, left):  # any other signature than the installed one's
            return None

        with mock.patch.object(util, "assertrepr_compare", older), \
                self.assertRaises(PytestInternalsError) as raised:
            pytest_internals.explain_comparison("==", [1], [2], 0, 8, 640)
        self.assertIn(f"_pytest.assertion.pytest_assertrepr_compare of pytest "
                      f"{pytest.__version__}: TypeError: ", str(raised.exception))

    def test_running_on_ci_is_pytests_own_rule(self) -> None:
        symbol = about("running_on_ci (_pytest.compat, or _pytest.assertion.util before 9)")
        rules = [getattr(import_module(m), "running_on_ci", None)
                 for m in ("_pytest.compat", "_pytest.assertion.util")]
        self.assertTrue(any(rules), symbol)
        self.assertFalse(pytest_internals.running_on_ci(), symbol)
        with mock.patch.dict(os.environ, {"CI": "true"}):
            self.assertTrue(pytest_internals.running_on_ci(), symbol)


class SupportedPytest(unittest.TestCase):
    def test_the_installed_pytest_is_supported(self) -> None:
        self.assertIsNone(pytest_internals.check_supported_pytest(pytest.__version__))

    def test_older_than_the_floor_is_one_line_naming_both(self) -> None:
        message = pytest_internals.check_supported_pytest("8.3.5")
        assert message is not None
        self.assertIn("needs pytest 8.4 or newer, this is pytest 8.3.5", message)
        self.assertNotIn("\n", message)
        self.assertIsNotNone(pytest_internals.check_supported_pytest("7.4.4"))

    def test_the_floor_and_newer_are_supported(self) -> None:
        for version in ("8.4.0", "8.10.1", "9.2.0", "10.0.0rc1", "9.3.0.dev12+g1234"):
            self.assertIsNone(pytest_internals.check_supported_pytest(version), version)


class HarnessLeftUnrewritten(unittest.TestCase):
    """pytest would rewrite every module of the harness's distribution (it registers a pytest11
    plugin) anew in every session without cached bytecode; `import harness` under pytest asks
    its import hook not to (`leave_unrewritten`)."""

    def setUp(self) -> None:
        if not any(type(f).__name__ == "AssertionRewritingHook" for f in sys.meta_path):
            self.skipTest("not run by pytest: no assertion rewriting hook to ask")

    def test_pytests_hook_no_longer_marks_the_harness(self) -> None:
        hooks = [f for f in sys.meta_path if type(f).__name__ == "AssertionRewritingHook"]
        self.assertNotIn("harness", hooks[0]._must_rewrite, about("AssertionRewritingHook"))

    def test_the_harness_modules_imported_here_were_not_rewritten(self) -> None:
        import harness.process.supervisor
        import harness.settings

        for module in (harness.settings, harness.process.supervisor):
            self.assertFalse(pytest_internals.was_rewritten(module), module.__name__)

    def test_a_hook_without_the_expected_state_is_left_alone(self) -> None:
        class AssertionRewritingHook:  # a future pytest's, without _must_rewrite
            pass

        with mock.patch.object(sys, "meta_path", [AssertionRewritingHook()]):
            self.assertFalse(pytest_internals.leave_unrewritten("harness"))


if __name__ == "__main__":
    unittest.main()
