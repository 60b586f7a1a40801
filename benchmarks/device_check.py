"""What the harness does on a GPU machine, checked in one command that prints what held.

Why: the harness is developed on a CPU-only machine, so its CUDA paths (marked functions on
the GPU, nccl groups, pytest-xdist device leases, `run_all.py --device cuda`, `-j` with many
cores) are only exercised when a session gets a GPU machine for a few minutes. This script
is that session's whole check: generate small test files, run each in a subprocess (a fresh
interpreter with PYTHONPATH set to this checkout, under a time limit: killed with its whole
process group when it runs over, counted as a FAIL), read every test's outcome from JUnit XML
and compare it with what this machine should give.

How:

    python benchmarks/device_check.py                      # every check
    python benchmarks/device_check.py --only xdist_leases,harness_device_cpu
    python benchmarks/device_check.py --with-bench         # bench_parallel on < 8 cores too
    python benchmarks/device_check.py --rehearse           # no GPU: GPU checks on CPU/gloo

Each check prints one line, `PASS|FAIL|SKIP <name>: <detail>` (a FAIL is followed by the tail
of what the command printed, indented), then the wall time and the line `device check: N
passed, N failed, N skipped`; the exit status is 1 if any check failed. Without a CUDA device
the GPU checks are SKIP ("no CUDA device") and the CPU-meaningful ones still run;
`--rehearse` runs the GPU checks' files on CPU with gloo instead, to test this script where
no GPU is at hand. Checks: cuda_marked_functions, cuda_classes, xdist_leases,
harness_device_cpu, run_all_device_cuda, bench_parallel (by default only with >= 8 cores).

Everything is written under one tempfile.TemporaryDirectory (each command's TMPDIR too),
removed on every exit; a command that leaves files in its TMPDIR or processes running after
it exits fails its check. Rendezvous stay on loopback (file:// stores, GLOO/NCCL/TP socket
interface `lo`). The run gives its commands `--budget-s` seconds in all (default 270, so
that it ends within 5 minutes): a command still running then is stopped, a check that could
not run is a FAIL.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.fixtures import procs  # noqa: E402 - the one /proc reader of tests and benchmarks

BENCH_MIN_CORES = 8
DEFAULT_BUDGET_S = 270.0  # + a killed command's grace (15 s): under 5 minutes
MIN_COMMAND_S = 5.0  # a command is not started with less of the budget left
PYTEST_TIMEOUT_S = 150.0
RUN_ALL_TIMEOUT_S = 200.0
BENCH_TIMEOUT_S = 240.0
TERM_GRACE_S = 10.0  # SIGTERM, then this long before SIGKILL
EXIT_GRACE_S = 5.0  # how long a command's processes may outlive it
TAIL_LINES = 25
HARNESS_TIMEOUT_S = "120"  # each test's own limit (HARNESS_TIMEOUT), below the command's
# Fast tests of test_cases/test_misc.py (checked with `python run_all.py --list`): world size 1
# and 2, process and thread ranks, FSDP1 training.
RUN_ALL_SELECTION = (
    "test_fsdp_namedtuple",
    "test_no_params",
    "test_unsafe_setattr",
    "test_world_size_1_sharding_strategy_warning",
    "test_fsdp_cpu_training",
)
CLOSING = re.compile(r"^(\d+) passed, (\d+) failed, (\d+) skipped$", re.MULTILINE)
# Variables that would change what the children do: the harness's knobs, pytest's, torchrun's.
STRIP_PREFIXES = ("HARNESS_", "PYTEST_", "TORCHELASTIC_")
STRIP_NAMES = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
)
LOOPBACK = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "TP_SOCKET_IFNAME": "lo"}
OUTCOME_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
Expected = Dict[str, Tuple[str, str]]  # test name -> (outcome, text its message must contain)
Outcomes = Dict[str, Tuple[str, str]]  # test name -> (outcome, message)


# --------------------------------------------------------------------------- generated tests

MARKED_TESTS = '''
"""device_check: marked functions on the accelerator (fresh, auto, shared, 2 ranks)."""
import os

import pytest
import torch
import torch.distributed as dist

DEV = {dev!r}
BACKEND = {backend!r}
GPUS = {gpus}
SEEN = []  # pids of the shared tests' rank: module state lives as long as the shared ranks


def _reduce(rank, world_size, device):
    value = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(value)
    if device.type == "cuda":
        assert torch.cuda.current_device() == device.index, (torch.cuda.current_device(), device)
        torch.cuda.synchronize(device)
    want = world_size * (world_size + 1) / 2
    assert value.cpu().tolist() == [want] * 4


@pytest.mark.ranks(1, device=DEV)
def test_fresh_on_device(rank, world_size, device):
    assert device.type == DEV, device
    assert dist.get_backend() == BACKEND
    _reduce(rank, world_size, device)


@pytest.mark.ranks(1)
def test_auto_device(rank, world_size, device):
    assert device.type == DEV, device
    assert dist.get_backend() == BACKEND
    _reduce(rank, world_size, device)


@pytest.mark.ranks(1, mode="shared", device=DEV)
def test_shared_first(rank, world_size, device):
    assert device.type == DEV, device
    assert dist.get_backend() == BACKEND
    _reduce(rank, world_size, device)
    SEEN.append(os.getpid())


@pytest.mark.ranks(1, mode="shared", device=DEV)
def test_shared_second(rank, world_size, device):
    assert device.type == DEV, device
    assert dist.get_backend() == BACKEND
    _reduce(rank, world_size, device)
    assert SEEN == [os.getpid()], f"the first shared test's rank was not this one: {{SEEN}}"


@pytest.mark.ranks(2, device="cuda")
def test_two_cuda_ranks(rank, world_size, device):
    assert device.type == "cuda", device
    _reduce(rank, world_size, device)


@pytest.mark.ranks(2, device="cuda", allow_cpu=True)
def test_two_ranks_allow_cpu(rank, world_size, device):
    want = "cuda" if GPUS >= 2 else "cpu"
    assert device.type == want, device
    assert dist.get_backend() == ("nccl" if want == "cuda" else "gloo")
    _reduce(rank, world_size, device)
'''

CLASS_TESTS = '''
"""device_check: harness classes with world size 1 on the accelerator."""
import torch
import torch.distributed as dist

from harness import FSDPTest, MultiProcessTestCase, run_tests

DEVICE = torch.device({dev!r})
BACKEND = {backend!r}


def _reduce(case):
    value = torch.full((4,), 3.0, device=DEVICE)
    dist.all_reduce(value)
    if DEVICE.type == "cuda":
        case.assertEqual(torch.cuda.current_device(), DEVICE.index)
        torch.cuda.synchronize(DEVICE)
    case.assertEqual(value.cpu(), torch.full((4,), 3.0))


class TestDeviceCheckFSDP(FSDPTest):
    @property
    def world_size(self) -> int:
        return 1

    def test_fsdp_base_all_reduce(self) -> None:
        self.assertEqual(self.device, DEVICE)
        self.assertEqual(dist.get_backend(), BACKEND)
        _reduce(self)


class TestDeviceCheckOwnGroup(MultiProcessTestCase):
    @property
    def world_size(self) -> int:
        return 1

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def test_own_group_all_reduce(self) -> None:
        if DEVICE.type == "cuda":
            torch.cuda.set_device(DEVICE)
        dist.init_process_group(
            BACKEND, init_method=self.init_method, rank=self.rank, world_size=self.world_size
        )
        try:
            self.assertEqual(dist.get_backend(), BACKEND)
            _reduce(self)
        finally:
            dist.destroy_process_group()


if __name__ == "__main__":
    run_tests()
'''

XDIST_TESTS = '''
"""device_check: 8 one-rank tests under pytest-xdist, each recording when and where it ran."""
import os
import time

import pytest
import torch
import torch.distributed as dist

DEV = {dev!r}
SHARED = {shared!r}


@pytest.mark.ranks(1, device=DEV)
@pytest.mark.parametrize("index", range(8))
def test_lease(index, rank, world_size, device):
    start = time.monotonic()
    current = torch.cuda.current_device() if device.type == "cuda" else -1
    value = torch.ones(4, device=device)
    dist.all_reduce(value)
    time.sleep(0.5)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    end = time.monotonic()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
    with open(os.path.join(SHARED, f"{{index}}.txt"), "w") as f:
        f.write(f"{{start}} {{end}} {{current}} {{os.getpid()}} {{worker}}\\n")
'''

FORCED_CPU_TESTS = '''
"""device_check: HARNESS_DEVICE=cpu puts marked functions on the CPU with gloo."""
import pytest
import torch
import torch.distributed as dist


@pytest.mark.ranks(1)
def test_forced_cpu(rank, world_size, device):
    assert device.type == "cpu", device
    assert dist.get_backend() == "gloo"
    value = torch.ones(4, device=device)
    dist.all_reduce(value)
    assert value.tolist() == [1.0] * 4


@pytest.mark.ranks(2)
def test_forced_cpu_two_ranks(rank, world_size, device):
    assert device.type == "cpu", device
    assert dist.get_backend() == "gloo"
    value = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(value)
    assert value.tolist() == [3.0] * 4


@pytest.mark.ranks(1, device="cuda")
def test_cuda_marker_skips(rank, world_size, device):
    raise AssertionError("HARNESS_DEVICE=cpu should have skipped this test")
'''


# --------------------------------------------------------------------------- running commands

@dataclass
class Proc:
    """What one command did: exit status (None: not finished), output, wall time, problems."""

    rc: Optional[int]
    output: str
    wall: float
    timed_out: bool = False
    not_started: Optional[str] = None
    leftovers: List[str] = field(default_factory=list)

    def tail(self, lines: int = TAIL_LINES) -> List[str]:
        return self.output.rstrip().splitlines()[-lines:]


@dataclass
class Result:
    """A check's verdict: PASS, FAIL or SKIP, one line of detail, lines to show under it."""

    status: str
    detail: str
    lines: List[str] = field(default_factory=list)


