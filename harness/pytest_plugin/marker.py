"""`@pytest.mark.ranks(...)`: what a marked pytest function asks for, checked once, at collection.

`read_ranks` turns the marker into a `Ranks` record or raises `MarkerError` with one line
naming what is wrong (a world size below 1, an unknown mode or device, an unknown keyword);
`placement` decides where one world size of it runs: the device type and backend, or why it
cannot run here (a skip). Both are pure: the device count comes in as an argument, so the
rules are tested without accelerators.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

from harness import settings
from harness.process.leaks import CHECKS as LEAK_CHECKS
from harness.process.leaks import OPT_IN_CHECKS as OPT_IN_LEAK_CHECKS
from harness.requirements.decorators import cpu_stands_in_for

MODES = ("fresh", "shared", "threads")
DEVICES = ("auto", "cpu", "cuda")
OPTIONS = ("mode", "device", "backend", "allow_cpu", "init", "timeout", "skip_leak_checks")
USAGE = "@pytest.mark.ranks(N) or @pytest.mark.ranks([N, ...])"


class MarkerError(ValueError):
    """A `ranks` marker (or DistributedTest's `world_size`) the harness cannot run."""


@dataclass(frozen=True)
class Ranks:
    """One marked test's request: its world sizes and how its ranks run."""

    sizes: Tuple[int, ...]
    listed: bool = False  # given as a list: each size adds `ranksN` to the test's id
    mode: str = "fresh"
    device: str = "auto"
    backend: Optional[str] = None
    allow_cpu: bool = False
    init: bool = True
    timeout: Optional[float] = None
    skip_leak_checks: Tuple[str, ...] = ()  # mode="shared": the leak checks this test waives


def world_sizes(value: Any, what: str = "@pytest.mark.ranks") -> Tuple[Tuple[int, ...], bool]:
    """The sizes `value` names (an int, or a list or tuple of them) and whether it was a list."""
    listed = isinstance(value, (list, tuple))
    sizes = tuple(value) if listed else (value,)
    if not sizes:
        raise MarkerError(f"{what}: no world size given; use {USAGE}")
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int):
            raise MarkerError(f"{what}: world size {size!r} is not an int; use {USAGE}")
        if size < 1:
            raise MarkerError(f"{what}: world size {size} is below 1; a test needs a rank")
    if len(set(sizes)) != len(sizes):
        raise MarkerError(f"{what}: world size listed twice in {list(sizes)}")
    return sizes, listed


def read_ranks(args: Tuple[Any, ...], kwargs: dict) -> Ranks:
    """The `Ranks` a marker's arguments ask for (MarkerError naming what is wrong)."""
    if len(args) != 1:
        raise MarkerError(f"@pytest.mark.ranks takes one world size or a list: {USAGE}")
    unknown = sorted(set(kwargs) - set(OPTIONS))
    if unknown:
        raise MarkerError(
            f"@pytest.mark.ranks: unknown option {unknown[0]!r} (known: {', '.join(OPTIONS)})"
        )
    sizes, listed = world_sizes(args[0])
    if isinstance(kwargs.get("skip_leak_checks"), str):
        kwargs = {**kwargs, "skip_leak_checks": (kwargs["skip_leak_checks"],)}
    ranks = Ranks(sizes, listed, **kwargs)
    check(ranks)
    return ranks


def check(ranks: Ranks, what: str = "@pytest.mark.ranks") -> None:
    """MarkerError unless every option of `ranks` has a value the harness can run."""
    if ranks.mode not in MODES:
        raise MarkerError(f"{what}: unknown mode {ranks.mode!r} (known: {', '.join(MODES)})")
    if ranks.device not in DEVICES:
        raise MarkerError(
            f"{what}: unknown device {ranks.device!r} (known: {', '.join(DEVICES)})"
        )
    if ranks.backend is not None and not isinstance(ranks.backend, str):
        raise MarkerError(f"{what}: backend must be a name such as 'gloo', got {ranks.backend!r}")
    if ranks.timeout is not None:
        try:
            settings.positive_seconds(ranks.timeout, "timeout")
        except settings.HarnessConfigError as error:
            raise MarkerError(f"{what}: {error}") from None
    for name in ("allow_cpu", "init"):
        if not isinstance(getattr(ranks, name), bool):
            raise MarkerError(f"{what}: {name} must be True or False")
    known = LEAK_CHECKS + OPT_IN_LEAK_CHECKS
    skipped = ranks.skip_leak_checks
    if not isinstance(skipped, (tuple, list)) or not all(isinstance(n, str) for n in skipped):
        raise MarkerError(
            f"{what}: skip_leak_checks must be a tuple of check names such as ('environ',), "
            f"got {skipped!r}"
        )
    unknown = [name for name in skipped if name not in known]
    if unknown:
        raise MarkerError(
            f"{what}: skip_leak_checks: unknown check {unknown[0]!r} (known: {', '.join(known)})"
        )


@dataclass(frozen=True)
class Placement:
    """Where one world size of a marked test runs: a device type ("cpu", "cuda") and its
    backend; or `skip`, why it cannot run on this machine."""

    device_type: str = "cpu"
    backend: str = "gloo"
    skip: Optional[str] = None


def placement(
    ranks: Ranks, world_size: int, accelerators: int, allow_cpu_env: bool = False,
    accelerator: str = "cuda", accelerator_backend: str = "nccl",
) -> Placement:
    """Where `world_size` ranks of `ranks` run, given `accelerators` devices of type
    `accelerator` usable here (0 when HARNESS_DEVICE=cpu forces CPU).

    auto: one accelerator per rank where enough exist, else the CPU. cuda: the accelerator,
    else a skip naming what is missing, unless the CPU stands in: the requirement decorators'
    rule (harness/requirements/decorators.py `cpu_stands_in_for`), on a machine without any
    accelerator when allow_cpu (or HARNESS_ALLOW_CPU=1) allows it. cpu: the CPU. Threads
    always run on the CPU with the threaded backend's group (the backend named is then what
    the ranks' tensors would use elsewhere).
    """
    wanted = ranks.device
    if wanted == "cuda" and accelerators < world_size and not cpu_stands_in_for(
        accelerators, ranks.allow_cpu or allow_cpu_env
    ):
        hint = " (allow_cpu=True or HARNESS_ALLOW_CPU=1 runs it on CPU with gloo)"
        return Placement(skip=(
            f"needs {world_size} CUDA device(s), {accelerators} available here"
            + (hint if accelerators == 0 else "")
        ))
    on_accelerator = wanted != "cpu" and ranks.mode != "threads" and accelerators >= world_size
    device_type = accelerator if on_accelerator else "cpu"
    default_backend = accelerator_backend if on_accelerator else "gloo"
    return Placement(device_type, ranks.backend or default_backend)


def size_id(world_size: int) -> str:
    """The id part a listed world size adds: `ranks2`."""
    return f"ranks{world_size}"
