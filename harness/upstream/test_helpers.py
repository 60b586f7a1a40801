"""Small helpers of upstream's `common_utils` that test bodies call: timing a device's
sleep kernel, the `load_tests` hook, a leak check for tensor reference cycles, the
swap-tensors switch, and the `NoTest` marker base.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import statistics
import time
import unittest
import warnings
from typing import Any, Callable, Iterator, List, Optional

import torch

__all__ = ["NoTest", "check_leaked_tensors", "get_cycles_per_ms", "load_tests",
           "wrapSwapTensorsTest"]

_MEASURED_CYCLES = 1_000_000
_MEASUREMENTS = 10


class NoTest:
    """A base whose subclasses pytest does not collect as tests."""

    __test__ = False


def _cpu_spin(cycles: int) -> None:
    for _ in range(cycles):
        pass


def _measure_once(device: str) -> float:
    if device == "cpu":
        start = time.perf_counter()
        _cpu_spin(_MEASURED_CYCLES)
        elapsed_ms = (time.perf_counter() - start) * 1000
        return _MEASURED_CYCLES / elapsed_ms if elapsed_ms > 0 else float(_MEASURED_CYCLES)
    from harness.compat.device_sleep import device_sleep

    module = torch.get_device_module(device)
    start_event = module.Event(enable_timing=True)
    end_event = module.Event(enable_timing=True)
    start_event.record()
    device_sleep(device, _MEASURED_CYCLES)
    end_event.record()
    end_event.synchronize()
    return _MEASURED_CYCLES / start_event.elapsed_time(end_event)


@functools.cache
def get_cycles_per_ms(device: str = "cuda") -> float:
    """Cycles of the device's sleep kernel (a Python spin loop on "cpu") per millisecond:
    the mean of ten measurements without the two lowest and two highest (measured once)."""
    values = sorted(_measure_once(device) for _ in range(_MEASUREMENTS))
    return statistics.mean(values[2:_MEASUREMENTS - 2])


def load_tests(loader: unittest.TestLoader, tests: unittest.TestSuite,
               pattern: Optional[str]) -> unittest.TestSuite:
    """The unittest `load_tests` hook upstream files import: the module's tests, without
    the empty per-class suites. (Upstream also checks each class is defined in the running
    script; the harness's runners load files themselves, so that check does not apply.)"""
    suite = unittest.TestSuite()
    for group in tests:
        if getattr(group, "_tests", True):
            suite.addTest(group)
    return suite


@contextlib.contextmanager
def check_leaked_tensors(limit: int = 1, matched_type: type = torch.Tensor) -> Iterator[List[Any]]:
    """Collect, in the yielded list, the `matched_type` objects that only reference cycles
    created inside the block keep alive, and warn when there are any."""
    try:
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        garbage: List[Any] = []
        yield garbage
        gc.collect()
        garbage.extend(obj for obj in gc.garbage if isinstance(obj, matched_type))
        if garbage:
            warnings.warn(f"{len(garbage)} tensors were found in the garbage. Did you "
                          "introduce a reference cycle?", stacklevel=2)
            try:
                import objgraph  # type: ignore[import-not-found]
            except ImportError:
                warnings.warn("`pip install objgraph` to enable memory leak debugging",
                              stacklevel=2)
            else:
                warnings.warn(f"Dumping first {limit} objgraphs of leaked {matched_type}s "
                              "rendered to png", stacklevel=2)
                for obj in garbage[:limit]:
                    objgraph.show_backrefs([obj], max_depth=10)
    finally:
        gc.set_debug(0)


def wrapSwapTensorsTest(swap: Optional[bool] = None) -> Callable[[Callable], Callable]:  # noqa: N802
    """Run the test with `torch.__future__`'s swap-module-params-on-conversion set to `swap`
    (unchanged when None), restored afterwards."""

    def decorator(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            saved = torch.__future__.get_swap_module_params_on_conversion()
            if swap is not None:
                torch.__future__.set_swap_module_params_on_conversion(swap)
            try:
                fn(*args, **kwargs)
            finally:
                torch.__future__.set_swap_module_params_on_conversion(saved)

        return wrapper

    return decorator
