"""The harness's own forkserver, on multiprocessing's private machinery (fenced here).

multiprocessing keeps one forkserver per process (`multiprocessing.forkserver._forkserver`),
shared by everything in it that asks for the "forkserver" start method: a user's own pool, a
DataLoader's workers, on Python 3.14 every default `multiprocessing` pool. A harness that
used it would slow its ranks down whenever the user's code started it first (without torch
and the test code preloaded: seconds a rank), and force its preloads (torch, the harness) on
the user's own workers. So the harness runs a second server of the same kind, its own
`ForkServer` instance with its own socket, alive pipe and preload list, and starts its ranks
through `context()`, whose processes ask that server, never the process-wide one. The
resource tracker stays multiprocessing's one per process: it frees what any child leaked.

A server is either started as an interpreter (`ensure_running`, what multiprocessing does)
or forked from this process (`fork_server`), which spares it importing torch and the test
code again: multiprocessing has no such mode, so this sets up what `ensure_running` would
(the listening socket, the pipe whose EOF stops the server, the resource tracker) around
`os.fork`. Whether forking is safe at the moment is the caller's decision; `can_fork()` says
whether this Python's forkserver protocol is the one set up here (later ones authenticate
their clients). Only the standard library is imported here: the harness's own tests use
`fork_server` on upstream's side too, with multiprocessing's own server.

Every private name of multiprocessing the harness reads or writes is in this module.
"""

from __future__ import annotations

import io
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.popen_forkserver
import multiprocessing.process
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import socket
import sys
import threading
import warnings
from multiprocessing import connection, reduction, spawn
from typing import Any, Callable, Dict, List, Optional

ForkServer = multiprocessing.forkserver.ForkServer
PROCESS_WIDE = multiprocessing.forkserver._forkserver  # the one the user's own code gets
SERVER = ForkServer()  # the harness's: its ranks only


class _Popen(multiprocessing.popen_forkserver.Popen):
    """Starts a process through the harness's SERVER (multiprocessing's asks PROCESS_WIDE).

    The child side is multiprocessing's own: the server forks, the child reads the pickled
    process from the pipe and runs it."""

    def _launch(self, process_obj: Any) -> None:
        preparation = spawn.get_preparation_data(process_obj._name)
        payload = io.BytesIO()
        multiprocessing.context.set_spawning_popen(self)
        try:
            reduction.dump(preparation, payload)
            reduction.dump(process_obj, payload)
        finally:
            multiprocessing.context.set_spawning_popen(None)
        self.sentinel, data_w = SERVER.connect_to_new_process(self._fds)
        # the child learns that this process died when every copy of this write end closed
        parent_w = os.dup(data_w)
        self.finalizer = multiprocessing.util.Finalize(
            self, multiprocessing.util.close_fds, (parent_w, self.sentinel)
        )
        with open(data_w, "wb", closefd=True) as pipe:
            pipe.write(payload.getbuffer())
        self.pid = multiprocessing.forkserver.read_signed(self.sentinel)


class Process(multiprocessing.process.BaseProcess):
    """A process forked by the harness's own server."""

    _start_method = "forkserver"

    @staticmethod
    def _Popen(process_obj: Any) -> _Popen:
        return _Popen(process_obj)


class _Context(multiprocessing.context.ForkServerContext):
    Process = Process  # type: ignore[assignment]


_CONTEXT = _Context()


def context() -> Any:
    """The multiprocessing context whose processes start from the harness's SERVER (pipes,
    queues and the rest as the "forkserver" context's)."""
    return _CONTEXT


def set_preload(modules: List[str]) -> None:
    """What the harness's server imports when started as an interpreter."""
    SERVER.set_forkserver_preload(modules)


def ensure_running(stderr_path: str) -> None:
    """Start the harness's server as an interpreter, unless it runs, with its stderr (what it
    prints if it cannot start, and what a rank prints before it captures its own) appended
    to `stderr_path`."""
    pid = SERVER._forkserver_pid
    if pid is not None and hasattr(os, "waitid"):
        try:  # alive: nothing to start (WNOWAIT: a dead one stays for ensure_running to reap)
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                return
        except ChildProcessError:
            pass
    saved = stderr_into(stderr_path)  # what the server inherits; ours back at once
    try:
        SERVER.ensure_running()
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def stderr_into(path: str) -> int:
    """Point this process's stderr (fd 2) at `path`, emptied first: one server's output, not
    an earlier one's. Returns a copy of what fd 2 was, for the caller to restore or close."""
    saved = os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    os.dup2(log, 2)
    os.close(log)
    return saved


def can_fork() -> bool:
    """Whether this platform can fork and this Python's forkserver needs no more than a
    socket and an alive pipe."""
    return hasattr(os, "fork") and not hasattr(SERVER, "_forkserver_authkey")


