"""`DistributedTest`: the class shape DeepSpeed's tests use (and the projects that copied it).

```python
class TestAllReduce(DistributedTest):
    world_size = 2                      # or [1, 2]: each size in turn, within the one test

    def test_sum(self, tmp_path):       # runs in every rank; fixtures as in any pytest test
        t = torch.ones(1) * dist.get_rank()
        dist.all_reduce(t)
```

Here it is a marked test in disguise: the plugin reads the class (and a method's
`@pytest.mark.world_size(N)`) as a `ranks` marker (`ranks_of`), so the launchers, fixtures
and reports are those of every marked test. `reuse_dist_env = True` is the shared mode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional, Union

import pytest

from harness.pytest_plugin.marker import MarkerError, Ranks, check, world_sizes


class DistributedTest:
    """Methods of a subclass run once in each of `world_size` ranks, the default group
    initialised (`init_distributed`), on the `backend` of their device."""

    world_size: Union[int, List[int]] = 2
    reuse_dist_env: bool = False  # True: the ranks are shared between the class's tests
    init_distributed: bool = True
    backend: Optional[str] = None  # None: nccl on accelerators, gloo on CPU
    device: str = "auto"  # "auto", "cpu" or "cuda", as @pytest.mark.ranks's
    allow_cpu: bool = False
    exec_timeout: Optional[float] = None  # seconds; None: pytest-timeout's, else the default


def is_distributed_test(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, DistributedTest)


def ranks_of(cls: type, world_size_mark: Any) -> Ranks:
    """The `Ranks` a DistributedTest class (and a method's `world_size` marker) asks for."""
    what = f"{cls.__name__}.world_size"
    declared: Any = cls.world_size  # type: ignore[attr-defined]
    if world_size_mark is not None:
        what = "@pytest.mark.world_size"
        if len(world_size_mark.args) != 1:
            raise MarkerError("@pytest.mark.world_size takes one world size or a list")
        declared = world_size_mark.args[0]
    sizes, _ = world_sizes(declared, what)
    ranks = Ranks(
        sizes, listed=False,
        mode="shared" if getattr(cls, "reuse_dist_env", False) else "fresh",
        device=getattr(cls, "device", "auto"), backend=getattr(cls, "backend", None),
        allow_cpu=getattr(cls, "allow_cpu", False),
        init=getattr(cls, "init_distributed", True), timeout=getattr(cls, "exec_timeout", None),
        skip_leak_checks=_names(getattr(cls, "skip_leak_checks", ())),
    )
    check(ranks, cls.__name__)
    return ranks


def _names(value: Any) -> Any:
    """A class attribute of one name or several, as the marker takes it (a tuple)."""
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, (list, set, frozenset)) else value


@pytest.fixture(scope="class")
def class_tmpdir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder the tests of one class share (DeepSpeed's fixture of that name)."""
    name = request.cls.__name__ if request.cls is not None else "class"
    return tmp_path_factory.mktemp(name[:30])