def live_members(pgid: int) -> List[str]:
    """The processes of group `pgid` still alive (zombies excluded), as `pid name`."""
    return [f"{p.pid} {p.name}" for p in procs.processes() if p.state != "Z" and p.pgrp == pgid]


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the command's process group (the harness stops its ranks on it), then SIGKILL
    whatever is left after the grace."""
    for sig, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, EXIT_GRACE_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if proc.poll() is not None and not live_members(proc.pid):
                return
            time.sleep(0.1)
    proc.wait()


class Context:
    """The run's settings, its temporary folder and its time budget."""

    def __init__(self, root: str, began: float, budget_s: float, gpus: int, smi_gpus: int,
                 rehearse: bool, with_bench: bool) -> None:
        self.root = root
        self.deadline = began + budget_s
        self.budget_s = budget_s
        self.gpus = gpus  # CUDA devices torch can use
        self.smi_gpus = smi_gpus  # GPUs nvidia-smi lists
        self.rehearse = rehearse and gpus == 0
        self.with_bench = with_bench
        self.count = 0

    def folder(self) -> str:
        """A new, short-named work folder (short: the forkserver's socket path has a limit)."""
        self.count += 1
        path = os.path.join(self.root, str(self.count))
        os.makedirs(path)
        return path

    def env(self, extra: Dict[str, str], tmpdir: str) -> Dict[str, str]:
        env = {
            k: v for k, v in os.environ.items()
            if not k.startswith(STRIP_PREFIXES) and k not in STRIP_NAMES
        }
        env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
        env.update(LOOPBACK)
        env.update({"TMPDIR": tmpdir, "HARNESS_TIMEOUT": HARNESS_TIMEOUT_S,
                    "PYTHONDONTWRITEBYTECODE": "1"})
        env.update(extra)
        return env

    def run(self, args: Sequence[str], cwd: str, timeout_s: float,
            extra_env: Optional[Dict[str, str]] = None) -> Proc:
        """Run `args` in its own process group with a TMPDIR of its own; kill the group if it
        runs past `timeout_s` (or the budget); note files left in TMPDIR and live processes."""
        limit = min(timeout_s, self.deadline - time.monotonic())
        if limit < MIN_COMMAND_S:
            return Proc(None, "", 0.0, not_started=f"the {self.budget_s:.0f} s budget was spent")
        work = self.folder()
        tmpdir = os.path.join(work, "t")
        os.makedirs(tmpdir)
        log_path = os.path.join(work, "output.txt")
        began = time.monotonic()
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                list(args), cwd=cwd, env=self.env(extra_env or {}, tmpdir),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            timed_out = False
            try:
                proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                timed_out = True
                stop_group(proc)
            except BaseException:  # Ctrl-C, SIGTERM: stop the command, then go
                stop_group(proc)
                raise
        wall = time.monotonic() - began
        leftovers = []
        deadline = time.monotonic() + EXIT_GRACE_S
        while live_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        alive = live_members(proc.pid)
        if alive:
            stop_group(proc)
            leftovers.append(f"processes left running after it exited: {', '.join(alive)}")
        left = sorted(os.listdir(tmpdir))
        if left:
            leftovers.append(f"left in its TMPDIR: {', '.join(left[:10])}")
        with open(log_path, errors="replace") as f:
            output = f.read()
        rc = None if timed_out else proc.returncode
        return Proc(rc, output, wall, timed_out, None, leftovers)


