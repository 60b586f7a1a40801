"""harness/single_process/pytest_marks.py: pytest's skip, skipif and xfail marks on unittest tests,
honoured by the harness's runners as pytest would (fast: in-process unittest runs)."""

from __future__ import annotations

import sys
import types
import unittest
from typing import Any, List

import pytest

from harness.outcome.rank_record import Event, RankRecord
from harness.single_process.pytest_marks import honour_pytest_marks, verdict
from tests.fixtures.events import rank_failure
from tests.test_launcher import faked


class Marked(unittest.TestCase):
    __test__ = False  # run here by the harness's rules, not collected by pytest

    @pytest.mark.skip("Flaky on CI")
    def test_skip(self) -> None:
        raise AssertionError("ran")

    @pytest.mark.skip(reason="by keyword")
    def test_skip_keyword(self) -> None:
        raise AssertionError("ran")

    @pytest.mark.skipif(True, reason="needs CUDA")
    def test_skipif(self) -> None:
        raise AssertionError("ran")

    @pytest.mark.skipif("sys.platform.startswith('linux') or True")
    def test_skipif_string(self) -> None:
        raise AssertionError("ran")

    @pytest.mark.skipif(False, reason="never")
    def test_skipif_false(self) -> None:
        pass

    @pytest.mark.xfail(reason="known bug")
    def test_xfail(self) -> None:
        raise AssertionError("known bug")

    @pytest.mark.xfail(False, reason="not here")
    def test_xfail_false(self) -> None:
        pass

    @pytest.mark.xfail(run=False, reason="hangs")
    def test_xfail_not_run(self) -> None:
        raise AssertionError("ran")

    def test_unmarked(self) -> None:
        pass


@pytest.mark.skip(reason="the whole class")
class MarkedClass(unittest.TestCase):
    __test__ = False

    def test_a(self) -> None:
        raise AssertionError("ran")


def run(tests: List[unittest.TestCase]) -> unittest.TestResult:
    result = unittest.TestResult()
    unittest.TestSuite(honour_pytest_marks(tests)).run(result)
    return result


def test_each_mark_gives_pytests_verdict() -> None:
    names = [n for n in dir(Marked) if n.startswith("test_")]
    got = {name: verdict(Marked(name)) for name in names}
    assert got == {
        "test_skip": ("Flaky on CI", None),
        "test_skip_keyword": ("by keyword", None),
        "test_skipif": ("needs CUDA", None),
        "test_skipif_string": ("condition: sys.platform.startswith('linux') or True", None),
        "test_skipif_false": (None, None),
        "test_xfail": (None, "known bug"),
        "test_xfail_false": (None, None),
        "test_xfail_not_run": ("[NOTRUN] hangs", None),
        "test_unmarked": (None, None),
    }


def test_a_run_skips_and_expects_failures_as_marked() -> None:
    names = [n for n in dir(Marked) if n.startswith("test_")]
    result = run([Marked(name) for name in names] + [MarkedClass("test_a")])
    assert (result.failures, result.errors) == ([], [])
    assert {test._testMethodName: why for test, why in result.skipped} == {
        "test_skip": "Flaky on CI", "test_skip_keyword": "by keyword",
        "test_skipif": "needs CUDA",
        "test_skipif_string": "condition: sys.platform.startswith('linux') or True",
        "test_xfail_not_run": "[NOTRUN] hangs", "test_a": "the whole class",
    }
    assert [test._testMethodName for test, _ in result.expectedFailures] == ["test_xfail"]


def test_module_marks_apply_and_marks_are_applied_once() -> None:
    module = types.ModuleType("harness_marks_probe")
    module.pytestmark = [pytest.mark.skip(reason="the whole module")]  # type: ignore[attr-defined]
    cls = type("Probe", (unittest.TestCase,), {"test_x": lambda self: None,
                                                "__module__": module.__name__})
    sys.modules[module.__name__] = module
    try:
        test = cls("test_x")
        honour_pytest_marks([test])
        honour_pytest_marks([test])
        assert run([test]).skipped[0][1] == "the whole module"
    finally:
        del sys.modules[module.__name__]


class ReportTaker(unittest.TestResult):
    """A result that takes reports (as the harness's runners' do)."""

    def __init__(self) -> None:
        super().__init__()
        self.reports: List[Any] = []

    def add_report(self, test: Any, report: Any) -> None:
        self.reports.append(report)


def test_a_multi_rank_test_expected_to_fail_is_no_failure_of_the_run() -> None:
    failing = [RankRecord(0, events=[Event("done")], exitcode=0),
               RankRecord(1, events=[rank_failure("Traceback\nAssertionError: x"),
                                     Event("done")], exitcode=0)]
    cls = faked(records=failing)
    cls.test_body.pytestmark = [pytest.mark.xfail(reason="rank 1 fails")]  # type: ignore[attr-defined]
    result = ReportTaker()
    unittest.TestSuite(honour_pytest_marks([cls("test_body")])).run(result)
    assert (result.failures, result.errors, result.reports) == ([], [], [])
    assert len(result.expectedFailures) == 1
