"""HARNESS_ALLOW_CPU: CPU analogs of torch's accelerator defaults (the one place patching torch).

Tests written for GPUs lean on two accelerator defaults that torch refuses on a machine without
one: FSDP1 (`FullyShardedDataParallel`) built without `device_id` takes the current accelerator
(on CPU: "FSDP needs a non-CPU accelerator device"), and DDP takes `device_ids=[rank]` (on a CPU
module: "device_ids ... only work with ... GPU modules"). `PROCESS_ADAPTATIONS.install()` gives
each its CPU analog, and they apply only inside a rank (a launcher runs a rank in this thread:
harness/launch/context.py `running_rank`, a rank process or a rank thread, of a test class or a
marked pytest function) and only while the CPU stands in for accelerators (HARNESS_ALLOW_CPU=1,
none present). Rank processes install them when they start (harness/process/rank.py); thread
ranks share the runner's process, whose thread launcher installs them before starting the
threads (harness/threads/launcher.py), and every other test of that process still gets torch's
own behaviour. Neither analog changes what is
computed: the module stays where its parameters are, on the CPU.

Each adaptation, when it fires, writes one line to the rank's stderr (once per test) and
appends `<key>\t<test id>` to the run's adaptation log: a file named by HARNESS_CPU_ADAPTATIONS,
made and removed by `adaptation_log()` around a run (run_all.py, run_tests), whose summary
line `summary_line()` gives.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import sys
import tempfile
import threading
from typing import Any, Dict, Iterator, Optional, Set, Tuple

import torch
import torch.distributed as dist

from harness import settings
from harness.launch.context import running_rank
from harness.requirements import decorators

LOG_ENV = "HARNESS_CPU_ADAPTATIONS"
FSDP_DEVICE_ID = "fsdp1_device_id"
DDP_DEVICE_IDS = "ddp_device_ids"
# key: (the line a rank writes when it fires, how the run's summary names it)
ADAPTATIONS: Dict[str, Tuple[str, str]] = {
    FSDP_DEVICE_ID: ("FSDP built without device_id uses cpu", "FSDP1 device_id=cpu"),
    DDP_DEVICE_IDS: (
        "DDP device_ids/output_device naming the rank's device are None for a CPU module",
        "DDP device_ids=None",
    ),
}

class CpuAdaptations:
    """This process's adaptations: patched in once (`install`), and each one's firing told once
    per test (`fired`); a lock, as rank threads fire concurrently. One per process,
    `PROCESS_ADAPTATIONS`, as the classes it patches are the process's."""

    def __init__(self) -> None:
        self.installed = False
        self._reported: Set[Tuple[str, str]] = set()  # (adaptation key, test id) told already
        self._lock = threading.Lock()

    def install(self) -> bool:
        """Adapt FSDP1 and DDP in this process when the CPU stands in for accelerators (for
        the ranks that run here). Returns whether the adaptations are on; installing twice is
        a no-op."""
        if not decorators.cpu_stands_in():
            return False
        with self._lock:
            if not self.installed:
                # Imported here: torch.distributed.fsdp costs every process that imports this
                # module over a second, and only a CPU stand-in run patches it.
                from torch.distributed.fsdp import FullyShardedDataParallel
                from torch.nn.parallel import DistributedDataParallel

                _patch_init(FullyShardedDataParallel, _fsdp_arguments)
                _patch_init(DistributedDataParallel, _ddp_arguments)
                self.installed = True
        return True

    def fired(self, key: str, case: Any) -> None:
        """Tell the test's output (once per test) and the run's adaptation log that `key`
        fired."""
        test_id = case.id()
        with self._lock:
            if (key, test_id) in self._reported:
                return
            self._reported.add((key, test_id))
        print(f"[harness] HARNESS_ALLOW_CPU: {ADAPTATIONS[key][0]}", file=sys.stderr, flush=True)
        path = settings.env_text(LOG_ENV)
        if path:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:  # one short write with O_APPEND: lines of concurrent ranks do not interleave
                os.write(fd, f"{key}\t{test_id}\n".encode())
            finally:
                os.close(fd)


PROCESS_ADAPTATIONS = CpuAdaptations()