def read_junit(paths: Sequence[str]) -> Outcomes:
    """Each test's outcome and message from JUnit XML files (pytest's, or run_tests'
    --save-xml); a test reported twice keeps its worst outcome."""
    tags = {"failure": "failed", "error": "error", "skipped": "skipped"}
    found: Outcomes = {}
    for path in paths:
        try:
            tree = ET.parse(path)
        except (OSError, ET.ParseError):
            continue
        for case in tree.iter("testcase"):
            status, message = "passed", ""
            for child in case:
                kind = tags.get(child.tag)
                if kind and OUTCOME_RANK[kind] > OUTCOME_RANK[status]:
                    status, message = kind, child.get("message") or (child.text or "")
            name = case.get("name", "")
            if name not in found or OUTCOME_RANK[status] > OUTCOME_RANK[found[name][0]]:
                found[name] = (status, message)
    return found


def first_line(text: str, width: int = 160) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def compare(outcomes: Outcomes, expected: Expected) -> List[str]:
    """What differs between the outcomes and the expected ones, a line each."""
    problems = []
    for name, (status, needle) in expected.items():
        got = outcomes.get(name)
        if got is None:
            problems.append(f"{name}: no result")
        elif got[0] != status:
            why = f" ({first_line(got[1])})" if got[1].strip() else ""
            problems.append(f"{name}: {got[0]}, expected {status}{why}")
        elif needle and needle not in got[1]:
            problems.append(f"{name}: {status}, but not with {needle!r}: {first_line(got[1])}")
    extra = sorted(set(outcomes) - set(expected))
    if extra:
        problems.append(f"unexpected tests: {', '.join(extra)}")
    return problems


