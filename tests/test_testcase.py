"""harness.testcase: tensor-aware equality, seeding, run_subtests as a method."""

import datetime
import enum
import json
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import types
import unittest
import warnings
from typing import Any, Dict, List, Tuple
from unittest import mock

import numpy
import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor

from harness import TestCase
from harness.launch.context import RankContext
from harness.launch.report import RankRecord, RecordSink, ReportingResult
from harness.testcase import SEED_ENV, current_seed, route_test_method

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


class _Subclass(torch.Tensor):
    """A tensor subclass: its class has `__array__`, like AsyncCollectiveTensor's."""


class _HasArray:
    """A non-tensor object with `__array__`: compared with `==` (identity), not as array data."""

    def __array__(self, dtype=None, copy=None):
        return numpy.zeros(2)


class UpstreamAssertEqualFormsTest(TestCase):
    def test_classes_and_types_compare_without_becoming_tensors(self):
        self.assertTrue(hasattr(_Subclass, "__array__"))
        out = torch.ones(2).as_subclass(_Subclass)
        self.assertEqual(type(out), _Subclass)
        self.assertEqual(type(torch.ones(1)), torch.Tensor)
        self.assertEqual(DTensor, DTensor)
        self.assertEqual([type(out), int], [_Subclass, int])
        with self.assertRaisesRegex(AssertionError, "_Subclass"):
            self.assertEqual(type(out), torch.Tensor)
        with self.assertRaises(AssertionError):
            self.assertEqual(_Subclass, torch.ones(2))
        self.assertNotEqual(type(out), DTensor)

    def test_other_objects_with_array_attributes_use_eq(self):
        a, b = _HasArray(), _HasArray()
        self.assertEqual(a, a)
        with self.assertRaisesRegex(AssertionError, "_HasArray"):
            self.assertEqual(a, b)  # as arrays they would be equal
        self.assertEqual(numpy.array([1.0, 2.0]), torch.tensor([1.0, 2.0], dtype=torch.float64))
        with self.assertRaises(AssertionError):
            self.assertEqual(numpy.array([1.0, 2.0]), numpy.array([1.0, 3.0]))
        self.assertEqual(numpy.array(["a", "b"]), ["a", "b"])

    def test_none_devices_dtypes(self):
        self.assertEqual(None, None)
        for other in (torch.zeros(1), 0, [], "None"):
            with self.assertRaisesRegex(AssertionError, "None"):
                self.assertEqual(None, other)
            with self.assertRaisesRegex(AssertionError, "None"):
                self.assertEqual(other, None)
        self.assertEqual(torch.float32, torch.float)
        with self.assertRaisesRegex(AssertionError, "torch.float32 != torch.bfloat16"):
            self.assertEqual(torch.float32, torch.bfloat16)
        self.assertEqual(torch.device("cpu", 0), torch.device("cpu", 0))

    def test_msg_positional_keyword_and_callable(self):
        with self.assertRaisesRegex(AssertionError, "positional context"):
            self.assertEqual(torch.ones(1), torch.zeros(1), "positional context")
        with self.assertRaisesRegex(AssertionError, "keyword context"):
            self.assertEqual([1], [2], msg="keyword context")
        with self.assertRaisesRegex(AssertionError, r"^built: 1 != 2$"):
            self.assertEqual(1, 2, msg=lambda generated: f"built: {generated}")
        with self.assertRaisesRegex(AssertionError, "string context"):
            self.assertEqual("a", "b", msg="string context")

    def test_python_floats_use_upstream_tolerances_and_ints_are_exact(self):
        self.assertEqual(1.0, 1.0 + 1e-7)
        self.assertEqual(torch.tensor(2.0), 2.0 + 1e-7)
        self.assertEqual(3, torch.tensor([3]))
        with self.assertRaises(AssertionError):
            self.assertEqual(1.0, 1.001)
        with self.assertRaises(AssertionError):
            self.assertEqual(10**12, 10**12 + 1)
        self.assertEqual(1.0, 1.001, atol=1e-2, rtol=0)
        self.assertEqual(1 + 1j, 1 + 1j + 1e-7j)

    def test_bools_compare_as_truth_values(self):
        self.assertEqual(True, 1)
        self.assertEqual(torch.tensor(True), True)
        with self.assertRaises(AssertionError):
            self.assertEqual(False, 1)
        with self.assertRaises(AssertionError):
            self.assertEqual(True, "True")

    def test_equal_nan(self):
        nan = torch.tensor([float("nan")])
        with self.assertRaises(AssertionError):
            self.assertEqual(nan, nan, equal_nan=False)
        with self.assertRaises(AssertionError):
            self.assertEqual(float("nan"), float("nan"), equal_nan=False)

    def test_exact_layout_stride_and_coalesced(self):
        dense = torch.eye(3)
        self.assertEqual(dense.to_sparse(), dense)
        with self.assertRaisesRegex(AssertionError, "layout"):
            self.assertEqual(dense.to_sparse(), dense, exact_layout=True)
        strided = torch.arange(6.0).reshape(2, 3).t()
        self.assertEqual(strided, strided.contiguous())
        with self.assertRaisesRegex(AssertionError, "stride"):
            self.assertEqual(strided, strided.contiguous(), exact_stride=True)
        indices = torch.tensor([[0, 0], [1, 1]])
        uncoalesced = torch.sparse_coo_tensor(
            indices, torch.tensor([1.0, 2.0]), (2, 2), check_invariants=True
        )
        self.assertEqual(uncoalesced, uncoalesced.coalesce())
        with self.assertRaisesRegex(AssertionError, "is_coalesced"):
            self.assertEqual(uncoalesced, uncoalesced.coalesce(), exact_is_coalesced=True)

    def test_nested_containers_with_tensors_and_modules(self):
        value = {"a": [torch.ones(2), (1, None)], "b": torch.Size([2, 3])}
        self.assertEqual(value, {"a": [torch.ones(2), (1, None)], "b": (2, 3)})
        with self.assertRaisesRegex(AssertionError, r"at \['a'\]\[0\]"):
            self.assertEqual(value, {"a": [torch.zeros(2), (1, None)], "b": (2, 3)})
        first, second = nn.Linear(1, 1), nn.Linear(1, 1)
        self.assertEqual(nn.ModuleList([first]), [first])
        with self.assertRaises(AssertionError):
            self.assertEqual(nn.Sequential(first), nn.Sequential(second))

    def test_tensor_against_unrelated_objects_fails_without_crashing(self):
        for other in ("abc", object(), {"a": 1}):
            with self.assertRaisesRegex(AssertionError, "a tensor and a"):
                self.assertEqual(torch.ones(1), other)
        with self.assertRaisesRegex(AssertionError, "cannot compare a tensor with list"):
            self.assertEqual(torch.ones(2), [[1.0], [1.0, 2.0]])

    def test_tensors_of_unrelated_subclasses_compare_by_value(self):
        # upstream files compare e.g. an AsyncCollectiveTensor with a LocalTensor this way;
        # torch.testing.assert_close refuses the pair instead of comparing it
        class _Other(torch.Tensor):
            pass

        mine = torch.ones(3).as_subclass(_Subclass)
        other = torch.ones(3).as_subclass(_Other)
        self.assertEqual(mine, other)
        with self.assertRaisesRegex(AssertionError, "not close"):
            self.assertEqual(mine, other * 2)
        self.assertNotEqual(mine, other + 1)

    def test_assert_not_equal_takes_the_same_keywords(self):
        self.assertNotEqual(1.0, 1.5, atol=0.1, rtol=0)
        self.assertNotEqual(torch.ones(2), torch.ones(2, dtype=torch.float64))
        with self.assertRaises(AssertionError):
            self.assertNotEqual(
                torch.ones(2), torch.ones(2, dtype=torch.float64), exact_dtype=False
            )
        with self.assertRaisesRegex(AssertionError, "ctx"):
            self.assertNotEqual(1, 1, "ctx")


