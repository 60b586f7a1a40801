"""harness.single_process.testcase: tensor-aware equality, seeding, run_subtests as a method."""

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
from harness.launch.routing import route_test_method
from harness.outcome.rank_record import RankRecord, RecordSink, ReportingResult
from harness.single_process.testcase import SEED_ENV, current_seed
from tests.upstream_probe import compare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


KEYS_DIFFER = (
    r"^The keys of the mappings do not match:\nMissing keys in the actual mapping: \['b'\]\n"
    r"Additional keys in the actual mapping: \['a'\]$"
)


class AssertEqualTest(TestCase):
    def test_tensors_equal_within_dtype_tolerance(self):
        a = torch.tensor([1.0, 2.0])
        self.assertEqual(a, a + 1e-7)
        with self.assertRaisesRegex(AssertionError, "^Tensor-likes are not close!"):
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
        with self.assertRaisesRegex(AssertionError, r"item \['n'\]\[1\]\[0\]$"):
            self.assertEqual({"n": [1, (2, 3)]}, {"n": [1, (4, 3)]})
        with self.assertRaisesRegex(AssertionError, "^The length of the sequences mismatch: 2 != 3$"
                                    ):
            self.assertEqual([1, 2], [1, 2, 3])
        with self.assertRaisesRegex(AssertionError, KEYS_DIFFER):
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
        with self.assertRaisesRegex(AssertionError, "^AssertionError not raised$"):
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
        with self.assertRaisesRegex(AssertionError, r"^built: Scalars are not equal!\n\n"):
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
        with self.assertRaisesRegex(AssertionError, r"failure occurred for item \['a'\]\[0\]$"):
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


def message_cases() -> List[Tuple[str, Any, Any, Dict[str, Any]]]:
    """(label, first, second, keywords) failing pairs whose messages must be upstream's, word
    for word; keywords may hold the case's `precision`/`rel_tol` and assertEqual's `msg`."""
    pairs = [
        (1, 2, {}), (1.0, 1.5, {}), (1, 1.5, {}), (True, False, {}), (None, 1, {}),
        (1, None, {}), ("a", "b", {}), ("one\ntwo", "one\nthree", {}), ([1, 2], [1, 2, 3], {}),
        ([1, 2], [1, 3], {}), ((1, 2), (1, 2, 3), {}), ({"a": 1}, {"b": 1}, {}),
        ({"a": 1, "b": 2}, {"a": 1, "c": 2}, {}), ({"a": 1}, {"a": 2}, {}),
        ({"a": [1, {"b": 2}]}, {"a": [1, {"b": 3}]}, {}), (torch.ones(2), torch.zeros(2), {}),
        (torch.ones(2), torch.ones(3), {}), (torch.ones(2), torch.ones(2, dtype=torch.float64), {}),
        (torch.tensor([1, 2]), torch.tensor([1, 3]), {}), (torch.tensor(1.0), 2, {}),
        (2, torch.tensor(3), {}), (torch.ones(2), [1, 3], {}), ({1, 2}, {1, 3}, {}),
        (int, float, {}), ("a", 1, {}), (torch.float32, torch.float64, {}),
        (torch.device("cpu"), torch.device("meta"), {}), (1 + 1j, 1 + 2j, {}),
        (float("nan"), 1.0, {}), ([torch.ones(1)], [torch.zeros(1)], {}),
        (1.0, 1.05, {"atol": 0.01, "rtol": 0}), (torch.ones(1), torch.ones(1) + 0.5,
                                                  {"atol": 0.1, "rtol": 0.1}),
        (1, 2, {"msg": "context"}), ([1], [2], {"msg": "context", "longMessage": False}),
        (torch.ones(1), torch.ones(1) * 1.5, {"precision": 0.1}),
        (torch.ones(1), torch.ones(1) * 1.5, {"rel_tol": 0.1}),
        (1.0, 1.5, {"precision": 0.1, "rel_tol": 0.01}), (3, 7, {"precision": 2}),
    ]
    return [
        (f"{i}: {type(a).__name__} vs {type(b).__name__} {kw}", a, b, kw)
        for i, (a, b, kw) in enumerate(pairs)
    ]


