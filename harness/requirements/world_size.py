"""How many ranks a multi-rank test runs with: the one rule, for every base and launcher.

A class's own `world_size` (an int or a property, often computed from a device count), else
the base's default (`BaseWorldSize`: HARNESS_WORLD_SIZE, else upstream's default for that
base, harness/settings.py `base_world_size`). When the CPU stands in for the accelerators a
test's requirements ask for (`skip_if_lt_x_gpu(n)` and the like, on a machine without any,
under HARNESS_ALLOW_CPU=1 or the test's own `allow_cpu=True`), the test runs with
max(that number, n) ranks: written for n GPUs, it was never meant to run with fewer ranks,
and a world size read from a device count (0 or 1 here) says nothing about the test.

The supervisor decides the number once (`world_size_of`) and fixes it on its instance; each
rank's instance is fixed to its RankContext's. `self.world_size` then reads that number
everywhere, also where the class computes it from a device count: every base's
`world_size`, and any a subclass or mixin defines, is wrapped by `FixedWorldSize`
(`wrap_world_size`, from RankedTestCase.__init_subclass__).
"""

from __future__ import annotations

import unittest
from typing import Any, Optional

from harness import settings
from harness.requirements.decorators import cpu_gate


class BaseWorldSize:
    """A base's `world_size` until its class sets one, read when used (at class level too, as
    upstream's class attributes are): `settings.base_world_size(per_device, launched)`."""

    def __init__(self, per_device: bool = False, launched: bool = False) -> None:
        self.per_device, self.launched = per_device, launched

    def __get__(self, obj: Any, owner: Any = None) -> int:
        return settings.base_world_size(self.per_device, self.launched)


class FixedWorldSize:
    """A class's declared `world_size`, unless the instance's run fixed the number.

    Assigning `self.world_size` fixes it too (upstream's shared-process ranks assign it).
    """

    def __init__(self, declared: Any) -> None:
        self.declared = declared

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is not None:
            fixed = fixed_world_size(obj)
            if fixed is not None:
                return fixed
        declared = self.declared
        if hasattr(declared, "__get__"):
            return declared.__get__(obj, owner)
        return declared

    def __set__(self, obj: Any, value: Any) -> None:
        fix_world_size(obj, value)


_FIXED = "_harness_world_size"


def fix_world_size(case: Any, world_size: Any) -> None:
    """Make `case.world_size` read `world_size` from now on."""
    vars(case)[_FIXED] = world_size


def fixed_world_size(case: Any) -> Optional[int]:
    """The number fixed on `case`, or None while its run has not decided it."""
    return vars(case).get(_FIXED)


def wrap_world_size(cls: type) -> None:
    """Wrap the `world_size` `cls` resolves to (its own, a mixin's or a base's) in
    FixedWorldSize, unless it already is."""
    for klass in cls.__mro__:
        if "world_size" in vars(klass):
            declared = vars(klass)["world_size"]
            if not isinstance(declared, FixedWorldSize):
                cls.world_size = FixedWorldSize(declared)  # type: ignore[attr-defined]
            return


def world_size_of(case: unittest.TestCase) -> Any:
    """THE number of ranks `case` runs with: its class's world size, raised to the accelerator
    count its requirements ask for when the CPU stands in for them here. A value that is not
    a positive int is returned as is (the caller reports it)."""
    fixed = fixed_world_size(case)
    if fixed is not None:
        return fixed
    declared = case.world_size
    gate = cpu_gate(case)
    if gate and isinstance(declared, int) and not isinstance(declared, bool) and declared >= 0:
        return max(declared, gate)
    return declared
