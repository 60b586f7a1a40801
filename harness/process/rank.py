"""What runs inside one rank process: set the process up, run the job's test, report every event.

The parent (harness/process/launchers.py) only supervises. A rank re-creates what its Job
names by module and qualified name (a test class, or a front end's rank program), hands the
instance its RankContext (`attach_rank`: rank, world size, rendezvous, the grid meeting
`GridMeeting`) and runs it (`run(result)`: a test class through unittest's own machinery,
setUp, subTest, skips, expected failures, unchanged; a pytest function's program without
it), and `ReportingResult` sends each event to the parent over a pipe, where the outcome is
decided. A fresh rank (`main`) runs one test
and exits; a shared rank (`serve`) sets its class up once and runs each test the parent
sends it, reporting each test's events exactly as a fresh rank does. This module must stay
importable without side effects: the forkserver preloads it.
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import unittest
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import parent_process
from multiprocessing.connection import Connection, wait
from typing import Any, Dict, FrozenSet, List, Optional, Tuple

import torch
import torch.distributed as dist

from harness.compat import cpu_defaults as compat_cpu_defaults
from harness.compat import flight_recorder as compat_flight_recorder
from harness.launch.context import RankContext, running_as_rank
from harness.launch.hooks import SharedRankHooks
from harness.launch.job import Job
from harness.outcome.rank_record import (
    Event,
    ReportingResult,
    raised_event,
    skip_exit_reason,
)
from harness.process import assert_rewrite, leaks
from harness.settings import DEBUG_RANK_ENV
from harness.single_process.testcase import current_seed

STACK_SIGNAL = signal.SIGUSR1  # the parent sends it to get a rank's Python stack
COLLECTIVES_SIGNAL = signal.SIGUSR2  # ... and this one for the collectives it entered
_PR_SET_PDEATHSIG = 1
GRID_SYNC_TIMEOUT_S = 30.0  # a rank's wait for the others after a grid point, unless its class says


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank needs to re-create and run its test (picklable, sent at start)."""

    job: Job  # what the rank runs (a shared rank: the job that started the set)
    rank: int
    world_size: int
    file_name: str
    work_dir: str  # the test's private dir (rendezvous file, outputs, temp)
    output_path: str
    temp_dir: str
    threads: int
    env: Dict[str, str]
    master_port: int = 0  # this set of ranks' own free port on loopback (launcher_environment)