def failed_command(what: str, proc: Proc) -> Optional[Result]:
    """A FAIL if the command did not run to its end, else None."""
    if proc.not_started:
        return Result("FAIL", f"{what} not started: {proc.not_started}")
    if proc.timed_out:
        return Result("FAIL", f"{what} timed out after {proc.wall:.0f} s (killed)", proc.tail())
    return None


def verdict(what: str, proc: Proc, problems: List[str], summary: str,
            lines: Optional[List[str]] = None) -> Result:
    """PASS with `summary`, or FAIL naming the problems (exit status and leftovers too)."""
    stopped = failed_command(what, proc)
    if stopped:
        return stopped
    problems = list(problems) + proc.leftovers
    if proc.rc != 0:
        problems.insert(0, f"{what} exited {proc.rc}")
    if problems:
        return Result("FAIL", "; ".join(problems), proc.tail())
    return Result("PASS", summary, lines or [])


def pytest_run(ctx: Context, files: Dict[str, str], args: Sequence[str] = (),
               extra_env: Optional[Dict[str, str]] = None) -> Tuple[Proc, Outcomes, str]:
    """Write `files` into a new folder (with a pytest.ini, so that no settings from above it
    apply) and run pytest with the harness's plugin on them: the command, the outcomes."""
    folder = ctx.folder()
    for name, text in files.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(textwrap.dedent(text).lstrip())
    with open(os.path.join(folder, "pytest.ini"), "w") as f:
        f.write("[pytest]\n")
    xml = os.path.join(folder, "junit.xml")
    command = [
        sys.executable, "-m", "pytest", "-p", "harness.pytest_plugin", "-p", "no:cacheprovider",
        "-p", "no:randomly", "-q", "-rs", f"--junitxml={xml}",
        f"--basetemp={os.path.join(folder, 'basetemp')}", *args, *sorted(files),
    ]
    proc = ctx.run(command, folder, PYTEST_TIMEOUT_S, extra_env)
    return proc, read_junit([xml]), folder


