"""How rank processes start: a forkserver that already has torch and the test code imported.

The server is the harness's own (harness/process/mp_forkserver.py), not multiprocessing's
process-wide one: a user's own forkserver pool in the same process neither slows the ranks
(its server has not imported torch) nor gets the harness's preloads.

A rank forked from it starts in milliseconds; a spawned interpreter (the fallback,
HARNESS_START_METHOD=spawn) spends seconds importing torch. The forkserver is started once
per test process, with `_preload` imported; modules added by `preload()` after that are
imported by each rank itself. A runner (run_all.py, `run_tests()`, `python -m unittest`, and
the pytest plugin once collection ends, in each xdist worker too) starts it before its first
test as a fork of itself where that is safe (`start_as_fork`), sparing the import of torch
and the test code a started one spends; elsewhere it is started as an interpreter when the
first ranks start.

Python's forkserver is meant to preload the script that runs as `__main__` too, but up to
at least Python 3.12 the script's path never reaches it, so every rank would import the
script again (for a suite run as `python test_x.py`: the suite and all it imports, per rank,
per test). So harness/process/forkserver_main.py is preloaded last: imported in the forkserver
while MODULES_ENV names the test modules and MAIN_PATH_ENV the script, it imports them (the
script the way multiprocessing loads it in a child), and forked ranks find them imported.
(Last, so that the test code's own imports of `harness` find the package fully initialised.)

A script that starts ranks when it is imported (no `if __name__ == "__main__":` guard) would
start them again in the forkserver preloading it, or in a rank importing it, and so on without
end. `check_not_bootstrapping` stops such a forkserver or rank at once with
MISSING_GUARD_EXIT (as does a test module that exits while the forkserver imports it: it ran
its tests on import), and the runner that sees that code (`stopped_for_missing_guard`, or a
rank's exit code) ends the run with one line naming the missing guard (`exit_for_missing_guard`).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import multiprocessing
import os
import shutil
import signal
import sys
import threading
import time
import traceback
import types
import unittest
from typing import Any, Callable, Dict, FrozenSet, Iterable, Iterator, List, NoReturn, Optional

import torch

from harness import settings
from harness.compat.comparison import assert_close_imports_dtensor
from harness.process import assert_rewrite, mp_forkserver

MAIN_PATH_ENV = "HARNESS_FORKSERVER_MAIN"
MODULES_ENV = "HARNESS_FORKSERVER_MODULES"
RUNNER_ENV = "HARNESS_FORKSERVER_RUNNER"
# torch.cuda.is_available() initialises the CUDA driver (cudaGetDeviceCount) unless this is
# set, and a process forked after that cannot use CUDA ("Cannot re-initialize CUDA in forked
# subprocess"). Suites and their imports ask it at import time, in the forkserver too (as
# upstream's common_cuda does), so the forkserver asks NVML instead, which leaves forks clean.
NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"
HELPER_EXIT_WAIT_S = 5.0  # how long a stopped helper may take to exit before it is killed
ORPHAN_CHECK_S = 1.0  # how long the forkserver waits to learn whether its runner died
GROUP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# The exit code of a forkserver or rank that tried to start ranks while importing the test code.
MISSING_GUARD_EXIT = 113
MISSING_GUARD_EXIT_CODE = 2  # the run's exit code then: bad input
FORKSERVER_EXIT_WAIT_S = 1.0  # after its socket closed, how long the forkserver may take to exit
LOG_TAIL_CHARS = 4000  # of the forkserver's log, in the error of a test it could not serve

# What every rank would otherwise import itself, once per test; numpy and numpy.random (numpy
# 2 imports it lazily: about 15 ms in a fresh rank) because TestCase.setUp seeds it.
# torch.distributed.tensor (over a second) only where torch.testing.assert_close (every tensor
# assertEqual) would import it in each rank: not with the check of
# harness/compat/comparison.py; test code that uses DTensor brings it with its own imports.
# Missing modules are skipped.
_preload: List[str] = [
    "torch", "torch.distributed", "numpy", "numpy.random", "harness.single_process.testcase",
    "harness.process.rank",
]
_test_modules: List[str] = []  # the test code, imported last (by harness.process.forkserver_main)


def _native_threads() -> FrozenSet[str]:
    """This process's threads as the kernel lists them (Python's and native ones)."""
    try:
        return frozenset(os.listdir("/proc/self/task"))
    except OSError:  # no /proc: never counted as safe to fork
        return frozenset(["unknown"])


# Threads running once torch is imported (numpy's BLAS pool, which forks safely). One started
# later may be OpenMP's pool, after which a forked child hangs in its first parallel region.
_THREADS_AT_IMPORT = _native_threads()


def _server_preload() -> List[str]:
    """What a forkserver imports before the test code, started or forked."""
    dtensor = ["torch.distributed.tensor"] if assert_close_imports_dtensor() else []
    return [*_preload, *dtensor]


def preload(*modules: str) -> None:
    """Import these modules in the forkserver too, so ranks do not import them per test.

    Takes effect only before the first multi-process test of this process starts the
    forkserver (a runner calls it with every suite module it is about to run).
    """
    _test_modules.extend(m for m in modules if m not in _test_modules and m != "__main__")


def context(test_module: str) -> Any:
    """The multiprocessing context ranks start from, with the forkserver running if used."""
    check_not_bootstrapping()
    if _missing_guards:  # under pytest, caught by the module's own import-time unittest run
        exit_for_missing_guard(test_module)  # the run ends: no server started for nothing
    if settings.start_method() != "forkserver":
        return multiprocessing.get_context("spawn")
    preload(test_module)
    mp_forkserver.set_preload([*_server_preload(), "harness.process.forkserver_main"])
    _ensure_running()
    return mp_forkserver.context()


def warm_up(test_module: str) -> None:
    """Start the forkserver for `test_module` and wait until it has preloaded and can fork
    ranks (a runner does this before a test's own time starts); at once if it runs."""
    if settings.start_method() == "forkserver" and "forkserver" not in helper_pids():
        probe = context(test_module).Process(target=os.getpid, name="harness-forkserver-probe")
        try:
            probe.start()
        except (EOFError, OSError):
            if stopped_for_missing_guard():
                exit_for_missing_guard(test_module)
            raise
        probe.join()
        probe.close()


def _main_script() -> Optional[str]:
    """The path multiprocessing re-imports in a child as `__main__`, if it is a script."""
    main = sys.modules["__main__"]
    path = getattr(main, "__file__", None)
    if getattr(getattr(main, "__spec__", None), "name", None) is not None or path is None:
        return None
    if not os.path.isabs(path) and mp_forkserver.original_dir() is not None:
        path = os.path.join(mp_forkserver.original_dir(), path)
    return os.path.normpath(path)


def _ensure_running() -> None:
    """Start the forkserver if needed, with MAIN_PATH_ENV naming the script it should load,
    RUNNER_ENV naming this process (how the forkserver knows it is one, and whose child), and
    NVML_CHECK_ENV keeping CUDA checks at import from spoiling its forks; MODULES_ENV names
    the test modules it should import."""
    script = _main_script()
    settings = {
        RUNNER_ENV: str(os.getpid()),
        MAIN_PATH_ENV: script,
        MODULES_ENV: ",".join(_test_modules),
        **assert_rewrite.settings(),
    }
    if NVML_CHECK_ENV not in os.environ:
        settings[NVML_CHECK_ENV] = "1"
    saved = {name: os.environ.get(name) for name in settings}
    for name, value in settings.items():
        if value is not None:
            os.environ[name] = value
    try:
        mp_forkserver.ensure_running(server_log())
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def start_as_fork(modules: Iterable[str]) -> bool:
    """Start the forkserver now as a fork of this process, when that is safe; returns whether
    it did (else it starts as before, an interpreter importing torch and the test code
    again, when the first ranks start).

    A runner calls this once its tests are loaded and before it runs any: the fork then
    holds what a started forkserver imports (`_preload`, the test `modules`; the script is
    imported afresh in it) and nothing a test or fixture did, and the run spares an import
    of torch. Safe means: no other thread runs here (a fork could inherit a held lock, or
    OpenMP's pool, which hangs a forked child in its first parallel region), and torch has
    no accelerator runtime built in (one initialised here would fail in every fork).
    """
    if (
        settings.start_method() != "forkserver" or "forkserver" in helper_pids()
        or not mp_forkserver.can_fork() or _accelerator_built()
    ):
        return False
    preload(*modules)
    for name in _server_preload():
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    if any(name not in sys.modules for name in _test_modules):
        return False  # one that failed to import: the ranks import it and report the error
    if threading.active_count() != 1 or not _native_threads() <= _THREADS_AT_IMPORT:
        return False
    runner, log = os.getpid(), server_log()
    return mp_forkserver.fork_server(lambda listener, alive: _serve(listener, alive, runner, log))


def start_as_fork_under_unittest_main() -> None:
    """Under `python -m unittest`, have its command line call `start_as_fork` once it has
    loaded the tests and before it runs any, as run_tests() and run_all.py do themselves.
    Only there: the program that `python -m unittest` made (not one a module makes while
    imported, whose tests would then run in a forkserver holding that module half-imported)."""
    main = sys.modules.get("__main__")
    program = unittest.TestProgram
    if getattr(getattr(main, "__spec__", None), "name", None) != "unittest.__main__" or (
        getattr(program.runTests, "starts_forkserver", False)
    ):
        return
    run_tests = program.runTests

    def run_tests_from_a_forked_forkserver(self: unittest.TestProgram) -> None:
        if self.module is None:  # loaded by name from the command line
            start_as_fork({type(test).__module__ for test in _tests_of(self.test)})
        run_tests(self)

    run_tests_from_a_forked_forkserver.starts_forkserver = True  # type: ignore[attr-defined]
    program.runTests = run_tests_from_a_forked_forkserver  # type: ignore[method-assign]


def _tests_of(suite: Any) -> Iterator[unittest.TestCase]:
    if isinstance(suite, unittest.TestSuite):
        for item in suite:
            yield from _tests_of(item)
    else:
        yield suite


def _accelerator_built() -> bool:
    version = torch.version
    return any(getattr(version, name, None) is not None for name in ("cuda", "hip", "xpu"))


def _serve(listener_fd: int, alive_r: int, runner: int, log: str) -> None:
    """The forked forkserver: the stderr, signal handling and `__main__` a started one has
    (not the runner's handlers, nor the script's module as the runner left it), then
    multiprocessing's loop, then the exit a started one has (clean_up_when_orphaned). If it
    cannot get that far, why is in its log (`server_log`) for the test that needed it."""
    os.close(mp_forkserver.stderr_into(log))  # nothing to restore: this is the server
    sys.stderr = open(2, "w", closefd=False)  # the process's own stderr, never closed
    try:
        _set_up_forked_server(runner)
    except BaseException:  # noqa: BLE001 - a forkserver that cannot serve says why and exits
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    try:
        mp_forkserver.serve_requests(listener_fd, alive_r)
    finally:
        _forkserver_exit(os.getpid(), runner)


def _set_up_forked_server(runner: int) -> None:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # what the ranks start with
    # what the runner (pytest) may have hooked in: a rank reports as a new interpreter would
    sys.unraisablehook, threading.excepthook = sys.__unraisablehook__, threading.__excepthook__
    for signum in GROUP_SIGNALS:
        signal.signal(signum, _outlive_group_signal)
    mp_forkserver.after_fork(_RANK_HOOK, _default_group_signals)
    os.environ[RUNNER_ENV] = str(runner)  # for check_not_bootstrapping while it imports
    assert_rewrite.install(assert_rewrite.settings())  # the explainer pytest sets per test
    script = _main_script()
    if script is not None:
        sys.modules["__main__"] = types.ModuleType("__main__")
        _import_test_code(mp_forkserver.import_main_path, script)


def server_log() -> str:
    """Where the forkserver's stderr goes: why it could not start or fork a rank, for the test
    that needed it (`ForkserverError`); in multiprocessing's temp folder, removed at exit."""
    return os.path.join(mp_forkserver.temp_dir(), "harness-forkserver.log")


class ForkserverError(RuntimeError):
    """The forkserver could not start a rank (it died, or never got to serve)."""


def forkserver_error(error: BaseException) -> ForkserverError:
    """The error a test gets when its ranks could not be started: what went wrong here, and
    the end of what the forkserver wrote (its traceback)."""
    try:
        with open(server_log(), errors="replace") as log:
            written = log.read()[-LOG_TAIL_CHARS:].strip()
    except OSError:
        written = ""
    said = f"; it wrote:\n{written}" if written else " (it wrote nothing)"
    return ForkserverError(
        f"the harness's forkserver could not start a rank ({type(error).__name__}: {error})"
        f"{said}"
    )


def load_test_code_in_forkserver() -> None:
    """In the forkserver (MAIN_PATH_ENV or MODULES_ENV set): import the test modules and the
    script ranks would import. One that fails to import is left to the ranks, which import it
    again and report the error; one that exits while imported ran its tests on import."""
    modules = [name for name in os.environ.get(MODULES_ENV, "").split(",") if name]
    assert_rewrite.install(dict(os.environ))  # under pytest: their asserts as pytest has them
    for name in modules:
        _import_test_code(importlib.import_module, name)
    path = os.environ.get(MAIN_PATH_ENV)
    if path and getattr(sys.modules["__main__"], "__file__", None) != path:
        _import_test_code(mp_forkserver.import_main_path, path)


def _import_test_code(load: Callable[[str], Any], name: str) -> None:
    """Import quietly: what the code prints at import the runner printed already, and what a
    script without its guard prints (unittest's `Ran 0 tests`) is noise before the error."""
    try:
        with _silenced():
            load(name)
    except SystemExit:
        os._exit(MISSING_GUARD_EXIT)
    except Exception:  # noqa: BLE001 - each rank imports it again and reports the error
        return


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
    """stdout and stderr into /dev/null at the descriptor level, so that a stream the code
    keeps (a logging handler made at import) is still sys.stderr, writing where it should
    in the ranks forked later."""
    streams = [stream for stream in (sys.stdout, sys.stderr) if stream is not None]
    for stream in streams:
        stream.flush()
    saved, null = [os.dup(1), os.dup(2)], os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        for stream in streams:
            try:
                stream.flush()
            except (OSError, ValueError):  # closed by the code: nothing buffered to drop
                pass
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def check_not_bootstrapping() -> None:
    """Exit at once (MISSING_GUARD_EXIT, nothing printed) if this process is the forkserver
    preloading the test code, or a rank importing it before it runs: the code starts ranks
    when imported, and each rank started here would import it and start more."""
    in_forkserver = os.environ.get(RUNNER_ENV) == str(os.getppid())  # only it has that parent
    if in_forkserver or mp_forkserver.importing_main():
        os._exit(MISSING_GUARD_EXIT)


def stopped_for_missing_guard() -> bool:
    """Whether this process's forkserver exited with MISSING_GUARD_EXIT (left unreaped)."""
    pid = helper_pids().get("forkserver")
    if pid is None or not hasattr(os, "waitid"):
        return False
    deadline = time.monotonic() + FORKSERVER_EXIT_WAIT_S
    while True:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return False
        if info is not None:
            return info.si_code == os.CLD_EXITED and info.si_status == MISSING_GUARD_EXIT
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


_missing_guards: List[str] = []  # under pytest: the line of each missing guard found


def missing_guard_seen() -> Optional[str]:
    """Under pytest: the line of a missing guard found so far, if any. A module that runs its
    tests when pytest imports it to collect them (`unittest.main(exit=False)`) catches the
    `pytest.exit` as one of its tests' errors; the plugin ends the session with it instead."""
    return _missing_guards[0] if _missing_guards else None


def exit_for_missing_guard(module: str) -> NoReturn:
    """End the run now with one line naming the missing guard of `module`'s file.

    Not an exception a test reports: the test framework would start the next test, which
    would fail the same way. Under pytest (which captures stderr) it is pytest's own
    `pytest.exit`, which ends the session with the line and code 2 (also when a module's
    import-time unittest run caught it: `missing_guard_seen`); elsewhere the line goes to
    stderr and the process exits once its exit handlers ran (temp dirs, helpers).
    """
    source = getattr(sys.modules.get(module), "__file__", None) or module
    message = (
        f"error: {source} starts ranks when it is imported, and the forkserver and every rank "
        'import it again: put the code that runs its tests under `if __name__ == "__main__":`'
    )
    stop_helpers({})  # reaps the forkserver that stopped itself
    pytest = sys.modules.get("pytest")
    if pytest is not None and os.environ.get("PYTEST_VERSION"):  # a pytest session runs
        _missing_guards.append(message)
        pytest.exit(message, returncode=MISSING_GUARD_EXIT_CODE)
    sys.stdout.flush()
    print(message, file=sys.stderr, flush=True)
    atexit._run_exitfuncs()
    os._exit(MISSING_GUARD_EXIT_CODE)


def helper_pids() -> Dict[str, int]:
    """The helper processes this process runs now: the harness's forkserver, and
    multiprocessing's resource tracker."""
    return mp_forkserver.helper_pids()


def stop_helpers(keep: Dict[str, int]) -> None:
    """Stop and reap the helpers running now that are not in `keep` (what ran before the run)."""
    running = helper_pids()
    if running.get("forkserver") not in (None, keep.get("forkserver")):
        _reap(mp_forkserver.detach_server())
    if running.get("resource tracker") not in (None, keep.get("resource tracker")):
        _reap(mp_forkserver.detach_resource_tracker())


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _reap(pid: Optional[int]) -> None:
    """Wait for a child to exit; kill it if it has not after HELPER_EXIT_WAIT_S."""
    if pid is None:
        return
    deadline = time.monotonic() + HELPER_EXIT_WAIT_S
    try:
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() >= deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return
            time.sleep(0.005)
    except ChildProcessError:  # already reaped
        return


def clean_up_when_orphaned() -> None:
    """In the forkserver (started by the RUNNER_ENV process): on exit, if the runner died
    without stopping it, remove the runner's multiprocessing temp folder (the socket's
    `pymp-*`); then reap the ranks and exit at once (skipping the second or so the
    interpreter would spend tearing torch down). Anywhere else: nothing."""
    runner = os.environ.get(RUNNER_ENV, "")
    if runner.isdigit():  # the runner may have died already, while we were preloading
        atexit.register(_forkserver_exit, os.getpid(), int(runner))
        for signum in GROUP_SIGNALS:
            signal.signal(signum, _outlive_group_signal)
        mp_forkserver.after_fork(_RANK_HOOK, _default_group_signals)


class _AfterFork:
    """The (weakly referenced) owner of the after-fork hook below."""


_RANK_HOOK = _AfterFork()


def _outlive_group_signal(signum: int, frame: Any) -> None:
    """SIGTERM/SIGHUP sent to the whole process group (`timeout`, a CI runner, a closed
    terminal) reach the forkserver too. It stays, to reap its ranks (which die of the signal),
    until the runner, which got the same signal, stops it; or until it learns the runner died."""


def _default_group_signals(hook: _AfterFork) -> None:
    """In each rank forked from the forkserver: SIGTERM and SIGHUP kill it again."""
    for signum in GROUP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)


def _forkserver_exit(pid: int, runner: int) -> None:
    if os.getpid() != pid:  # a process forked from the forkserver (they exit via os._exit)
        return
    address = mp_forkserver.server_address()
    if address is not None and os.path.exists(address):  # not stopped by stop_helpers
        folder = os.path.dirname(address)
        if _runner_gone(runner) and os.path.basename(folder).startswith("pymp-"):
            shutil.rmtree(folder, ignore_errors=True)
        else:
            _remove(address)
    _reap_children()
    os._exit(0)


def _runner_gone(runner: int) -> bool:
    """Whether the process that started the forkserver has died (we were re-parented). The
    kernel closes a dying process's pipes just before it re-parents its children, so a
    forkserver woken by that may still see the old parent for a moment."""
    deadline = time.monotonic() + ORPHAN_CHECK_S
    while os.getppid() == runner:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def _reap_children() -> None:
    """Reap the forkserver's exited ranks, so none is left a zombie when it exits."""
    deadline = time.monotonic() + HELPER_EXIT_WAIT_S
    try:
        while time.monotonic() < deadline:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                time.sleep(0.005)
    except ChildProcessError:  # no children left
        return