def launcher_environment(rank: int, world_size: int, master_port: int) -> Dict[str, str]:
    """The variables torchrun gives each of its workers (one machine, one role), so that code
    that reads them finds in a rank the world it has under torchrun: DeepSpeed's
    `init_distributed()`, ignite, accelerate, Lightning, a bare `dist.init_process_group(
    "gloo")` (env://, on MASTER_PORT). Not torchrun's own TORCHELASTIC_* variables: a process
    started inside a rank is not taken for a launched rank (harness.settings.torchrun_env)."""
    env = {"RANK": rank, "LOCAL_RANK": rank, "GROUP_RANK": 0, "ROLE_RANK": rank,
           "WORLD_SIZE": world_size, "LOCAL_WORLD_SIZE": world_size,
           "ROLE_WORLD_SIZE": world_size, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": master_port}
    return {name: str(value) for name, value in env.items()}


_exits_after_test = False  # a fresh rank: this process ends (os._exit) once its test is done
_groups_kept_to_exit: List[Any] = []


def destroy_default_group() -> None:
    """`dist.destroy_process_group()` for the harness's own teardown of a rank's group. In a
    fresh rank, which ends with `os._exit` right after its test, the group object is kept, so
    that its destructor never runs: gloo's waits on its threads and connections (about 20 ms
    a rank, a third of a trivial test), and the process's exit frees all of it anyway."""
    if _exits_after_test and dist.is_initialized():
        _groups_kept_to_exit.append(dist.group.WORLD)
    dist.destroy_process_group()


def main(spec: RankSpec, channel: Connection) -> None:
    """Entry point of a rank process: run the test once and exit without interpreter teardown.

    A test class's test runs through its `_run` (upstream's entry point: a suite's override
    runs too), which builds the instance and hands it to `RankRun.run` via `run_test`; a
    front end's rank program (harness/pytest_plugin/rank_program.py) is handed to it directly.
    """
    global _exits_after_test
    _exits_after_test = True
    _set_up_process(spec)
    job = spec.job
    rank_run = RankRun(spec, spec.file_name, ReportingResult(channel), channel, job.inputs)
    try:
        cls = job.program()
        if not isinstance(cls, type) or not issubclass(cls, unittest.TestCase):
            rank_run.run(cls(job.method))  # a front end's rank program (a pytest function's)
        else:
            # Upstream's entry point, which suites override. `fake_pg` only where the class
            # asks for it: an override of `_run` written before upstream added the argument
            # (apex's, four parameters) runs as it did then.
            extra = {"fake_pg": True} if job.fake_pg else {}
            cls._run(spec.rank, job.method, spec.file_name, rank_run, **extra)
    except SystemExit as exit_:
        if exit_.code not in (0, None):  # sys.exit(0) outside the test: the rank passed
            err = sys.exc_info()
            skip = _skip_reason(err)
            channel.send(raised_event(err) if skip is None else Event("skip", skip))
    except Exception:
        channel.send(raised_event(sys.exc_info()))
    channel.send(Event("done", count=rank_run.grid_points))
    _leave(channel)


class RankRun:
    """What a rank process hands its class's `_run` (upstream's `parent_pipe`): `run(case)`
    makes `case` this rank and runs it, its events reported to the parent."""

    def __init__(
        self, spec: RankSpec, file_name: str, result: ReportingResult, channel: Connection,
        inputs: Any = None,
    ) -> None:
        self._spec, self._file_name, self._result, self._channel = spec, file_name, result, channel
        self._inputs = inputs
        self.grid_points = 0

    def run(self, case: Any) -> None:
        spec, file_name = self._spec, self._file_name
        try:
            context = RankContext(
                spec.rank, spec.world_size, self._result, init_method=f"file://{file_name}",
                file_name=file_name,
                grid_sync=GridMeeting(f"{file_name}.grid", spec.world_size,
                                      getattr(case, "grid_sync_timeout", GRID_SYNC_TIMEOUT_S)),
                inputs=self._inputs,
            )
            case.attach_rank(context)
        except Exception:
            self._channel.send(raised_event(sys.exc_info()))
            return
        if _terminal:  # `--debug-rank`: say which test the person at the terminal steps through
            print(f"[harness] rank {spec.rank} runs {_id_as_the_user_knows_it(spec, case)}: "
                  "breakpoint() stops here", flush=True)
        with running_as_rank(case):
            case.run(self._result)
        self.grid_points = context.grid_points


@dataclass(frozen=True)
class Task:
    """One test for a shared rank to run, sent over its task pipe (harness/process/shared.py)."""

    method: str
    output_path: str  # this test's output file: each test's output is reported on its own
    file_name: str  # this test's own rendezvous path (the grid synchronisation lives beside it)
    inputs: Any = None  # what the job sends with the test (RankContext.inputs)


def serve(spec: RankSpec, channel: Connection, tasks: Connection) -> None:
    """Entry point of a shared rank process: set the class up once, then run each test sent.

    The class's SharedRankHooks (harness/launch/hooks.py) keep the class-specific part out of
    here: `shared_rank_start` (once: create the default group), `shared_rank_before_test` (the
    ranks meet) and `shared_rank_after_test` (False when the test left the rank unusable).
    Before a test, the rank reports "ready" (with the test's number) once past the meeting: a
    parent that never hears it knows the ranks cannot meet any more and starts new ones. A rank
    whose test passed goes to the next test's meeting at once (its peers are not inside a
    collective of the test, which the meeting's could be mistaken for), so that meeting overlaps
    the parent's own work; one whose test failed or skipped goes only once the next test
    arrives. A test that leaves process state behind (harness/process/leaks.py: each rank
    compares snapshots taken before and after it) fails, and the rank exits, so the next test
    starts on new ranks. When its pipe closes the rank exits.
    """
    _set_up_process(spec)
    cls: Any = None
    checks: FrozenSet[str] = frozenset()
    setup_problem: Optional[Event] = None
    try:
        cls = spec.job.program()
        checks = leaks.checks_for(cls)
        cls.shared_rank_start(spec.rank, spec.world_size, spec.file_name)
    except (Exception, SystemExit):
        err = sys.exc_info()
        skip = _skip_reason(err)
        setup_problem = raised_event(err) if skip is None else Event("skip", skip)
    output, met, number = spec.output_path, False, 0
    while True:
        try:
            task = tasks.recv()
        except EOFError:  # the parent ended the set
            _finish_set(cls)
            break
        if task.output_path != output:
            _capture_output(task.output_path)
            output = task.output_path
        if setup_problem is not None:
            channel.send(setup_problem)
            channel.send(Event("done"))
            continue
        if not met and not _meet(cls, channel, number):
            break
        passed, leaked = _run_shared_test(cls, spec, task, channel, checks)
        number += 1
        if leaked:  # the state it left must not reach the next test: new ranks for that one
            break
        # What the rank prints from here on (the next meeting: a peer that crashed shows up
        # there as a connection error) is not this test's output: keep it out of its report.
        output = f"{spec.output_path}.between"
        _capture_output(output)
        if not cls.shared_rank_after_test():
            break
        met = passed and _meet(cls, channel, number)
        if passed and not met:
            break
    _leave(channel)


def _finish_set(cls: Any) -> None:
    """The set ends without a fault: the class undoes what the set kept (errors go to the
    rank's output: no test is left to report them)."""
    if cls is None:
        return
    try:
        cls.shared_rank_finish()
    except Exception:
        traceback.print_exc()


def _meet(cls: SharedRankHooks, channel: Connection, number: int) -> bool:
    """The ranks' meeting before test `number`; False (with why, in the output) if it failed."""
    try:
        cls.shared_rank_before_test()
    except Exception:
        traceback.print_exc()
        return False
    channel.send(Event("ready", count=number))
    return True


def _run_shared_test(
    cls: Any, spec: RankSpec, task: Task, channel: Connection, checks: FrozenSet[str]
) -> Tuple[bool, bool]:
    """Run one test in a shared rank (already past the meeting): whether it passed here, and
    whether it left process state behind (harness/process/leaks.py), which fails it."""
    if "generator" in checks:  # as the rank's set-up will: one that draws nothing leaves it so
        torch.default_generator.manual_seed(current_seed())
    before = leaks.snapshot(checks, cls.pg)
    result = ReportingResult(channel, hold_success=True)
    rank_run = RankRun(spec, task.file_name, result, channel, task.inputs)
    name, waived = task.method, frozenset()
    try:
        case = cls(task.method)
        rank_run.run(case)
        name, waived = case.reported_name(), case.waived_leak_checks()
    except Exception:
        channel.send(raised_event(sys.exc_info()))
    # a check not taken after the test (waived) is not compared
    leak = leaks.leak_event(name, before, leaks.snapshot(checks - waived, cls.pg))
    report = [leak] if leak is not None else []
    channel.send([*result.held, *report, Event("done", count=rank_run.grid_points)])  # one message
    return result.passed and leak is None, leak is not None


class GridMeeting:
    """The ranks' meeting after each grid point, through a store at `path`.

    A store, not a collective, so ranks still meet when a failed point left the process
    group unusable. The last rank to arrive writes the verdict "go"; a rank that waited
    `timeout` seconds in vain (a peer is stuck, say in a collective with a rank that
    failed) writes "abandoned" instead. The first verdict written wins, so every rank
    takes the same decision: go on with the grid, or end it (False).
    """

    def __init__(self, path: str, world_size: int, timeout: float) -> None:
        self._path = path
        self._world_size = world_size
        self._timeout = timeout
        self._store: Any = None
        self._points = 0

    def __call__(self, params: Dict[str, Any], passed: bool) -> bool:
        if self._store is None:  # only tests with a grid create the store's file
            self._store = dist.FileStore(self._path, self._world_size)
        store, point = self._store, f"point{self._points}"
        self._points += 1
        if store.add(f"{point}/arrived", 1) == self._world_size:
            store.compare_set(f"{point}/verdict", "", "go")
        try:
            store.wait([f"{point}/verdict"], timedelta(seconds=self._timeout))
        except RuntimeError:
            pass
        return store.compare_set(f"{point}/verdict", "", "abandoned") == b"go"


def _set_up_process(spec: RankSpec) -> None:
    # Keep the garbage collector out of the objects inherited from the forkserver: a full
    # collection would walk every one of them and so copy much of the preloaded heap.
    gc.freeze()
    # Before any thread starts, so that only the thread serving dumps ever receives it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {COLLECTIVES_SIGNAL})
    _serve_collective_dumps(collectives_path(spec.output_path))
    _die_with_parent(spec.work_dir)
    _capture_output(spec.output_path)
    _prepare_process(spec)
    if spec.env.get(DEBUG_RANK_ENV) == str(spec.rank):
        _use_terminal(spec)


def _leave(channel: Connection) -> None:
    channel.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skips atexit handlers and destructors (e.g. of a process group the test left behind),
    # which can hang or take longer than the test itself; everything was reported above.
    os._exit(0)


def collectives_path(output_path: str) -> str:
    """Where a rank writes its flight-recorder dump when the parent asks for it."""
    return f"{output_path}.collectives.json"


def _serve_collective_dumps(path: str) -> None:
    """Start the thread that writes the collectives this rank entered when the parent asks.

    A thread, not a signal handler: a rank stuck in a collective is inside C++ with the GIL
    released, where a Python handler of the main thread would never run.
    """
    threading.Thread(
        target=_dump_collectives_on_request, args=(path,), name="harness-collectives",
        daemon=True,
    ).start()


def _dump_collectives_on_request(path: str) -> None:
    while True:
        signal.sigwait({COLLECTIVES_SIGNAL})
        text = compat_flight_recorder.dump_json()
        if text is None:
            continue
        with open(f"{path}.tmp", "w") as f:
            f.write(text)
        os.replace(f"{path}.tmp", path)  # the parent never reads half a dump


def _die_with_parent(work_dir: str) -> None:
    """Make sure this rank cannot outlive the test process, however that process ends.

    PR_SET_PDEATHSIG covers the spawn start method, where the test process is our parent.
    With the forkserver our parent is the forkserver, which outlives a killed test process
    while ranks hold it open, so a thread also watches the sentinel multiprocessing keeps
    for the process that started us (the test process); when it closes, the thread removes
    the test's private dir (the dead parent cannot) and kills this rank.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    starter = parent_process()
    if starter is not None:
        threading.Thread(
            target=_clean_up_when_orphaned, args=(starter.sentinel, work_dir),
            name="harness-lifeline", daemon=True,
        ).start()


def _clean_up_when_orphaned(sentinel: int, work_dir: str) -> None:
    wait([sentinel])
    # A peer may still be creating its output file in the dir: remove until it stays gone.
    for _ in range(50):
        shutil.rmtree(work_dir, ignore_errors=True)
        if not os.path.exists(work_dir):
            break
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)


def without_lifeline(stack: str) -> str:
    """A faulthandler dump without the harness's helper threads, the same in every rank."""
    helpers = (_clean_up_when_orphaned.__name__, _dump_collectives_on_request.__name__)
    blocks = stack.split("\n\n")
    return "\n\n".join(b for b in blocks if not any(f"in {h}" in b for h in helpers))


def _use_terminal(spec: RankSpec) -> None:
    """`--debug-rank`: give this rank the terminal (stdin, stdout, stderr), so that
    `breakpoint()` and pdb work in it; its output then goes there instead of the report."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR)
    except OSError:
        print(f"--debug-rank {spec.rank}: no terminal (/dev/tty) to give this rank", flush=True)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    for target in (0, 1, 2):
        os.dup2(fd, target)
    os.close(fd)
    sys.stdin = open(0, closefd=False)  # multiprocessing gave the rank /dev/null
    _terminal.append(True)
    print(f"[harness] rank {spec.rank} has this terminal", flush=True)


def _id_as_the_user_knows_it(spec: RankSpec, case: Any) -> str:
    """The test's id under the supervisor's module name (a rank imports a main script as
    `__mp_main__`, where the user ran `__main__`)."""
    test_id, module = case.id(), type(case).__module__
    return spec.job.module + test_id[len(module):] if test_id.startswith(f"{module}.") else test_id


_terminal: List[bool] = []  # non-empty once this rank has the terminal (`--debug-rank`)


def _capture_output(path: str) -> None:
    """Send this process's fds 1 and 2 (so C++ and child output too) to its private file."""
    if _terminal:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)  # lines reach the file even if the rank is killed