# --------------------------------------------------------------------------- the checks

def no_cuda(ctx: Context) -> Optional[Result]:
    """SKIP for a GPU check on a machine without CUDA (unless rehearsing on CPU); FAIL where
    nvidia-smi lists GPUs that torch cannot use (a CPU-only torch, say)."""
    if ctx.gpus > 0 or ctx.rehearse:
        return None
    if ctx.smi_gpus > 0:
        return Result("FAIL", f"no CUDA device for torch, but nvidia-smi lists {ctx.smi_gpus} "
                              "GPU(s): a CPU-only torch build, or a driver problem?")
    return Result("SKIP", "no CUDA device")


def on_device(ctx: Context) -> Tuple[str, str, str]:
    """(device type, backend, suffix for the detail): cuda and nccl, or a CPU rehearsal's."""
    if ctx.gpus > 0:
        return "cuda", "nccl", ""
    return "cpu", "gloo", " (rehearsal on cpu with gloo)"


def check_cuda_marked_functions(ctx: Context) -> Result:
    skip = no_cuda(ctx)
    if skip:
        return skip
    dev, backend, note = on_device(ctx)
    source = MARKED_TESTS.format(dev=dev, backend=backend, gpus=ctx.gpus)
    proc, outcomes, _ = pytest_run(ctx, {"test_dc_marked.py": source})
    two = ("passed", "") if ctx.gpus >= 2 else ("skipped", "needs 2 CUDA device(s)")
    expected: Expected = {
        "test_fresh_on_device": ("passed", ""),
        "test_auto_device": ("passed", ""),
        "test_shared_first": ("passed", ""),
        "test_shared_second": ("passed", ""),
        "test_two_cuda_ranks": two,
        "test_two_ranks_allow_cpu": ("passed", ""),
    }
    skipped = outcomes.get("test_two_cuda_ranks", ("", ""))[1]
    summary = (
        f"fresh, auto and 2x shared ran on {dev} with {backend}; 2-rank cuda "
        + (f"skipped ({first_line(skipped, 70)})" if ctx.gpus < 2 else "passed")
        + f"; 2-rank allow_cpu passed{note} [{proc.wall:.1f} s]"
    )
    return verdict("pytest", proc, compare(outcomes, expected), summary)


def check_cuda_classes(ctx: Context) -> Result:
    skip = no_cuda(ctx)
    if skip:
        return skip
    dev, backend, note = on_device(ctx)
    extra = {} if ctx.gpus > 0 else {"HARNESS_ALLOW_CPU": "1"}  # FSDPTest runs on CPU so
    source = CLASS_TESTS.format(dev="cuda:0" if dev == "cuda" else "cpu", backend=backend)
    name = "test_dc_classes.py"
    expected: Expected = {
        "test_fsdp_base_all_reduce": ("passed", ""),
        "test_own_group_all_reduce": ("passed", ""),
    }
    proc, outcomes, folder = pytest_run(ctx, {name: source}, extra_env=extra)
    first = verdict("pytest", proc, compare(outcomes, expected), "")
    if first.status != "PASS":
        first.detail = f"under pytest: {first.detail}"
        return first
    reports = os.path.join(folder, "reports")
    direct = ctx.run([sys.executable, name, "-v", f"--save-xml={reports}"], folder,
                     PYTEST_TIMEOUT_S, extra)
    xmls = [os.path.join(reports, n) for n in sorted(os.listdir(reports))
            ] if os.path.isdir(reports) else []
    problems = compare(read_junit(xmls), expected)
    summary = (f"FSDPTest and MultiProcessTestCase (own group), world size 1, {backend} on "
               f"{dev}: passed under pytest [{proc.wall:.1f} s] and run_tests() "
               f"[{direct.wall:.1f} s]{note}")
    result = verdict(f"python {name}", direct, problems, summary)
    if result.status != "PASS":
        result.detail = f"under run_tests(): {result.detail}"
    return result


Record = Tuple[float, float, int, int, str]  # start, end, device, pid, xdist worker