def fork_server(serve: Callable[[int, int], None], server: ForkServer = SERVER) -> bool:
    """Fork `server` now, unless it runs: the child calls `serve(listener_fd, alive_r)`
    (which ends in `serve_requests`) and exits when it returns, without this process's exit
    hooks. Returns whether it forked one."""
    with server._lock:
        if server._forkserver_pid is not None:
            return False
        multiprocessing.resource_tracker.ensure_running()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()  # else the server and every rank would write it again
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")
            listener.bind(address)
            os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()
            with warnings.catch_warnings():  # 3.12+: "process is multi-threaded": the
                warnings.simplefilter("ignore", DeprecationWarning)  # caller judged it safe
                pid = os.fork()
            if pid == 0:
                try:
                    server._lock = threading.Lock()  # held in the parent when it forked
                    os.close(alive_w)
                    serve(listener.fileno(), alive_r)
                finally:
                    os._exit(0)
            os.close(alive_r)
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid
    return True


def serve_requests(listener_fd: int, alive_r: int) -> None:
    """In a forked server: multiprocessing's server loop, until the alive pipe closes.

    The fork copied this process's view of the other servers: the process-wide one a user's
    pool may have started (its pid, socket and alive pipe) and the harness's own (locked,
    half set up). Forgotten here, so that neither keeps the user's server alive, nor does a
    rank's own forkserver pool try to use or reap a server that is not its parent's."""
    for server in (PROCESS_WIDE, SERVER):
        alive_fd = server._forkserver_alive_fd
        server._forkserver_address = server._forkserver_alive_fd = None
        server._forkserver_pid = None
        server._lock = threading.Lock()
        if alive_fd is not None:
            try:
                os.close(alive_fd)
            except OSError:
                pass
    multiprocessing.forkserver.main(listener_fd, alive_r, [])


def server_address() -> Optional[str]:
    """In a server process: the path of the socket it listens on (None if abstract)."""
    address = PROCESS_WIDE._forkserver_address  # multiprocessing's main() sets it there
    return address if isinstance(address, str) and not address.startswith("\0") else None


def helper_pids() -> Dict[str, int]:
    """The helper processes of this process that the harness owns or shares: its forkserver,
    and multiprocessing's resource tracker."""
    pids = {
        "forkserver": SERVER._forkserver_pid,
        "resource tracker": multiprocessing.resource_tracker._resource_tracker._pid,
    }
    return {name: pid for name, pid in pids.items() if pid is not None}


def detach_server() -> Optional[int]:
    """Forget the harness's server and tell it to stop: its socket is removed first (which
    tells it the stop was deliberate, so it leaves multiprocessing's temp folder to this
    living process), then its alive pipe closed. Returns its pid, for the caller to reap."""
    with SERVER._lock:
        address, alive_fd = SERVER._forkserver_address, SERVER._forkserver_alive_fd
        pid = SERVER._forkserver_pid
        SERVER._forkserver_address = SERVER._forkserver_alive_fd = None
        SERVER._forkserver_pid = None
        if isinstance(address, str) and not address.startswith("\0"):
            try:
                os.unlink(address)
            except FileNotFoundError:
                pass
        if alive_fd is not None:
            os.close(alive_fd)  # the server exits when every holder of this pipe closed it
    return pid


def detach_resource_tracker() -> Optional[int]:
    """Forget multiprocessing's resource tracker and close its pipe (at EOF it frees what its
    clients leaked, then exits). Returns its pid, for the caller to reap."""
    tracker = multiprocessing.resource_tracker._resource_tracker
    with tracker._lock:
        fd, pid = tracker._fd, tracker._pid
        tracker._fd = tracker._pid = None
        if fd is not None:
            os.close(fd)
    return pid


def temp_dir() -> str:
    """multiprocessing's private temp folder for this process (a `pymp-*` folder, removed at
    exit; a server whose runner was killed removes it)."""
    return multiprocessing.util.get_temp_dir()


def after_fork(owner: object, hook: Callable[[Any], None]) -> None:
    """Call `hook(owner)` in every process forked from this one by multiprocessing."""
    multiprocessing.util.register_after_fork(owner, hook)


def original_dir() -> Optional[str]:
    """The working directory multiprocessing resolves a relative `__main__` path against."""
    return multiprocessing.process.ORIGINAL_DIR


def import_main_path(path: str) -> None:
    """Import a script as multiprocessing loads `__main__` in a child (`__mp_main__`)."""
    spawn.import_main_path(path)


def importing_main() -> bool:
    """Whether this process is a child that is importing its parent's `__main__` now."""
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))