class _NoArray(enum.Enum):
    A = 1
    B = 2


def comparison_cases() -> List[Tuple[str, Any, Any, Dict[str, Any]]]:
    """(label, first, second, keywords) pairs that upstream tests hand to assertEqual."""
    has_array, linear = _HasArray(), nn.Linear(1, 1)
    pairs = [
        (_Subclass, _Subclass, {}), (_Subclass, torch.Tensor, {}), (int, int, {}),
        (type(torch.ones(1)), torch.Tensor, {}), (None, None, {}), (None, 0, {}),
        (torch.zeros(1), None, {}), (torch.float32, torch.float32, {}),
        (torch.float32, torch.float64, {}), (torch.device("cpu"), torch.device("cpu"), {}),
        (torch.device("cpu"), "cpu", {}), (1, 1, {}), (1, 2, {}), (1, 1.0, {}),
        (1.0, 1.0 + 1e-7, {}), (1.0, 1.0 + 1e-4, {}), (100.0, 100.0 + 1e-4, {}),
        (10**12, 10**12 + 1, {}), (True, 1, {}), (True, 2, {}), (False, 1, {}),
        (True, False, {}), (float("nan"), float("nan"), {}),
        (float("nan"), float("nan"), {"equal_nan": False}), (1 + 1j, 1 + 1j, {}),
        (_NoArray.A, _NoArray.A, {}), (_NoArray.A, _NoArray.B, {}), (_NoArray.A, 1, {}),
        ("a", "a", {}), ("a", "b", {}), ("a", ["a"], {}), ([1, 2], (1, 2), {}),
        ([1, 2], [1, 2, 3], {}), ({"a": 1}, {"a": 1}, {}), ({"a": 1}, {"b": 1}, {}),
        ({1, 2}, {1, 2}, {}), ({1, 2}, {1, 3}, {}), (torch.ones(2), torch.ones(2) + 1e-7, {}),
        (torch.ones(2), torch.ones(2) + 1e-3, {}),
        (torch.ones(2), torch.ones(2, dtype=torch.float64), {}),
        (torch.ones(2), torch.ones(2, dtype=torch.float64), {"exact_dtype": False}),
        (torch.ones(2), [1.0, 1.0], {}), ([1.0, 1.0], torch.ones(2), {}),
        (torch.ones(2), [1.0, 2.0], {}), (torch.tensor(2.0), 2.0, {}),
        (torch.tensor([2.0]), 2, {}), (2.0, torch.tensor(2.0), {}), (torch.tensor(2.0), 3.0, {}),
        (torch.tensor(True), True, {}), (torch.tensor(1), True, {}),
        (numpy.array([1.0, 2.0]), torch.tensor([1.0, 2.0], dtype=torch.float64), {}),
        (numpy.array([1.0]), numpy.array([2.0]), {}), (numpy.float32(1.0), 1.0, {}),
        (numpy.int64(3), 3, {}), (has_array, has_array, {}), (has_array, _HasArray(), {}),
        (torch.Size([2, 3]), (2, 3), {}), (torch.Size([2, 3]), [2, 4], {}),
        (torch.eye(2).to_sparse(), torch.eye(2), {}),
        (torch.eye(2).to_sparse(), torch.eye(2), {"exact_layout": True}),
        (torch.ones(1), torch.ones(1) + 0.05, {"atol": 0.1, "rtol": 0}),
        (1.0, 1.05, {"atol": 0.1, "rtol": 0}), (1.0, 1.05, {"atol": 0.01, "rtol": 0}),
        (nn.ModuleList([linear]), [linear], {}),
        (nn.Sequential(linear), nn.Sequential(nn.Linear(1, 1)), {}),
        ([torch.ones(2), (1, None)], [torch.ones(2), (1, None)], {}),
        ([torch.ones(2), (1, None)], [torch.ones(2), (1, 0)], {}), (torch.ones(2), "x", {}),
        (object(), object(), {}), (torch.ones(2, 2), torch.ones(2, 2).t(), {"exact_stride": True}),
    ]
    # Where the harness is deliberately more lenient: a tensor equals a number that each of
    # its elements equals (upstream rejects numbers against tensors of several elements).
    lenient = [(torch.tensor([2, 2]), 2, {})]
    return [
        (f"{kind} {i}: {type(a).__name__} vs {type(b).__name__} {kw}", a, b, kw)
        for kind, cases in (("same", pairs), ("lenient", lenient))
        for i, (a, b, kw) in enumerate(cases)
    ]


