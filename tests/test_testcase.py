"""harness.testcase: tensor-aware equality, seeding, run_subtests as a method."""

import random
import types
import unittest
from unittest import mock

import torch

from harness import TestCase
from harness.testcase import SEED_ENV, current_seed, route_test_method


class AssertEqualTest(TestCase):
    def test_tensors_equal_within_dtype_tolerance(self):
        a = torch.tensor([1.0, 2.0])
        self.assertEqual(a, a + 1e-7)
        with self.assertRaisesRegex(AssertionError, "tensors differ"):
            self.assertEqual(a, a + 1e-3)

    def test_half_precision_uses_looser_tolerance(self):
        a = torch.tensor([1.0], dtype=torch.float16)
        self.assertEqual(a, a + 5e-4)
        with self.assertRaises(AssertionError):
            self.assertEqual(a.float(), a.float() + 5e-4)

    def test_explicit_atol_rtol(self):
        a = torch.tensor([1.0])
        self.assertEqual(a, a + 0.05, atol=0.1, rtol=0)
        with self.assertRaises(AssertionError):
            self.assertEqual(a, a + 0.05, atol=0.01, rtol=0)
        self.assertEqual(1.0, 1.05, atol=0.1)
        with self.assertRaises(AssertionError):
            self.assertEqual(1.0, 1.05)

    def test_exact_dtype(self):
        with self.assertRaisesRegex(AssertionError, "dtype"):
            self.assertEqual(torch.ones(2), torch.ones(2, dtype=torch.float64))
        self.assertEqual(torch.ones(2), torch.ones(2, dtype=torch.float64), exact_dtype=False)

    def test_exact_device(self):
        with self.assertRaisesRegex(AssertionError, "device"):
            self.assertEqual(torch.ones(2), torch.ones(2, device="meta"), exact_device=True)

    @unittest.skipUnless(torch.cuda.is_available(), "needs a CUDA device to hold a second copy")
    def test_devices_ignored_by_default(self):
        self.assertEqual(torch.ones(2, device="cuda"), torch.ones(2))
        with self.assertRaises(AssertionError):
            self.assertEqual(torch.ones(2, device="cuda"), torch.ones(2), exact_device=True)

    def test_tensor_vs_number_and_list(self):
        self.assertEqual(torch.tensor([2, 2]), 2)
        self.assertEqual(torch.tensor([[1, 2], [3, 4]]), [[1, 2], [3, 4]])
        self.assertEqual([1.0, 2.0], torch.tensor([1.0, 2.0]))
        with self.assertRaises(AssertionError):
            self.assertEqual(torch.tensor([1]), 1.5)
        with self.assertRaises(AssertionError):
            self.assertEqual(torch.tensor([1, 2]), [1, 3])

    def test_containers_elementwise(self):
        value = {"w": torch.ones(2), "n": [1, (2, 3)]}
        self.assertEqual(value, {"w": torch.ones(2), "n": [1, (2, 3)]})
        with self.assertRaisesRegex(AssertionError, r"at \['n'\]\[1\]\[0\]"):
            self.assertEqual({"n": [1, (2, 3)]}, {"n": [1, (4, 3)]})
        with self.assertRaisesRegex(AssertionError, "lengths differ"):
            self.assertEqual([1, 2], [1, 2, 3])
        with self.assertRaisesRegex(AssertionError, "keys differ"):
            self.assertEqual({"a": 1}, {"b": 1})

    def test_other_values_with_eq(self):
        self.assertEqual("abc", "abc")
        self.assertEqual(torch.device("cpu"), torch.device("cpu"))
        with self.assertRaises(AssertionError):
            self.assertEqual(torch.device("cpu"), torch.device("meta"))
        with self.assertRaises(AssertionError):
            self.assertEqual("abc", "abd")

    def test_nan_equals_nan(self):
        self.assertEqual(torch.tensor([float("nan")]), torch.tensor([float("nan")]))
        self.assertEqual(float("nan"), float("nan"))

    def test_msg_is_kept(self):
        with self.assertRaisesRegex(AssertionError, "my context"):
            self.assertEqual(1, 2, "my context")

    def test_assert_not_equal_is_negation(self):
        self.assertNotEqual(torch.ones(2), torch.zeros(2))
        self.assertNotEqual([1, 2], [1, 3])
        with self.assertRaisesRegex(AssertionError, "values are equal"):
            self.assertNotEqual(torch.ones(2), torch.ones(2))
        with self.assertRaises(AssertionError):
            self.assertNotEqual({"a": 1}, {"a": 1})

    def test_expecttest_base(self):
        self.assertExpectedInline(str(1 + 1), """2""")


class SeedingTest(TestCase):
    def test_each_test_starts_from_the_same_seed(self):
        first = (torch.rand(3), random.random())
        self.setUp()
        second = (torch.rand(3), random.random())
        self.assertEqual(first, second)

    def test_seed_from_env(self):
        with mock.patch.dict("os.environ", {SEED_ENV: "7"}):
            self.assertEqual(current_seed(), 7)
            self.setUp()
            value = torch.rand(1)
        torch.manual_seed(7)
        self.assertEqual(value, torch.rand(1))

    def test_bad_seed_names_the_variable(self):
        with mock.patch.dict("os.environ", {SEED_ENV: "x"}):
            with self.assertRaisesRegex(ValueError, "HARNESS_SEED='x'"):
                current_seed()


class RunSubtestsMethodTest(unittest.TestCase):
    def test_method_and_grid_point_hook(self):
        seen = []

        class Case(TestCase):
            def test_grid(self):
                self.run_subtests({"a": [1, 2]}, lambda a, extra: seen.append((a, extra)), extra=0)

        result = unittest.TestResult()
        Case("test_grid").run(result)
        self.assertTrue(result.wasSuccessful())
        self.assertEqual(seen, [(1, 0), (2, 0)])


class RouteTestMethodTest(unittest.TestCase):
    def test_loader_by_name_sees_a_method_and_the_supervisor_joins(self):
        calls = []

        class Case(TestCase):
            supervisor = True

            def __init__(self, method_name="runTest"):
                super().__init__(method_name)
                route_test_method(self, lambda: self.supervisor, lambda: calls.append("join"))

            def test_x(self):
                calls.append("body")

        module = types.ModuleType("fake_suite")
        module.Case = Case
        suite = unittest.defaultTestLoader.loadTestsFromName("Case.test_x", module)
        suite.run(unittest.TestResult())
        Case.supervisor = False
        Case("test_x").run(unittest.TestResult())
        self.assertEqual(calls, ["join", "body"])


if __name__ == "__main__":
    unittest.main()