def overlaps(records: Sequence[Record]) -> List[str]:
    """Each time a test started on a device before the previous one there had ended."""
    found = []
    per_device: Dict[int, List[Record]] = {}
    for record in records:
        per_device.setdefault(record[2], []).append(record)
    for device, held in sorted(per_device.items()):
        held.sort()
        latest = held[0]  # of the tests started so far, the one that ended last
        for after in held[1:]:
            if after[0] < latest[1]:
                found.append(
                    f"cuda:{device}: pid {after[3]} ({after[4]}) started {latest[1] - after[0]:.2f}"
                    f" s before pid {latest[3]} ({latest[4]}) ended"
                )
            if after[1] > latest[1]:
                latest = after
    return found


def check_xdist_leases(ctx: Context) -> Result:
    if importlib.util.find_spec("xdist") is None:
        return Result("SKIP", "pytest-xdist is not installed (pip install pytest-xdist)")
    dev = "cuda" if ctx.gpus > 0 else "cpu"
    shared = os.path.join(ctx.folder(), "records")
    os.makedirs(shared)
    source = XDIST_TESTS.format(dev=dev, shared=shared)
    proc, outcomes, _ = pytest_run(ctx, {"test_dc_xdist.py": source}, ["-n", "4"])
    expected: Expected = {f"test_lease[{i}]": ("passed", "") for i in range(8)}
    problems = compare(outcomes, expected)
    stopped = failed_command("pytest -n 4", proc)
    if stopped:
        return stopped
    records: List[Record] = []
    for entry in sorted(os.listdir(shared)):
        with open(os.path.join(shared, entry)) as f:
            text = f.read()
        try:
            start, end, device, pid, worker = text.split()
            records.append((float(start), float(end), int(device), int(pid), worker))
        except ValueError:
            problems.append(f"record {entry} unreadable: {text!r}")
    if len(records) != 8:
        problems.append(f"{len(records)} of 8 tests wrote their record")
    workers = sorted({r[4] for r in records})
    span = (max(r[1] for r in records) - min(r[0] for r in records)) if records else 0.0
    if dev == "cpu":
        summary = (f"cpu only (no lease to check): 8 passed with -n 4 on {len(workers)} "
                   f"worker(s) [{proc.wall:.1f} s]")
        return verdict("pytest -n 4", proc, problems, summary)
    per_device: Dict[int, List[Record]] = {}
    for record in records:
        per_device.setdefault(record[2], []).append(record)
    problems.extend(overlaps(records))
    if len(workers) < 2:
        problems.append(f"only worker(s) {workers} ran tests: no two tests competed for a device")
    uses = ", ".join(f"cuda:{d} {len(h)} tests" for d, h in sorted(per_device.items()))
    summary = (f"8 passed with -n 4 on {len(workers)} workers; no two tests overlapped on a "
               f"device ({uses}, {span:.1f} s from first start to last end) [{proc.wall:.1f} s]")
    return verdict("pytest -n 4", proc, problems, summary)


def check_harness_device_cpu(ctx: Context) -> Result:
    proc, outcomes, _ = pytest_run(ctx, {"test_dc_forced_cpu.py": FORCED_CPU_TESTS},
                                   extra_env={"HARNESS_DEVICE": "cpu"})
    expected: Expected = {
        "test_forced_cpu": ("passed", ""),
        "test_forced_cpu_two_ranks": ("passed", ""),
        "test_cuda_marker_skips": ("skipped", "needs 1 CUDA device(s), 0 available"),
    }
    summary = (f"HARNESS_DEVICE=cpu: 1 and 2 ranks on cpu with gloo, device='cuda' skipped "
               f"[{proc.wall:.1f} s]")
    return verdict("pytest", proc, compare(outcomes, expected), summary)


def check_run_all_device_cuda(ctx: Context) -> Result:
    device = "cuda" if ctx.gpus > 0 else "cpu"
    selection = [arg for name in RUN_ALL_SELECTION for arg in ("-k", name)]
    command = [sys.executable, "run_all.py", "test_misc", "--device", device, *selection]
    proc = ctx.run(command, ROOT, RUN_ALL_TIMEOUT_S)
    closings = list(CLOSING.finditer(proc.output))
    closing = closings[-1].group(0) if closings else "(no closing line)"
    problems = []
    if proc.rc == 0 and not (closings and int(closings[-1].group(1)) > 0):
        problems.append(f"no test passed: {closing}")
    what = f"run_all.py --device {device} -k ({len(RUN_ALL_SELECTION)} names)"
    note = "" if device == "cuda" else " (no CUDA device: cpu smoke run)"
    return verdict(what, proc, problems, f"{what}: {closing}{note} [{proc.wall:.1f} s]")


