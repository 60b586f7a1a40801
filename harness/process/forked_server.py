"""multiprocessing's forkserver started as a fork of this process, not as a new interpreter.

A new interpreter imports torch and the test code again before it can fork a rank (seconds
of CPU); a fork of a process that has imported them has them already. multiprocessing has
no such mode, so this sets up what `ForkServer.ensure_running` would (the listening socket,
the pipe whose EOF stops the server, the resource tracker) around `os.fork`. Only the
standard library is imported here: the harness's own tests use it on upstream's side too.

Whether forking is safe at the moment is the caller's decision (no other thread running, no
accelerator runtime initialised); `supported()` says whether this Python's forkserver
protocol is the one set up here (later ones authenticate their clients).
"""

from __future__ import annotations

import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import socket
import sys
import threading
from multiprocessing import connection
from typing import Callable


def supported() -> bool:
    """Whether this platform can fork and this Python's forkserver needs no more than a
    socket and an alive pipe."""
    server = multiprocessing.forkserver._forkserver
    return hasattr(os, "fork") and not hasattr(server, "_forkserver_authkey")


def fork_forkserver(serve: Callable[[int, int], None]) -> bool:
    """Fork the forkserver now, unless one runs: the child calls `serve(listener_fd,
    alive_r)` (which runs `multiprocessing.forkserver.main`) and exits when it returns,
    without this process's exit hooks. Returns whether it forked one."""
    server = multiprocessing.forkserver._forkserver
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
