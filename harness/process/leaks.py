"""What a test left behind in a shared rank process: snapshots of process state, compared.

Shared ranks (harness/process/rank.py `serve`) run every test of a class in one process, so
a test that changes process-wide state changes it for the tests after it. Each rank takes a
`Snapshot` before a test and another after it (after tearDown and cleanups); `leaks` names
every difference, and a test with any fails with `leak_message` (the class's next test then
gets fresh ranks, so the leak never reaches it).

Checks, by the name a class uses to opt out of one (`skip_leak_checks = ("environ",)`):
environ (os.environ, but for what torch sets on a feature's first use), default_dtype,
default_device, grad_mode (grad and inference mode), deterministic (torch's
deterministic-algorithms mode, cuDNN's deterministic and benchmark flags), process_groups
(groups other than the class's and device meshes' left alive), threads (non-daemon threads
still running).
`generator` (the default CPU generator's state) runs only for a class that opts in with
`check_generator_leaks = True`: most tests draw random numbers.

Pure: nothing here changes process state; taking a snapshot costs tens of microseconds.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Collection, Dict, FrozenSet, List, Optional, Tuple

import torch

from harness.compat import distributed as compat_distributed
from harness.outcome.failure import Failure
from harness.outcome.rank_record import Event, RankRecord

CHECKS: Tuple[str, ...] = (
    "environ", "default_dtype", "default_device", "grad_mode", "deterministic",
    "process_groups", "threads",
)
OPT_IN_CHECKS: Tuple[str, ...] = ("generator",)
SKIP_ATTR = "skip_leak_checks"
GENERATOR_ATTR = "check_generator_leaks"


class LeakConfigError(ValueError):
    """A class names a leak check that does not exist."""


def checks_for(cls: type) -> FrozenSet[str]:
    """The checks that run for `cls`'s tests: every default one it does not skip, plus the
    generator when it opts in. LeakConfigError for a skipped name that is no check."""
    skipped = getattr(cls, SKIP_ATTR, ())
    if isinstance(skipped, str):
        skipped = (skipped,)
    unknown = sorted(set(skipped) - set(CHECKS) - set(OPT_IN_CHECKS))
    if unknown:
        known = ", ".join(CHECKS + OPT_IN_CHECKS)
        raise LeakConfigError(
            f"{cls.__name__}.{SKIP_ATTR}: unknown check {unknown[0]!r} (known: {known})"
        )
    chosen = set(CHECKS)
    if getattr(cls, GENERATOR_ATTR, False):
        chosen.add("generator")
    return frozenset(chosen - set(skipped))


@dataclass
class Snapshot:
    """The process state the checks compare; a check not taken is None."""

    environ: Optional[Dict[Any, Any]] = None  # raw (bytes on POSIX)
    default_dtype: Optional[torch.dtype] = None
    default_device: Optional[torch.device] = None
    grad_mode: Optional[Tuple[bool, bool]] = None  # grad enabled, inference mode
    deterministic: Optional[Tuple[str, bool, bool]] = None
    process_groups: Optional[FrozenSet[int]] = None  # ids of the groups alive, the class's aside
    threads: Optional[Dict[int, str]] = None  # ident -> name of the non-daemon threads alive
    generator: Optional[Tuple[int, Any]] = None  # initial seed, state


_DETERMINISTIC_MODES = {0: "off", 1: "warn only", 2: "on"}


def _deterministic() -> Tuple[str, bool, bool]:
    cudnn = torch.backends.cudnn
    mode = _DETERMINISTIC_MODES[torch.get_deterministic_debug_mode()]
    return mode, bool(cudnn.deterministic), bool(cudnn.benchmark)


def _threads() -> Dict[int, str]:
    main = threading.main_thread()
    return {
        t.ident or 0: t.name for t in threading.enumerate() if not t.daemon and t is not main
    }


def _environ_now() -> Dict[Any, Any]:
    """os.environ as a plain dict. CPython keeps the raw bytes in `_data`: copying that is
    a few hundred times cheaper than decoding every key and value (a tenth of a millisecond
    per test, more on a loaded machine); keys are decoded only to name a leak."""
    raw = getattr(os.environ, "_data", None)
    return dict(raw) if isinstance(raw, dict) else dict(os.environ)


def _text(key: Any) -> str:
    return os.fsdecode(key) if isinstance(key, bytes) else str(key)


_TAKERS: Dict[str, Callable[[Any], Any]] = {
    "environ": lambda own: _environ_now(),
    "default_dtype": lambda own: torch.get_default_dtype(),
    "default_device": lambda own: torch.get_default_device(),
    "grad_mode": lambda own: (torch.is_grad_enabled(), torch.is_inference_mode_enabled()),
    "deterministic": lambda own: _deterministic(),
    "process_groups": lambda own: frozenset(
        id(g) for g in compat_distributed.live_process_groups()
        if g is not own and not str(getattr(g, "group_desc", "")).startswith(MESH_GROUP_PREFIX)
    ),
    "threads": lambda own: _threads(),
    "generator": lambda own: (
        torch.default_generator.initial_seed(), torch.default_generator.get_state()
    ),
}


# torch's DeviceMesh makes a group per mesh dimension (described "mesh_<dim>") on every
# init_device_mesh and never destroys them; tests written for upstream's shared mode build a
# mesh per test, so these groups are not counted as a test's leak.
MESH_GROUP_PREFIX = "mesh_"


def snapshot(checks: Collection[str], own_group: Any = None) -> Snapshot:
    """The state `checks` look at, now; `own_group` (the class's group) is not a leak."""
    taken = Snapshot()
    for name in checks:
        setattr(taken, name, _TAKERS[name](own_group))
    return taken


# Variables torch sets itself on the first use of a feature (compile caches, toolchain paths),
# once per process: not state a test chose to leave.
TORCH_LAZY_ENV = frozenset({
    "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TRITON_PTXAS_PATH", "TRITON_LIBDEVICE_PATH",
    "KMP_DUPLICATE_LIB_OK", "CUBLAS_WORKSPACE_CONFIG", "DISABLE_CUPTI_LAZY_REINIT",
    "TEARDOWN_CUPTI",
})


def _environ(before: Dict[Any, Any], after: Dict[Any, Any]) -> List[str]:
    if before == after:
        return []
    before = {_text(k): v for k, v in before.items() if _text(k) not in TORCH_LAZY_ENV}
    after = {_text(k): v for k, v in after.items() if _text(k) not in TORCH_LAZY_ENV}
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    found = [f"{', '.join(added)} in os.environ"] if added else []
    found += [f"{', '.join(removed)} removed from os.environ"] if removed else []
    found += [f"{', '.join(changed)} changed in os.environ"] if changed else []
    return found


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def _grad_mode(before: Tuple[bool, bool], after: Tuple[bool, bool]) -> List[str]:
    names = ("grad mode", "inference mode")
    return [f"{n} {_on(a)} (was {_on(b)})" for n, b, a in zip(names, before, after) if a != b]


def _deterministic_leaks(before: Tuple[Any, ...], after: Tuple[Any, ...]) -> List[str]:
    names = ("deterministic algorithms", "cudnn.deterministic", "cudnn.benchmark")
    return [f"{n} {a} (was {b})" for n, b, a in zip(names, before, after) if a != b]


def _groups(before: FrozenSet[int], after: FrozenSet[int]) -> List[str]:
    left = len(after - before)
    if not left:
        return []
    return [f"{left} process group{'s' if left > 1 else ''} not destroyed"]


def _thread_leaks(before: Dict[int, str], after: Dict[int, str]) -> List[str]:
    names = [repr(after[ident]) for ident in after if ident not in before]
    if not names:
        return []
    plural = "s" if len(names) > 1 else ""
    return [f"{len(names)} thread{plural} still running ({', '.join(names)})"]


def _generator(before: Tuple[int, Any], after: Tuple[int, Any]) -> List[str]:
    if before[0] != after[0]:
        return [f"default generator reseeded with {after[0]} (was {before[0]})"]
    if not torch.equal(before[1], after[1]):
        return ["default generator advanced (random numbers drawn from it)"]
    return []


_COMPARERS: Dict[str, Callable[[Any, Any], List[str]]] = {
    "environ": _environ,
    "default_dtype": lambda b, a: [] if a == b else [f"default dtype {_name(a)} (was {_name(b)})"],
    "default_device": lambda b, a: [] if a == b else [f"default device {a} (was {b})"],
    "grad_mode": _grad_mode,
    "deterministic": _deterministic_leaks,
    "process_groups": _groups,
    "threads": _thread_leaks,
    "generator": _generator,
}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _differences(before: Snapshot, after: Snapshot) -> List[Tuple[str, List[str]]]:
    """(check, its phrases) for each check taken in both snapshots, in the order of CHECKS."""
    found = []
    for name in (*CHECKS, *OPT_IN_CHECKS):
        old, new = getattr(before, name), getattr(after, name)
        if old is not None and new is not None:
            found.append((name, _COMPARERS[name](old, new)))
    return found


def leaks(before: Snapshot, after: Snapshot) -> List[str]:
    """Each difference between two snapshots, as a phrase (`default dtype float64 (was
    float32)`), in the order of CHECKS; only checks taken in both are compared."""
    return [phrase for _, phrases in _differences(before, after) for phrase in phrases]


def leak_message(test: str, found: List[str], checks: Collection[str] = ()) -> str:
    """One line naming each leak and the option that waives it: `test_x left LEAKED_VAR in
    os.environ; 1 process group not destroyed (skip_leak_checks=("environ",
    "process_groups") waives these checks)`."""
    waiver = ""
    if checks:
        names = ", ".join(f'"{name}"' for name in checks) + ("," if len(checks) == 1 else "")
        waiver = f" (skip_leak_checks=({names}) waives {'it' if len(checks) == 1 else 'them'})"
    return f"{test} left {'; '.join(found)}{waiver}"


LEAK_STATUS = "leak"  # the status of the failure event that reports leaks


def leak_event(test: str, before: Snapshot, after: Snapshot) -> Optional[Event]:
    """The failure a rank reports for a test that left state behind (marked, so the parent
    retires the ranks), naming each leak and the checks that waive them; None if it left
    none."""
    found = [(name, phrases) for name, phrases in _differences(before, after) if phrases]
    if not found:
        return None
    phrases = [phrase for _, check_phrases in found for phrase in check_phrases]
    message = leak_message(test, phrases, [name for name, _ in found])
    text = f"{message}\n"
    return Event("failure", text, status=LEAK_STATUS, failure=Failure.of_message(text))


def leaked(records: List[RankRecord]) -> bool:
    """Whether any rank reported that the test left state behind."""
    return any(e.kind == "failure" and e.status == LEAK_STATUS for r in records for e in r.events)