def _prepare_process(spec: RankSpec) -> None:
    """Per-rank process settings: environment, stack dumps, loopback gloo, thread count."""
    # The forkserver's environment is frozen at its start; use the test process's current one.
    os.environ.clear()
    os.environ.update(spec.env)
    os.environ.update(launcher_environment(spec.rank, spec.world_size, spec.master_port))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    assert_rewrite.install(spec.env)  # under pytest, test modules imported here are rewritten
    compat_flight_recorder.enable()  # so a hang report can say which collective each rank is in
    # HARNESS_ALLOW_CPU: the CPU analogs of torch's accelerator defaults
    compat_cpu_defaults.PROCESS_ADAPTATIONS.install()
    # Ctrl-C reaches the whole process group; the parent decides and stops the ranks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.enable(all_threads=True)
    faulthandler.register(STACK_SIGNAL, all_threads=True, chain=False)
    # Temp files of the test land in the test's private dir, removed even if the rank is killed.
    tempfile.tempdir = spec.temp_dir
    torch.set_num_threads(spec.threads)


def _skip_reason(err: Tuple[Any, Any, Any]) -> Optional[str]:
    """Why setting a rank up skipped: SkipTest, or `sys.exit` with a skip code; else None."""
    if err[0] is not None and issubclass(err[0], unittest.SkipTest):
        return str(err[1])
    return skip_exit_reason(err)