def passes(base: type, first: Any, second: Any, keywords: Dict[str, Any]) -> bool:
    """Whether `base`'s assertEqual accepts the pair (any exception is a rejection)."""

    class Probe(base):  # type: ignore[misc, valid-type]
        def runTest(self) -> None:  # noqa: N802 - unittest's naming
            """Unused: the probe only lends its assertEqual."""

    try:
        Probe().assertEqual(first, second, **keywords)
    except Exception:
        return False
    return True


def print_upstream_verdicts() -> None:
    """Run in a child process: upstream's verdict for each comparison case, as JSON."""
    import json

    from torch.testing._internal.common_utils import TestCase as UpstreamTestCase

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        verdicts = {
            label: passes(UpstreamTestCase, a, b, kw) for label, a, b, kw in comparison_cases()
        }
    print(json.dumps(verdicts))


@pytest.mark.slow
class AssertEqualMatchesUpstreamTest(unittest.TestCase):
    """Differential: the same pairs through upstream's assertEqual and ours agree."""

    def test_same_verdicts_as_upstream(self) -> None:
        code = "from tests.test_testcase import print_upstream_verdicts; print_upstream_verdicts()"
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
            env=dict(os.environ, PYTHONPATH=ROOT),
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        upstream = json.loads(done.stdout.strip().splitlines()[-1])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ours = {label: passes(TestCase, a, b, kw) for label, a, b, kw in comparison_cases()}
        self.assertEqual(sorted(upstream), sorted(ours))
        differ = {label for label in ours if ours[label] != upstream[label]}
        lenient = {label for label in ours if label.startswith("lenient")}
        self.assertEqual(differ, lenient)
        self.assertTrue(all(ours[label] and not upstream[label] for label in lenient))
        self.assertEqual(len(set(ours.values())), 2, "the cases must include passes and failures")


