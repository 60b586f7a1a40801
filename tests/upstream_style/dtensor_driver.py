"""Run an upstream-style test module and write each test's outcome as JSON.

`python dtensor_driver.py OUT.json MODULE...` imports each MODULE (from sys.path), runs
every unittest class defined at its top level (including classes made by
create_local_tensor_test_class, whose `__module__` is the module's), and writes
{"<module>.<ClassName>.<test>": {"id": test.id(), "outcome": "pass"|"fail"|"error"|"skip"}}.
Keys use the name the class is bound to in the module, so a `*WithLocalTensor` class
(whose unittest id reads as its original class's, as upstream makes it) stays apart.
The driver knows nothing of either harness: the differential test runs it once with the
module importing `harness` and once with it importing torch.testing._internal.

`rewrite_for_upstream(source)` turns an upstream-style file written against `harness`
into the same file written against upstream's private test modules.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import unittest
from typing import Any, Dict, Tuple

UPSTREAM_MODULE = {
    "common_dtensor": "torch.testing._internal.distributed._tensor.common_dtensor",
    "common_utils": "torch.testing._internal.common_utils",
    "common_distributed": "torch.testing._internal.common_distributed",
    "common_device_type": "torch.testing._internal.common_device_type",
    "funcol": "torch.distributed._functional_collectives",
}

UPSTREAM_HOME = {
    **dict.fromkeys(
        [
            "DTensorConverter", "DTensorOpTestBase", "DTensorTestBase", "LocalDTensorOpTestBase",
            "LocalDTensorTestBase", "MLPModule", "MLPStacked", "ModelArgs", "NUM_DEVICES",
            "RMSNormPython", "Transformer", "create_local_tensor_test_class", "map_local_for_rank",
            "map_local_tensor_for_rank", "reduce_local_int", "skip_unless_torch_gpu",
            "with_comms",
        ],
        "common_dtensor",
    ),
    **dict.fromkeys(
        ["TestCase", "instantiate_parametrized_tests", "parametrize", "run_tests"],
        "common_utils",
    ),
    **dict.fromkeys(
        ["MultiProcessTestCase", "MultiThreadedTestCase", "run_subtests", "skip_if_lt_x_gpu"],
        "common_distributed",
    ),
    "AsyncCollectiveTensor": "funcol",
    "instantiate_device_type_tests": "common_device_type",
}

_IMPORT = re.compile(r"^from (harness(?:\.compat\.local_tensor)?) import (\([^)]*\)|[^\n]*)$", re.M)


def rewrite_for_upstream(source: str) -> str:
    """Point every `from harness import ...` line of `source` at upstream's module for each name."""

    def replace(match: re.Match) -> str:
        names = [n.strip() for n in match.group(2).strip("()").replace("\n", " ").split(",")]
        by_module: Dict[str, list] = {}
        for name in filter(None, names):
            if name not in UPSTREAM_HOME:
                raise KeyError(f"no upstream home known for {name!r}: add it to UPSTREAM_HOME")
            by_module.setdefault(UPSTREAM_MODULE[UPSTREAM_HOME[name]], []).append(name)
        return "\n".join(
            f"from {module} import {', '.join(sorted(found))}"
            for module, found in sorted(by_module.items())
        )

    rewritten = _IMPORT.sub(replace, source)
    if re.search(r"^\s*(from|import) harness\b", rewritten, re.M):
        raise ValueError("an import of harness is left that rewrite_for_upstream cannot map")
    return rewritten


class _Outcomes(unittest.TestResult):
    """Outcome per test; a failing or erroring subtest fails its test."""

    def __init__(self, keys: Dict[int, Tuple[str, str]]) -> None:
        super().__init__()
        self.keys = keys
        self.outcomes: Dict[str, Dict[str, str]] = {}

    def _set(self, test: Any, outcome: str) -> None:
        key = self.keys.get(id(test))
        if key is None:
            return
        name = f"{key[0]}.{key[1]}"
        previous = self.outcomes.get(name, {}).get("outcome")
        if previous in ("fail", "error") and outcome in ("pass", "skip"):
            return
        self.outcomes[name] = {"id": test.id(), "outcome": outcome}

    def addSuccess(self, test: Any) -> None:  # noqa: N802 - unittest's naming
        self._set(test, "pass")

    def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        super().addFailure(test, err)
        self._set(test, "fail")

    def addError(self, test: Any, err: Any) -> None:  # noqa: N802
        super().addError(test, err)
        self._set(test, "error")

    def addSkip(self, test: Any, reason: str) -> None:  # noqa: N802
        self._set(test, "skip")

    def addExpectedFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        self._set(test, "pass")

    def addUnexpectedSuccess(self, test: Any) -> None:  # noqa: N802
        self._set(test, "fail")

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802
        if err is not None:
            super().addSubTest(test, subtest, err)
            self._set(test, "fail" if issubclass(err[0], test.failureException) else "error")


def run_module(module_name: str) -> Dict[str, Dict[str, str]]:
    """Run every test class bound at the top level of `module_name`; outcomes by key."""
    module = importlib.import_module(module_name)
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    suite._cleanup = False  # keep every test alive: outcomes are keyed by id(test)
    keys: Dict[int, Tuple[str, str]] = {}
    for attr, value in vars(module).items():
        if not (isinstance(value, type) and issubclass(value, unittest.TestCase)):
            continue
        if value.__module__ != module.__name__:
            continue  # an imported base class
        for test in loader.loadTestsFromTestCase(value):
            keys[id(test)] = (attr, test._testMethodName)
            suite.addTest(test)
    result = _Outcomes(keys)
    suite.run(result)
    for test, trace in result.failures + result.errors:
        print(f"--- {test.id()}\n{trace}", file=sys.stderr)
    return result.outcomes


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit("usage: dtensor_driver.py OUT.json MODULE...")
    outcomes = {}
    for name in sys.argv[2:]:
        outcomes.update({f"{name}.{key}": value for key, value in run_module(name).items()})
    with open(sys.argv[1], "w") as out:
        json.dump(outcomes, out, indent=1, sort_keys=True)