def check_bench_parallel(ctx: Context) -> Result:
    cores = len(os.sched_getaffinity(0))
    if cores < BENCH_MIN_CORES and not ctx.with_bench:
        return Result("SKIP", f"{cores} cores (< {BENCH_MIN_CORES}): slow here; --with-bench "
                              "runs it")
    command = [sys.executable, "benchmarks/bench_parallel.py", "--rounds", "1", "--skip-suites"]
    proc = ctx.run(command, ROOT, BENCH_TIMEOUT_S)
    lines = proc.output.rstrip().splitlines()
    summary = (f"bench_parallel.py --rounds 1 --skip-suites on {cores} cores, {ctx.gpus} CUDA "
               f"device(s) [{proc.wall:.1f} s]")
    return verdict("bench_parallel.py", proc, [], summary, lines)


CHECKS: Dict[str, Callable[[Context], Result]] = {
    "cuda_marked_functions": check_cuda_marked_functions,
    "cuda_classes": check_cuda_classes,
    "xdist_leases": check_xdist_leases,
    "harness_device_cpu": check_harness_device_cpu,
    "run_all_device_cuda": check_run_all_device_cuda,
    "bench_parallel": check_bench_parallel,
}


# --------------------------------------------------------------------------- the machine

def visible_gpus() -> Tuple[int, int, str]:
    """(CUDA devices torch can use, GPUs nvidia-smi lists, a line describing both)."""
    import torch  # here, not at import: the script's --help needs no torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    smi = shutil.which("nvidia-smi")
    names: List[str] = []
    if smi:
        try:
            done = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=30)
            if done.returncode == 0:
                names = [n.strip() for n in done.stdout.splitlines() if n.strip()]
        except (OSError, subprocess.SubprocessError):
            names = []
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    line = (f"torch {torch.__version__} ({build}); CUDA devices torch sees: {count}"
            + (f"; nvidia-smi: {', '.join(names) or 'none'}" if smi else "; no nvidia-smi"))
    return count, len(names), line


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", metavar="NAME[,NAME]",
                        help=f"run only these checks (of: {', '.join(CHECKS)})")
    parser.add_argument("--with-bench", action="store_true",
                        help=f"run bench_parallel with fewer than {BENCH_MIN_CORES} cores too")
    parser.add_argument("--rehearse", action="store_true",
                        help="without a CUDA device, run the GPU checks on CPU with gloo "
                        "(tests this script, not the GPU paths)")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help="seconds for all the commands; one still running then is stopped "
                        "(default %(default)s)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        parser.error(f"unknown check {unknown[0]!r} (known: {', '.join(CHECKS)})")

    def interrupted(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds: the running command is stopped, the folder goes

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    began = time.monotonic()
    gpus, smi_gpus, machine = visible_gpus()
    cores = len(os.sched_getaffinity(0))
    print(f"machine: {machine}; {cores} cores; python {sys.version.split()[0]}", flush=True)
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    with tempfile.TemporaryDirectory(prefix="device-check-") as root:
        ctx = Context(root, began, args.budget_s, gpus, smi_gpus, args.rehearse,
                      args.with_bench)
        for name in names:
            try:
                result = CHECKS[name](ctx)
            except (OSError, ValueError, subprocess.SubprocessError) as error:
                result = Result("FAIL", f"the check itself failed: {type(error).__name__}: "
                                        f"{error}")
            except KeyboardInterrupt:  # its command is stopped already; the folder goes next
                print(f"interrupted during {name}", flush=True)
                return 130
            counts[result.status] += 1
            print(f"{result.status} {name}: {result.detail}", flush=True)
            for line in result.lines:
                print(f"    | {line}", flush=True)
    print(f"wall time: {time.monotonic() - began:.1f} s")
    print(f"device check: {counts['PASS']} passed, {counts['FAIL']} failed, "
          f"{counts['SKIP']} skipped")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
