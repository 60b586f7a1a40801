"""harness/compat/comparison.py: assert_close's DTensor check waits for DTensor to exist."""

from __future__ import annotations

import sys
import unittest
from typing import Any, List, Tuple
from unittest import mock

import torch
from torch.testing import _comparison

import harness.compat.comparison as compat_comparison

DTENSOR_MODULE = "torch.distributed.tensor"


def _without_dtensor_module() -> Any:
    """sys.modules as in a process that never imported torch.distributed.tensor (restored
    on exit)."""
    patch = mock.patch.dict(sys.modules)
    patch.start()
    for name in [n for n in sys.modules if n.split(".")[:3] == DTENSOR_MODULE.split(".")]:
        del sys.modules[name]
    return patch


class LazyDTensorCheckTest(unittest.TestCase):
    def test_installed_in_torchs_comparison(self) -> None:
        self.assertTrue(getattr(_comparison._unwrap_dtensor_for_comparison, "harness_lazy", False))
        self.assertFalse(compat_comparison.assert_close_imports_dtensor())

    def test_a_torch_without_that_check_is_assumed_to_import_dtensor(self) -> None:
        """(then the forkserver preloads it, as before the check was replaced)"""
        with mock.patch.object(_comparison, "_unwrap_dtensor_for_comparison", lambda a, e: (a, e)):
            self.assertTrue(compat_comparison.assert_close_imports_dtensor())
        with mock.patch.object(_comparison, "_unwrap_dtensor_for_comparison", None, create=True):
            self.assertTrue(compat_comparison.assert_close_imports_dtensor())

    def test_assert_close_does_not_import_dtensor(self) -> None:
        patch = _without_dtensor_module()
        self.addCleanup(patch.stop)
        torch.testing.assert_close(torch.ones(2), torch.ones(2))
        self.assertNotIn(DTENSOR_MODULE, sys.modules)

    def test_torchs_check_runs_once_dtensor_is_imported(self) -> None:
        calls: List[Tuple[Any, Any]] = []

        def check(actual: Any, expected: Any) -> Tuple[Any, Any]:
            calls.append((actual, expected))
            return "a", "e"

        unwrap = compat_comparison._unwrap_dtensors_once_loaded(check)
        with mock.patch.dict(sys.modules, {DTENSOR_MODULE: mock.Mock()}):
            self.assertEqual(unwrap(1, 2), ("a", "e"))
        self.assertEqual(calls, [(1, 2)])
        patch = _without_dtensor_module()
        self.addCleanup(patch.stop)
        self.assertEqual(unwrap(1, 2), (1, 2))
        self.assertEqual(calls, [(1, 2)])


if __name__ == "__main__":
    unittest.main()
