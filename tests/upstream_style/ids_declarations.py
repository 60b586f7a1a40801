"""The same test declarations under upstream's harness and under this one, for id comparison.

`declare(kind)` builds every class below with kind "upstream" (torch.testing._internal)
or "harness", runs each generated test, and returns
{"<scenario>.<Class>.<test>": {"outcome": ..., "kwargs": {name: repr(value)}}} plus
{"<scenario>": {"error": ...}} for declarations that must be rejected. The differential
tests (tests/test_parametrize.py, tests/test_device_type.py) compare the two results;
`python -m tests.upstream_style.ids_declarations upstream` prints upstream's as JSON, in a
child process because importing upstream's testing modules changes torch's global flags.
"""

from __future__ import annotations

import enum
import functools
import json
import subprocess
import sys
import types
import unittest
from typing import Any, Callable, Dict, List

import torch

from harness import settings
from tests.fixtures import REPO, child_env

RECORDED: List[Dict[str, Any]] = []


class Strategy(enum.Enum):
    FULL_SHARD = 1
    NO_SHARD = 3


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


def api(kind: str) -> types.SimpleNamespace:
    """The names a test file imports, from upstream's private modules or from harness."""
    if kind == "upstream":
        from torch.testing._internal import common_device_type as device_module
        from torch.testing._internal import common_utils as utils_module
    elif kind == "harness":
        import harness as device_module
        import harness as utils_module
    else:
        raise ValueError(f"kind must be 'upstream' or 'harness', got {kind!r}")
    names = types.SimpleNamespace()
    for name in ("parametrize", "subtest", "instantiate_parametrized_tests"):
        setattr(names, name, getattr(utils_module, name))
    for name in ("instantiate_device_type_tests", "dtypes", "dtypesIfCPU", "onlyCPU",
                 "onlyCUDA", "deviceCountAtLeast"):
        setattr(names, name, getattr(device_module, name))
    return names


def _record(case: unittest.TestCase, **kwargs: Any) -> None:
    RECORDED.append({"test": f"{type(case).__name__}.{case._testMethodName}",
                     "kwargs": {k: repr(v) for k, v in sorted(kwargs.items())}})


def _tagged(fn: Callable) -> Callable:
    """A subtest decorator whose effect shows in the recorded kwargs."""

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(self, *args, **{**kwargs, "tag": "decorated"})

    return wrapper


