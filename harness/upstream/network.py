"""Ports, stores and transports for tests that set up their own rendezvous (upstream's
`common_utils.find_free_port`/`retry_on_connect_failures`, `common_distributed.create_tcp_store`,
`tp_transports`, `create_device`).

A port found free can be taken by another process before the test binds it; tests that
bind one retry on the connect errors named here, as upstream's do.
"""

from __future__ import annotations

import functools
import random
import shutil
import socket
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist

__all__ = [
    "ADDRESS_IN_USE", "CONNECT_TIMEOUT", "FILE_SCHEMA", "create_device", "create_tcp_store",
    "find_free_port", "retry_on_connect_failures", "tp_transports",
]

# Errors of c10d initialisation after which a test is retried.
ADDRESS_IN_USE = "Address already in use"
CONNECT_TIMEOUT = "connect() timed out."
FILE_SCHEMA = "file:///" if sys.platform == "win32" else "file://"
CONNECT_RETRIES = 10


def find_free_port() -> int:
    """A TCP port on localhost that nothing listens on now (bind to port 0, read it back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def retry_on_connect_failures(
    func: Optional[Callable] = None, connect_errors: Sequence[str] = (ADDRESS_IN_USE)
) -> Any:
    """Re-run the function (up to 10 times, after a random pause under a second) while it
    raises a RuntimeError containing one of `connect_errors`; then fail with the last one.

    Note upstream's default is the string itself, not a one-string tuple: an error counts when
    it contains any one character of it. Kept so that migrated tests retry as before.
    """
    if func is None:
        return functools.partial(retry_on_connect_failures, connect_errors=connect_errors)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        tries_left = CONNECT_RETRIES
        while True:
            try:
                return func(*args, **kwargs)
            except RuntimeError as error:
                if not any(connect_error in str(error) for connect_error in connect_errors):
                    raise
                tries_left -= 1
                if tries_left == 0:
                    raise RuntimeError(
                        f"Failing after {CONNECT_RETRIES} retries with error: {error}"
                    ) from error
                time.sleep(random.random())

    return wrapper


@retry_on_connect_failures
def create_tcp_store(
    addr: str = "localhost",
    world_size: int = 1,
    is_master: bool = True,
    timeout: timedelta = timedelta(minutes=5),
    wait_for_workers: bool = True,
    jit_class: bool = False,
    use_libuv: bool = True,
) -> Any:
    """A TCPStore on a free port (retried when the port was taken meanwhile)."""
    port = find_free_port()
    if jit_class:
        timeout_ms = int(timeout / timedelta(milliseconds=1))
        return torch.classes.dist_c10d.TCPStore(addr, port, world_size, is_master, timeout_ms)
    return dist.TCPStore(addr, port, world_size, is_master, wait_for_workers=wait_for_workers,
                         use_libuv=use_libuv)


@functools.cache
def _has_efa() -> bool:
    """Whether libfabric reports EFA interfaces (`fi_info -p efa -t FI_EP_RDM` succeeds)."""
    if shutil.which("fi_info") is None:
        return False
    try:
        done = subprocess.run(["fi_info", "-p", "efa", "-t", "FI_EP_RDM"], check=False,
                              capture_output=True)
    except OSError:
        return False
    return done.returncode == 0


def tp_transports() -> Optional[List[str]]:
    """TensorPipe transports for RPC: shm and uv where EFA is installed (its InfiniBand
    transport fails there), else None (TensorPipe's default)."""
    return ["shm", "uv"] if _has_efa() else None


def create_device(interface: Optional[str] = None, lazy_init: bool = False) -> Any:
    """A gloo device on loopback, or on `interface` when named."""
    if sys.platform == "win32" or interface is None:
        return dist.ProcessGroupGloo.create_device(hostname="127.0.0.1", lazy_init=lazy_init)
    return dist.ProcessGroupGloo.create_device(interface=interface, lazy_init=lazy_init)