class UpstreamTestCaseHelpersTest(TestCase):
    def test_assert_not_warn(self):
        self.assertNotWarn(lambda: None)
        with self.assertRaisesRegex(AssertionError, "UserWarning: careful.*my note"):
            self.assertNotWarn(lambda: warnings.warn("careful", stacklevel=1), "my note")
        warn_always = torch.is_warn_always_enabled()
        with self.assertRaises(AssertionError):
            self.assertNotWarn(lambda: warnings.warn("again", DeprecationWarning, stacklevel=1))
        self.assertEqual(torch.is_warn_always_enabled(), warn_always)

    @pytest.mark.slow
    def test_attempt_load_from_subprocess(self):
        with tempfile.TemporaryDirectory() as folder:
            plain = pathlib.Path(folder, "plain.pt")
            torch.save({"w": torch.ones(2)}, plain)
            self._attempt_load_from_subprocess(plain, "")
            dated = pathlib.Path(folder, "dated.pt")
            torch.save({"when": datetime.date(2020, 1, 1)}, dated)
            self._attempt_load_from_subprocess(dated, "", "Weights only load failed")
            with self.assertRaisesRegex(RuntimeError, "Weights only load failed"):
                self._attempt_load_from_subprocess(dated, "")
            with self.assertRaises(AssertionError):  # expected to fail, but it loads
                self._attempt_load_from_subprocess(plain, "", "Weights only load failed")


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
            def __init__(self, method_name="runTest"):
                super().__init__(method_name)
                route_test_method(self, lambda: calls.append("join"))

            def test_x(self):
                calls.append("body")

        module = types.ModuleType("fake_suite")
        module.Case = Case
        suite = unittest.defaultTestLoader.loadTestsFromName("Case.test_x", module)
        suite.run(unittest.TestResult())  # no rank_context: the supervisor
        in_rank = Case("test_x")
        in_rank.rank_context = RankContext(0, 1, ReportingResult(RecordSink(RankRecord(0))))
        in_rank.run(unittest.TestResult())
        self.assertEqual(calls, ["join", "body"])


if __name__ == "__main__":
    unittest.main()