def parametrize_scenarios(a: types.SimpleNamespace) -> Dict[str, Callable[[], Dict[str, type]]]:
    """Scenarios of instantiate_parametrized_tests, each returning its classes."""
    p, sub = a.parametrize, a.subtest

    def values_of_every_kind() -> Dict[str, type]:
        class Kinds(unittest.TestCase):
            @p("x", [0, -3, 1.5, -1e-05, 2.0, "plain", "a.b c", True, False, None,
                     Strategy.NO_SHARD, Level.HIGH, torch.float32, torch.bfloat16,
                     torch.device("cpu"), (1, 2), [3], "", b"raw"])
            def test_value(self, x):
                _record(self, x=x)

            @p("use_index", [True, False])
            def test_flag(self, use_index):
                _record(self, use_index=use_index)

        return {"Kinds": a.instantiate_parametrized_tests(Kinds)}

    def comma_and_stacked() -> Dict[str, type]:
        class Shapes(unittest.TestCase):
            @p("a,b", [(1, "x"), (2, None), (Strategy.FULL_SHARD, 0.5)])
            def test_comma(self, a, b):
                _record(self, a=a, b=b)

            @p("a, b", [[1, 2], (3, 4)])
            def test_comma_spaces(self, a, b):
                _record(self, a=a, b=b)

            @p("top", [1, 2])
            @p("middle", [Strategy.FULL_SHARD, Strategy.NO_SHARD])
            @p("bottom", ["u", "v"])
            def test_stacked(self, top, middle, bottom):
                _record(self, top=top, middle=middle, bottom=bottom)

            @p("x,y", [(1, 2), (3, 4)])
            @p("z", [None, 5])
            def test_comma_stacked(self, x, y, z):
                _record(self, x=x, y=y, z=z)

        return {"Shapes": a.instantiate_parametrized_tests(Shapes)}

    def names_and_subtests() -> Dict[str, type]:
        class Named(unittest.TestCase):
            @p("x", [1, 2], name_fn=lambda x: f"custom{x * 10}")
            def test_name_fn(self, x):
                _record(self, x=x)

            @p("x,y", [(1, Strategy.FULL_SHARD), (2, None)],
               name_fn=lambda x, y: f"x{x}_{getattr(y, 'name', 'none')}")
            def test_comma_name_fn(self, x, y):
                _record(self, x=x, y=y)

            @p("x", [sub(1, name="one"), sub(2), 3, sub(None, name="")])
            def test_subtest(self, x):
                _record(self, x=x)

            @p("x,y", [sub((1, 2), name="pair"), sub((3, Strategy.NO_SHARD))])
            def test_comma_subtest(self, x, y):
                _record(self, x=x, y=y)

            @p("x", [sub(1, decorators=[unittest.skip("not this one")]), 2])
            def test_subtest_skip(self, x):
                _record(self, x=x)

            @p("x", [sub(1, name="tagged", decorators=[_tagged]), 2])
            def test_subtest_decorated(self, x, tag="plain"):
                _record(self, x=x, tag=tag)

            @p("x", [sub(1, name="picked"), 2], name_fn=lambda x: f"fn{x}")
            def test_subtest_and_name_fn(self, x):
                _record(self, x=x)

            @p("a", [1, 2])
            @p("b", [sub("u", name="first"), sub("v", decorators=[unittest.skip("no v")])])
            def test_stacked_subtests(self, a, b):
                _record(self, a=a, b=b)

        return {"Named": a.instantiate_parametrized_tests(Named)}

    def duplicate_names() -> Dict[str, type]:
        class Duplicate(unittest.TestCase):
            @p("x", [1, 2], name_fn=lambda x: "same")
            def test_dup(self, x):
                _record(self, x=x)

        return {"Duplicate": a.instantiate_parametrized_tests(Duplicate)}

    return {
        "values_of_every_kind": values_of_every_kind,
        "comma_and_stacked": comma_and_stacked,
        "names_and_subtests": names_and_subtests,
        "duplicate_names": duplicate_names,
    }


def device_type_scenarios(a: types.SimpleNamespace) -> Dict[str, Callable[[], Dict[str, type]]]:
    """Scenarios of instantiate_device_type_tests, each returning the classes in its scope."""
    p, sub = a.parametrize, a.subtest

    def instantiate(cls: type, **kwargs: Any) -> Dict[str, type]:
        scope: Dict[str, Any] = {cls.__name__: cls, "unrelated": 1}
        a.instantiate_device_type_tests(cls, scope, **kwargs)
        return {k: v for k, v in scope.items() if isinstance(v, type)}

    def generic() -> type:
        class TestOps(unittest.TestCase):
            helper_value = 7

            def test_plain(self, device):
                _record(self, device=device, helper=self.helper_value)

            def test_no_device(self):
                _record(self)

            @p("x", [1, 2.5, "s", None, Strategy.NO_SHARD])
            def test_param(self, device, x):
                _record(self, device=device, x=x)

            @p("x,y", [(1, 2), sub((3, 4), name="named")], name_fn=lambda x, y: f"sum{x + y}")
            def test_comma_name_fn(self, device, x, y):
                _record(self, device=device, x=x, y=y)

            @p("outer", [True, False])
            @p("inner", [Strategy.FULL_SHARD, sub(None, decorators=[unittest.skip("none")])])
            def test_stacked(self, device, outer, inner):
                _record(self, device=device, outer=outer, inner=inner)

            @a.dtypes(torch.float32, torch.int64)
            def test_dtypes(self, device, dtype):
                _record(self, device=device, dtype=dtype)

            @a.dtypes((torch.float32, torch.int64), (torch.float16, torch.bool))
            def test_dtype_tuples(self, device, dtypes):
                _record(self, device=device, dtypes=dtypes)

            @a.dtypesIfCPU(torch.float64)
            @a.dtypes(torch.float32)
            def test_dtypes_if_cpu(self, device, dtype):
                _record(self, device=device, dtype=dtype)

            @a.dtypes(torch.float32, torch.bfloat16)
            @p("x", [1, sub(2, name="two")])
            def test_dtypes_and_param(self, device, dtype, x):
                _record(self, device=device, dtype=dtype, x=x)

            @p("dtype", [torch.float16, torch.float32])
            def test_param_named_dtype(self, device, dtype):
                _record(self, device=device, dtype=dtype)

            @a.onlyCPU
            def test_only_cpu(self, device):
                _record(self, device=device)

            @a.onlyCUDA
            def test_only_cuda(self, device):
                _record(self, device=device)

            @a.deviceCountAtLeast(1)
            def test_devices(self, devices):
                _record(self, devices=devices)

            @a.deviceCountAtLeast(64)
            def test_many_devices(self, devices):
                _record(self, devices=devices)

        return TestOps

    return {
        "default": lambda: instantiate(generic()),
        "only_for_cpu_str": lambda: instantiate(generic(), only_for="cpu"),
        "only_for_cpu_tuple": lambda: instantiate(generic(), only_for=("cpu",)),
        "only_for_comma_str": lambda: instantiate(generic(), only_for="cuda,cpu"),
        "only_for_accelerators": lambda: instantiate(generic(), only_for=("cuda", "hpu")),
        "except_for_cpu": lambda: instantiate(generic(), except_for="cpu"),
        "except_for_cuda_list": lambda: instantiate(generic(), except_for=["cuda"]),
    }