def message(base: type, first: Any, second: Any, keywords: Dict[str, Any]) -> str:
    """The failure text of `base`'s assertEqual for the pair (or why it did not fail)."""
    settings = {k: keywords[k] for k in ("precision", "rel_tol", "longMessage") if k in keywords}
    options = {k: v for k, v in keywords.items() if k not in settings}

    class Probe(base):  # type: ignore[misc, valid-type]
        def runTest(self) -> None:  # noqa: N802 - unittest's naming
            """Unused: the probe only lends its assertEqual."""

    probe = Probe()
    for name, value in settings.items():
        setattr(probe, name, value)
    try:
        probe.assertEqual(first, second, **options)
    except AssertionError as error:
        return str(error)
    except Exception as error:
        return f"raised {type(error).__name__}"
    return "passed"


def print_upstream_verdicts() -> None:
    """Run in a child process: upstream's verdict for each comparison case, and its message
    for each message case, as JSON."""
    import json

    from torch.testing._internal.common_utils import TestCase as UpstreamTestCase

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        verdicts = {
            label: passes(UpstreamTestCase, a, b, kw) for label, a, b, kw in comparison_cases()
        }
        messages = {
            label: message(UpstreamTestCase, a, b, kw) for label, a, b, kw in message_cases()
        }
    print(json.dumps({"verdicts": verdicts, "messages": messages}))