def _in_rank() -> Any:
    """The instance running as this thread's rank when the CPU stands in, else None."""
    running = running_rank()
    if running is not None and decorators.cpu_stands_in():
        return running
    return None


def _patch_init(cls: type, adapt: Any) -> None:
    """Wrap `cls.__init__` so that `adapt` may rewrite its bound arguments first."""
    original = cls.__init__
    signature = inspect.signature(original)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - replaces it
        bound = signature.bind(self, *args, **kwargs)
        adapt(bound.arguments)
        original(*bound.args, **bound.kwargs)

    __init__.__doc__ = original.__doc__
    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]


def _on_cpu_only(module: Any) -> bool:
    params = list(module.parameters()) if isinstance(module, torch.nn.Module) else []
    return all(p.device.type in ("cpu", "meta") for p in params)


def _fsdp_arguments(arguments: Dict[str, Any]) -> None:
    """FSDP1 without device_id on CPU (or meta) parameters: the CPU, as a GPU run takes its GPU."""
    if arguments.get("device_id") is not None or not _on_cpu_only(arguments.get("module")):
        return
    case = _in_rank()
    if case is not None:
        arguments["device_id"] = torch.device("cpu")
        PROCESS_ADAPTATIONS.fired(FSDP_DEVICE_ID, case)


def _rank() -> Optional[int]:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else None


def _names_rank_device(value: Any, rank: Optional[int]) -> bool:
    """Whether a device_ids entry / output_device names this rank's device (or the CPU)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value == rank
    if isinstance(value, str):
        try:
            value = torch.device(value)
        except RuntimeError:
            return False
    if isinstance(value, torch.device):
        return value.type == "cpu" or value.index in (None, rank)
    return False


def _ddp_arguments(arguments: Dict[str, Any]) -> None:
    """DDP device_ids/output_device naming the rank's device, on a CPU module: None."""
    module = arguments.get("module")
    ids, output = arguments.get("device_ids"), arguments.get("output_device")
    if not ids and output is None:
        return
    params = list(module.parameters()) if isinstance(module, torch.nn.Module) else []
    if not params or any(p.device.type != "cpu" for p in params):
        return
    rank = _rank()
    if ids is not None and not (
        isinstance(ids, (list, tuple)) and all(_names_rank_device(v, rank) for v in ids)
    ):
        return
    if output is not None and not _names_rank_device(output, rank):
        return
    case = _in_rank()
    if case is not None:
        arguments["device_ids"] = None
        arguments["output_device"] = None
        PROCESS_ADAPTATIONS.fired(DDP_DEVICE_IDS, case)


@contextlib.contextmanager
def adaptation_log() -> Iterator[None]:
    """Around a run: while the CPU stands in, a private log the ranks append to, removed after.

    Nested runs (run_tests inside run_all.py's process) keep the outer run's log.
    """
    if settings.env_text(LOG_ENV) or not decorators.cpu_stands_in():
        yield
        return
    folder = tempfile.mkdtemp(prefix="harness-cpu-adaptations-")
    os.environ[LOG_ENV] = os.path.join(folder, "adaptations.tsv")
    try:
        yield
    finally:
        os.environ.pop(LOG_ENV, None)
        shutil.rmtree(folder, ignore_errors=True)


def summary_line() -> Optional[str]:
    """The run's summary of adaptations that fired, e.g. `CPU adaptations (HARNESS_ALLOW_CPU):
    FSDP1 device_id=cpu in 12 tests; DDP device_ids=None in 3 tests`; None when none fired."""
    path = settings.env_text(LOG_ENV)
    if not path or not os.path.exists(path):
        return None
    tests: Dict[str, Set[str]] = {}
    with open(path) as f:
        for line in f:
            key, _, test_id = line.rstrip("\n").partition("\t")
            if key in ADAPTATIONS:
                tests.setdefault(key, set()).add(test_id)
    parts = [
        f"{ADAPTATIONS[key][1]} in {len(ids)} test{'s' if len(ids) != 1 else ''}"
        for key, ids in ((k, tests[k]) for k in ADAPTATIONS if k in tests)
    ]
    return f"CPU adaptations (HARNESS_ALLOW_CPU): {'; '.join(parts)}" if parts else None