def run_classes(scenario: str, classes: Dict[str, type]) -> Dict[str, Any]:
    """Run every test of the classes; key each by scenario, class and method name."""
    found: Dict[str, Any] = {}
    for class_name, cls in sorted(classes.items()):
        for name in unittest.defaultTestLoader.getTestCaseNames(cls):
            RECORDED.clear()
            result = unittest.TestResult()
            cls(name).run(result)
            if result.skipped:
                outcome = f"skip: {result.skipped[0][1]}"
            elif result.wasSuccessful():
                outcome = "pass"
            else:
                outcome = "fail: " + "".join(t for _, t in result.failures + result.errors)
            kwargs = RECORDED[0]["kwargs"] if RECORDED else None
            found[f"{scenario}.{class_name}.{name}"] = {"outcome": outcome, "kwargs": kwargs}
        found[f"{scenario}.{class_name}"] = {"class": cls.__name__}
    return found


def declare(kind: str) -> Dict[str, Any]:
    """Every scenario's generated tests (or its error) under `kind`'s harness."""
    names = api(kind)
    found: Dict[str, Any] = {}
    scenarios = {**parametrize_scenarios(names),
                 **{f"device_{k}": v for k, v in device_type_scenarios(names).items()}}
    for scenario, build in scenarios.items():
        try:
            classes = build()
        except Exception as error:  # noqa: BLE001 - the error is the result compared
            found[scenario] = {"error": " ".join(str(error).split()[:4])}
            continue
        found.update(run_classes(scenario, classes))
        found[scenario] = {"classes": sorted(classes)}
    return found


@functools.lru_cache(maxsize=1)
def upstream_declarations() -> Dict[str, Any]:
    """declare("upstream"), computed in a child process (once per test process).

    Where this harness uses no GPU (none present, or HARNESS_DEVICE=cpu), upstream is told
    the same through its own PYTORCH_TESTING_DEVICE_EXCEPT_FOR knob.
    """
    extra = ({} if settings.accelerator_count() > 0
             else {"PYTORCH_TESTING_DEVICE_EXCEPT_FOR": "cuda"})
    proc = subprocess.run(
        [sys.executable, "-m", "tests.upstream_style.ids_declarations", "upstream"],
        cwd=REPO, env=child_env(extra), capture_output=True, text=True, timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"declaring under upstream failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


if __name__ == "__main__":
    json.dump(declare(sys.argv[1]), sys.stdout, indent=1, sort_keys=True)