@pytest.mark.slow
class AssertEqualMatchesUpstreamTest(unittest.TestCase):
    """Differential: the same pairs through upstream's assertEqual and ours agree, verdicts
    and messages."""

    @classmethod
    def setUpClass(cls) -> None:
        code = "from tests.test_testcase import print_upstream_verdicts; print_upstream_verdicts()"
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
            env=dict(os.environ, PYTHONPATH=ROOT),
        )
        if done.returncode != 0:
            raise AssertionError(done.stderr[-3000:])
        cls.upstream = json.loads(done.stdout.strip().splitlines()[-1])

    def test_same_verdicts_as_upstream(self) -> None:
        upstream = self.upstream["verdicts"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ours = {label: passes(TestCase, a, b, kw) for label, a, b, kw in comparison_cases()}
        self.assertEqual(sorted(upstream), sorted(ours))
        differ = {label for label in ours if ours[label] != upstream[label]}
        lenient = {label for label in ours if label.startswith("lenient")}
        self.assertEqual(differ, lenient)
        self.assertTrue(all(ours[label] and not upstream[label] for label in lenient))
        self.assertEqual(len(set(ours.values())), 2, "the cases must include passes and failures")

    def test_same_messages_as_upstream(self) -> None:
        upstream = self.upstream["messages"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ours = {label: message(TestCase, a, b, kw) for label, a, b, kw in message_cases()}
        self.assertNotIn("passed", upstream.values())
        differ = {label: (ours[label], upstream[label]) for label in upstream
                  if ours[label] != upstream[label]}
        self.assertEqual(differ, {}, "(ours, upstream) per case")


# A file written against upstream's TestCase: per-test process state, tolerances, recorded
# exception messages, sparse inputs and message texts. Run under both harnesses.
TESTCASE_PROBE = r'''import unittest

import torch
from torch.testing._internal.common_utils import TestCase, run_tests


class TestState(TestCase):
    def test_a_turns_grad_off(self):
        torch.set_grad_enabled(False)

    def test_b_grad_is_back(self):
        self.assertTrue(torch.is_grad_enabled())

    def test_c_leaks_default_device(self):
        torch.set_default_device("meta")

    def test_d_default_device_is_back(self):
        self.assertEqual(torch.ones(1).device.type, "cpu")

    def test_e_sparse_invariants_checked(self):
        with self.assertRaises(RuntimeError):
            torch.sparse_coo_tensor(torch.tensor([[5]]), torch.ones(1), (2,))


class TestTolerances(TestCase):
    def test_precision_loosens(self):
        self.precision = 0.1
        self.assertEqual(torch.tensor([1.0]), torch.tensor([1.05]))
        self.assertEqual(1.0, 1.05)

    def test_rel_tol_loosens(self):
        self.rel_tol = 0.1
        self.assertEqual(torch.tensor([100.0]), torch.tensor([105.0]))

    def test_precision_too_small(self):
        self.precision = 1e-3
        self.assertEqual(torch.tensor([1.0]), torch.tensor([1.05]))

    def test_precision_on_ints(self):
        self.precision = 2
        self.assertEqual(torch.tensor([3]), torch.tensor([4]))


class TestExpected(TestCase):
    def test_raises_as_recorded(self):
        self.assertExpectedRaises(ValueError, lambda: int("x"))

    def test_raises_not_as_recorded(self):
        self.assertExpectedRaises(ValueError, lambda: int("y"), subname="other")

    def test_does_not_raise(self):
        self.assertExpectedRaises(ValueError, lambda: 1)

    def test_no_record(self):
        self.assertExpectedRaises(ValueError, lambda: int("z"), subname="missing")


class TestSparse(TestCase):
    def test_gen_sparse(self):
        for uncoalesced in (False, True):
            x, i, v = self.genSparseTensor([3, 4, 2], 2, 5, uncoalesced, "cpu", torch.float64)
            self.assertEqual(x.shape, (3, 4, 2))
            self.assertEqual(x.is_coalesced(), not uncoalesced)
            self.assertEqual(i.shape[0], 2)
            self.assertEqual(v.shape[1:], (2,))
            self.assertEqual(x.dtype, torch.float64)
            self.assertTrue(bool((v >= -1).all() and (v <= 1).all()))


class TestMessages(TestCase):
    def test_scalars(self):
        with self.assertRaisesRegex(AssertionError, r"^Scalars are not equal!"):
            self.assertEqual(1, 2)

    def test_containers(self):
        with self.assertRaisesRegex(AssertionError, r"The failure occurred for item \[1\]$"):
            self.assertEqual([1, 2], [1, 3])

    def test_not_equal(self):
        with self.assertRaisesRegex(AssertionError, r"^AssertionError not raised"):
            self.assertNotEqual(1, 1)


if __name__ == "__main__":
    run_tests()
'''
EXPECT_FILES = {
    "expect/TestExpected.test_raises_as_recorded.expect":
        "invalid literal for int() with base 10: 'x'",
    "expect/TestExpected.test_raises_not_as_recorded-other.expect": "something else",
}


@pytest.mark.slow
class TestCaseFileMatchesUpstreamTest(unittest.TestCase):
    """Differential: the same TestCase file under upstream's harness and this one."""

    def test_same_outcome_per_test_id(self) -> None:
        theirs, ours, shown = compare(TESTCASE_PROBE, files=EXPECT_FILES)
        self.assertEqual(len(theirs), 17, shown)
        self.assertEqual(ours, theirs, shown)
        self.assertEqual(theirs["TestState.test_c_leaks_default_device"], "failure")
        self.assertEqual(theirs["TestExpected.test_no_record"], "error")


def _run_case(cls: type, name: str) -> unittest.TestResult:
    result = unittest.TestResult()
    cls(name).run(result)
    return result


class UpstreamTestStateTest(unittest.TestCase):
    """What upstream's TestCase restores or checks around every test."""

    def test_grad_mode_is_restored(self) -> None:
        class Case(TestCase):
            def test_off(self):
                torch.set_grad_enabled(False)

        self.assertTrue(_run_case(Case, "test_off").wasSuccessful())
        self.assertTrue(torch.is_grad_enabled())

    def test_a_leaked_default_device_fails_the_test_and_is_undone(self) -> None:
        class Case(TestCase):
            def test_leak(self):
                torch.set_default_device("meta")

        result = _run_case(Case, "test_leak")
        self.assertEqual(len(result.failures), 1)
        self.assertIn("torch function mode stack was leaked: length changed from 0 to 1",
                      result.failures[0][1])
        self.assertEqual(torch.ones(1).device.type, "cpu")

    def test_sparse_invariants_are_checked_during_the_test_only(self) -> None:
        class Case(TestCase):
            def test_invalid(self):
                with self.assertRaises(RuntimeError):
                    torch.sparse_coo_tensor(torch.tensor([[5]]), torch.ones(1), (2,))

        before = torch.sparse.check_sparse_tensor_invariants.is_enabled()
        self.assertTrue(_run_case(Case, "test_invalid").wasSuccessful())
        self.assertEqual(torch.sparse.check_sparse_tensor_invariants.is_enabled(), before)

    def test_precision_and_rel_tol_are_lower_bounds(self) -> None:
        class Loose(TestCase):
            _precision = 0.1

            def test_close(self):
                self.assertEqual(torch.tensor([1.0]), torch.tensor([1.05]))
                self.assertEqual(1.0, 1.05)
                self.rel_tol = 0.5
                self.assertEqual(torch.tensor([100.0]), torch.tensor([140.0]))
                self.assertEqual(torch.tensor([1.0]), torch.tensor([1.05]), atol=0, rtol=0)

            def test_far(self):
                self.assertEqual(torch.tensor([1.0]), torch.tensor([1.5]))

        self.assertTrue(_run_case(Loose, "test_close").wasSuccessful())
        self.assertEqual(len(_run_case(Loose, "test_far").failures), 1)

    def test_current_test_name_as_method_and_as_property(self) -> None:
        class Case(TestCase):
            def test_named(self):
                self.assertEqual(self._current_test_name(), "test_named")
                self.assertEqual(self._current_test_name, "test_named")

        self.assertTrue(_run_case(Case, "test_named").wasSuccessful())

    def test_assert_expected_raises_reads_and_accepts_the_record(self) -> None:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "expect", "Case.test_x.expect")

            class Case(TestCase):
                def test_x(self):
                    self.assertExpectedRaises(ValueError, int, "x")

            with mock.patch("harness.single_process.testcase._expect_file",
                            return_value=(path, "Case.test_x")):
                missing = _run_case(Case, "test_x")
                with mock.patch("expecttest.ACCEPT", True):
                    self.assertTrue(_run_case(Case, "test_x").wasSuccessful())
                recorded = _run_case(Case, "test_x")
            self.assertIn("No expect file exists", missing.errors[0][1])
            self.assertTrue(recorded.wasSuccessful())
            with open(path) as f:
                self.assertEqual(f.read(), "invalid literal for int() with base 10: 'x'")

    def test_gen_sparse_tensor(self) -> None:
        case = TestCase()
        tensor, indices, values = case.genSparseTensor([3, 4, 2], 2, 6, False, "cpu", torch.float32)
        self.assertTrue(tensor.is_coalesced())
        self.assertEqual(tensor.shape, (3, 4, 2))
        self.assertTrue(torch.equal(indices, tensor.indices()))
        self.assertTrue(torch.equal(values, tensor.values()))
        loose, indices, values = case.genSparseTensor([3, 4], 2, 6, True, "cpu", torch.float64)
        self.assertFalse(loose.is_coalesced())
        self.assertEqual(indices.shape, (2, 6))
        rebuilt = torch.sparse_coo_tensor(indices, values, (3, 4))
        self.assertTrue(torch.equal(loose.to_dense(), rebuilt.to_dense()))
        with self.assertRaisesRegex(AssertionError, "invalid arguments"):
            case.genSparseTensor([0, 4], 2, 3, False, "cpu", torch.float32)


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
