"""harness.compat.unittest_internals: each private unittest symbol the harness uses exists and
behaves as the harness expects on the running Python. A failure names the symbol and the
Python: a new Python whose unittest moved or changed one fails here, in the project's own
tests, not silently in a user's run."""

from __future__ import annotations

import sys
import unittest

from harness.compat import unittest_internals
from harness.compat.unittest_internals import about

# Each private symbol, where it lives (an instance attribute is checked on an instance).
CLASS_SYMBOLS = {
    "unittest.TestCase._callSetUp": (unittest.TestCase, "_callSetUp"),
    "unittest.TestCase._callTestMethod": (unittest.TestCase, "_callTestMethod"),
    "unittest.TestCase._callTearDown": (unittest.TestCase, "_callTearDown"),
    "unittest.TestCase._formatMessage": (unittest.TestCase, "_formatMessage"),
    "unittest.TestCase._diffThreshold": (unittest.TestCase, "_diffThreshold"),
    "unittest.TestResult._exc_info_to_string": (unittest.TestResult, "_exc_info_to_string"),
}


class Probe(unittest.TestCase):
    __test__ = False  # a case the tests look at, not one to run

    def test_x(self) -> None:
        pass


def _run(case: unittest.TestCase) -> unittest.TestResult:
    result = unittest.TestResult()
    case.run(result)
    return result


class PrivateSymbols(unittest.TestCase):
    def test_every_symbol_exists(self) -> None:
        for symbol, (owner, name) in CLASS_SYMBOLS.items():
            self.assertTrue(hasattr(owner, name), about(symbol))
        self.assertTrue(hasattr(Probe("test_x"), "_testMethodName"),
                        about("unittest.TestCase._testMethodName"))

    def test_about_names_the_symbol_and_the_python(self) -> None:
        text = about("unittest.TestCase._callSetUp")
        self.assertIn("unittest.TestCase._callSetUp", text)
        self.assertIn(".".join(map(str, sys.version_info[:2])), text)

    def test_method_name(self) -> None:
        symbol = about("unittest.TestCase._testMethodName")
        self.assertEqual(unittest_internals.method_name(Probe("test_x")), "test_x", symbol)
        self.assertIsNone(unittest_internals.method_name(object(), None))
        with self.assertRaises(AttributeError):
            unittest_internals.method_name(object())

    def test_the_hooks_run_calls_reach_the_public_names(self) -> None:
        calls = []

        class Hooked(unittest_internals.TestHooks, unittest.TestCase):
            def setUp(self) -> None:
                calls.append("setUp")

            def tearDown(self) -> None:
                calls.append("tearDown")

            def test_x(self) -> None:
                calls.append("test_x")

            def call_set_up(self) -> None:
                calls.append("call_set_up")
                super().call_set_up()

            def call_test_method(self, method) -> None:  # noqa: ANN001
                calls.append(f"call_test_method({method.__name__})")
                super().call_test_method(method)

            def call_tear_down(self) -> None:
                calls.append("call_tear_down")
                super().call_tear_down()

        result = _run(Hooked("test_x"))
        self.assertTrue(result.wasSuccessful(), result.errors)
        self.assertEqual(
            calls,
            ["call_set_up", "setUp", "call_test_method(test_x)", "test_x", "call_tear_down",
             "tearDown"],
            about("unittest.TestCase._callSetUp, _callTestMethod and _callTearDown"),
        )

    def test_exc_info_to_string_leaves_unittests_frames_out(self) -> None:
        symbol = about("unittest.TestResult._exc_info_to_string")
        result = unittest.TestResult()
        try:
            raise ValueError("the cause")
        except ValueError:
            err = sys.exc_info()
        text = unittest_internals.exc_info_to_string(result, err, Probe("test_x"))
        self.assertIn("Traceback (most recent call last):", text, symbol)
        self.assertIn("ValueError: the cause", text, symbol)
        self.assertIn(__file__.rstrip("c"), text, symbol)

    def test_frames_of_a_module_with_the_unittest_global_are_hidden(self) -> None:
        symbol = about("the __unittest module global")
        try:
            unittest.TestCase("run").fail("boom")
        except AssertionError:
            tb = sys.exc_info()[2]
        assert tb is not None
        frames = []
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        self.assertFalse(unittest_internals.hidden_by_unittest(frames[0]), symbol)
        self.assertTrue(unittest_internals.hidden_by_unittest(frames[-1]), symbol)

    def test_format_message(self) -> None:
        symbol = about("unittest.TestCase._formatMessage")
        case = Probe("test_x")
        self.assertEqual(unittest_internals.format_message(case, None, "standard"), "standard",
                         symbol)
        self.assertEqual(unittest_internals.format_message(case, "mine", "standard"),
                         "standard : mine", symbol)

    def test_every_diff_is_shown(self) -> None:
        symbol = about("unittest.TestCase._diffThreshold")
        first = "\n".join(["same"] * 20000 + ["first"])
        second = "\n".join(["same"] * 20000 + ["second"])

        class Plain(unittest.TestCase):
            maxDiff = None

            def test_x(self) -> None:
                self.assertMultiLineEqual(first, second)

        @unittest_internals.show_every_diff
        class Diffing(Plain):
            pass

        def failure(cls: type) -> str:
            result = _run(cls("test_x"))
            self.assertEqual(len(result.failures), 1)
            return result.failures[0][1]

        self.assertNotIn("+ second", failure(Plain), symbol)  # past unittest's threshold
        self.assertIn("+ second", failure(Diffing), symbol)

    def test_skip_marks_are_unittests(self) -> None:
        symbol = about("__unittest_skip__ and __unittest_skip_why__")

        class Marked(unittest.TestCase):
            def test_x(self) -> None:
                pass

        unittest_internals.mark_skipped(Marked.test_x, "not here")
        result = _run(Marked("test_x"))
        self.assertEqual([reason for _, reason in result.skipped], ["not here"], symbol)
        self.assertTrue(unittest_internals.marked_skipped(Marked.test_x))
        self.assertTrue(unittest_internals.marked_skipped(unittest.skip("why")(lambda: None)),
                        symbol)
        self.assertFalse(unittest_internals.marked_skipped(Probe.test_x))

    def test_expected_failure_marks_are_unittests(self) -> None:
        symbol = about("__unittest_expecting_failure__")

        class Marked(unittest.TestCase):
            def test_x(self) -> None:
                self.fail("expected")

        unittest_internals.mark_expected_failure(Marked.test_x)
        result = _run(Marked("test_x"))
        self.assertEqual(len(result.expectedFailures), 1, symbol)
        self.assertTrue(unittest_internals.expects_failure(Marked.test_x))
        self.assertTrue(
            unittest_internals.expects_failure(unittest.expectedFailure(lambda: None)), symbol
        )
        self.assertFalse(unittest_internals.expects_failure(Probe.test_x))


if __name__ == "__main__":
    unittest.main()
