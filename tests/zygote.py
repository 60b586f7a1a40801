"""`python ARGS` for the harness's own tests, forked from a zygote that has imported torch.

Most of the tests start `python SCRIPT` (run_all.py, a test file, `-m unittest`, `-c CODE`),
and each such interpreter spends about 3 CPU-s importing torch before the harness under test
runs: on the 2-core CI machine, a third of the whole run. The zygote is one interpreter per
test process that imports torch and numpy and then forks a process for each such start; the
fork becomes `python ARGS` as a fresh interpreter would: the run's environment, working
directory, stdio, session, `sys.argv`/`sys.orig_argv`/`sys.path` (the run's PYTHONPATH), a
fresh `__main__`, fresh random seeds, and nothing of the harness or the tests imported. The
harness and the code under test are imported by the run itself, as in a real interpreter;
only torch's and numpy's import is shared (what torch reads from the environment at import,
these runs never set).

It stands in only where it can be exact: a run that sets a variable Python reads at start-up
to another value than the zygote's, puts a sitecustomize on its PYTHONPATH (upstream's side of
the differential tests, the strictness faults), passes interpreter options, or asks for
anything but plain stdio and an optional new session, starts a real interpreter. So does
every run with HARNESS_TESTS_ZYGOTE=0, and every run that is not `sys.executable`.

tests/conftest.py installs it (`install`) as subprocess.Popen for the test process.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from typing import Any, Dict, List, Optional, Sequence

SWITCH_ENV = "HARNESS_TESTS_ZYGOTE"
# The environment of a run that checks what only a new interpreter shows (what is imported,
# the process's command line): it starts one.
FRESH_INTERPRETER = {SWITCH_ENV: "0"}
# What CPython reads once at start-up: a run that sets one differently needs its own interpreter.
STARTUP_VARIABLES = (
    "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONIOENCODING", "PYTHONFAULTHANDLER",
    "PYTHONDEVMODE", "PYTHONMALLOC", "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "PYTHONUTF8",
    "PYTHONOPTIMIZE", "PYTHONINSPECT", "PYTHONVERBOSE", "PYTHONTRACEMALLOC",
    "PYTHONPROFILEIMPORTTIME", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONPLATLIBDIR",
    "PYTHONEXECUTABLE", "PYTHONNODEBUGRANGES", "PYTHONINTMAXSTRDIGITS", "PYTHONUSERBASE",
    "PYTHONWARNDEFAULTENCODING", "PYTHONUNBUFFERED", "LANG", "LC_ALL", "LC_CTYPE",
)
# ...and what torch and its libraries may read when imported (in the zygote, once).
IMPORT_TIME_PREFIXES = ("TORCH", "PYTORCH", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "CUDA", "HIP_")
MESSAGE_BYTES = 1 << 20
_REAL_POPEN = subprocess.Popen


# ---- the test process's side ---------------------------------------------------------------


class _Zygote:
    """The zygote of this test process, started on first use, stopped at exit."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.address: Optional[str] = None
        self.process: Optional[subprocess.Popen] = None
        self.env: Dict[str, str] = {}

    def ensure_running(self) -> str:
        with self.lock:
            if self.address is None:
                folder = tempfile.mkdtemp(prefix="harness-tests-zygote-")
                address = os.path.join(folder, "socket")
                ready_r, ready_w = os.pipe()
                alive_r, alive_w = os.pipe()
                env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
                root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
                code = f"from tests.zygote import serve; serve({address!r}, {ready_w}, {alive_r})"
                self.process = _REAL_POPEN(
                    [sys.executable, "-c", code], cwd=root, env=env,
                    pass_fds=(ready_w, alive_r), stdin=subprocess.DEVNULL,
                )
                os.close(ready_w)
                os.close(alive_r)
                with os.fdopen(ready_r, "rb") as ready:
                    if ready.read(1) != b"1":
                        raise RuntimeError("the tests' zygote did not start")
                self.env, self.address = env, address
                atexit.register(self.stop, alive_w, folder)
            return self.address

    def stop(self, alive_w: int, folder: str) -> None:
        os.close(alive_w)  # the zygote exits at EOF (also when this process dies without this)
        if self.process is not None:
            self.process.wait()
        shutil.rmtree(folder, ignore_errors=True)

    def start(self, request: Dict[str, Any], stdio: List[int]) -> socket.socket:
        """Have the zygote fork `request`'s run with `stdio`; the connection that will carry
        its pid, then its wait status."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(self.ensure_running())
        socket.send_fds(conn, [json.dumps(request).encode()], stdio)
        return conn


_ZYGOTE = _Zygote()


def _request(argv: Sequence[Any], env: Optional[Dict[str, str]], cwd: Any,
             new_session: bool) -> Optional[Dict[str, Any]]:
    """What the zygote needs to run `argv` exactly as a new interpreter would; None when it
    cannot (see the module docstring)."""
    env = dict(os.environ if env is None else env)
    if os.environ.get(SWITCH_ENV) == "0" or env.get(SWITCH_ENV) == "0":
        return None
    args = [os.fsdecode(a) for a in argv]
    if len(args) < 2 or args[0] != sys.executable:
        return None
    if args[1] in ("-c", "-m"):
        if len(args) < 3:
            return None
    elif args[1].startswith("-"):
        return None
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    for path in paths:
        if any(os.path.exists(os.path.join(path, name))
               for name in ("sitecustomize.py", "usercustomize.py")):
            return None
    _ZYGOTE.ensure_running()
    names = {*env, *_ZYGOTE.env}
    if any(env.get(name) != _ZYGOTE.env.get(name) for name in names
           if name in STARTUP_VARIABLES or name.startswith(IMPORT_TIME_PREFIXES)):
        return None
    return {"argv": args[1:], "env": env, "cwd": os.fsdecode(cwd or os.getcwd()),
            "new_session": new_session}


class ZygotePopen(subprocess.Popen):
    """subprocess.Popen whose plain `python ...` runs come from the zygote."""

    _zygote_conn: Optional[socket.socket] = None

    def _execute_child(self, args: Any, executable: Any, preexec_fn: Any, close_fds: bool,
                       pass_fds: Any, cwd: Any, env: Any, startupinfo: Any,
                       creationflags: Any, shell: bool, p2cread: int, p2cwrite: int,
                       c2pread: int, c2pwrite: int, errread: int, errwrite: int,
                       restore_signals: bool, gid: Any, gids: Any, uid: Any, umask: int,
                       start_new_session: bool, *rest: Any) -> None:
        plain = (not shell and executable is None and preexec_fn is None and close_fds
                 and not pass_fds and gid is None and gids is None and uid is None
                 and umask < 0 and all(r is None or r == -1 for r in rest)
                 and isinstance(args, (list, tuple)))
        request = _request(args, env, cwd, start_new_session) if plain else None
        if request is None:
            super()._execute_child(  # type: ignore[misc]
                args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread,
                errwrite, restore_signals, gid, gids, uid, umask, start_new_session, *rest)
            return
        stdio = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1,
                 errwrite if errwrite != -1 else 2]
        try:
            conn = _ZYGOTE.start(request, stdio)
            self.pid = json.loads(conn.recv(MESSAGE_BYTES))["pid"]
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
        self._zygote_conn = conn
        self._child_created = True

    def _try_wait(self, wait_flags: int) -> Any:
        conn = self._zygote_conn
        if conn is None:
            return super()._try_wait(wait_flags)  # type: ignore[misc]
        conn.setblocking(not wait_flags & os.WNOHANG)
        try:
            data = conn.recv(MESSAGE_BYTES)
        except BlockingIOError:
            return (0, 0)
        conn.close()
        return (self.pid, json.loads(data)["status"])

    def _internal_poll(self, _deadstate: Any = None, **kwargs: Any) -> Optional[int]:
        if self._zygote_conn is None:
            return super()._internal_poll(_deadstate=_deadstate, **kwargs)  # type: ignore[misc]
        if self.returncode is None and self._waitpid_lock.acquire(False):
            try:
                if self.returncode is None and self._zygote_conn.fileno() != -1:
                    pid, status = self._try_wait(os.WNOHANG)
                    if pid == self.pid:
                        self._handle_exitstatus(status)  # type: ignore[attr-defined]
            finally:
                self._waitpid_lock.release()
        return self.returncode


def install() -> None:
    """Plain `python ...` starts of this process come from the zygote."""
    subprocess.Popen = ZygotePopen  # type: ignore[misc]


# ---- the zygote's side -----------------------------------------------------------------------


def serve(address: str, ready_w: int, alive_r: int) -> None:
    """The zygote: import torch, then fork a run for each request until the test process
    closes `alive_r`. A fork leaves this function only by raising SystemExit (the run's end)."""
    import numpy  # noqa: F401
    import torch  # noqa: F401

    base_path = sys.path[1:]  # without the "" of `-c`
    sig_r, sig_w = os.pipe()
    os.set_blocking(sig_w, False)
    signal.set_wakeup_fd(sig_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    waiting: Dict[int, socket.socket] = {}
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listener, \
            selectors.DefaultSelector() as selector:
        listener.bind(address)
        listener.listen(64)
        selector.register(listener, selectors.EVENT_READ)
        selector.register(alive_r, selectors.EVENT_READ)
        selector.register(sig_r, selectors.EVENT_READ)
        os.write(ready_w, b"1")
        os.close(ready_w)
        while True:
            ready = {key.fileobj for key, _ in selector.select()}
            if alive_r in ready:  # the test process is gone: so is this, and its socket
                shutil.rmtree(os.path.dirname(address), ignore_errors=True)
                return
            if sig_r in ready:
                os.read(sig_r, 4096)
                _report_exits(waiting)
            if listener in ready:
                conn, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(conn, MESSAGE_BYTES, 3)
                request = json.loads(message)
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    for fd in (sig_r, sig_w, alive_r):
                        os.close(fd)
                    for other in waiting.values():
                        other.close()
                    conn.close()
                    _become(request, fds, base_path)  # raises SystemExit
                for fd in fds:
                    os.close(fd)
                conn.send(json.dumps({"pid": pid}).encode())
                waiting[pid] = conn
                _report_exits(waiting)


def _report_exits(waiting: Dict[int, socket.socket]) -> None:
    for pid in list(waiting):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            conn = waiting.pop(pid)
            try:
                conn.send(json.dumps({"status": status}).encode())
            except OSError:  # the test process stopped waiting
                pass
            conn.close()


def _become(request: Dict[str, Any], fds: List[int], base_path: List[str]) -> None:
    """In the fork: become `python ARGV` (request) and run it; exits through SystemExit."""
    import builtins
    import importlib.machinery
    import io
    import random
    import runpy
    import traceback
    import types

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if request["new_session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    env = request["env"]
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(env)
    sys.pycache_prefix = env.get("PYTHONPYCACHEPREFIX") or None
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    encoding = sys.stdout.encoding if sys.stdout is not None else "utf-8"

    def stream(fd: int) -> Any:
        if fd == 0:
            return io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "rb", closefd=False)),
                                    encoding=encoding)
        raw = io.FileIO(fd, "wb", closefd=False)
        return io.TextIOWrapper(
            raw if unbuffered else io.BufferedWriter(raw), encoding=encoding,
            errors="backslashreplace" if fd == 2 else "strict",
            line_buffering=not unbuffered and (fd == 2 or raw.isatty()), write_through=unbuffered)

    sys.stdin, sys.stdout, sys.stderr = stream(0), stream(1), stream(2)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    for name in [n for n in sys.modules if n == "tests" or n.startswith("tests.")]:
        del sys.modules[name]
    random.seed()
    sys.modules["numpy"].random.seed()
    tempfile.tempdir = None  # gettempdir() reads the run's TMPDIR again

    argv = request["argv"]
    sys.orig_argv = [sys.executable, *argv]
    entries = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    if argv[0] == "-c":
        sys.argv, first, origin = ["-c", *argv[2:]], "", "<string>"
    elif argv[0] == "-m":
        sys.argv, first, origin = ["-m", *argv[2:]], os.getcwd(), "runpy"
    else:
        script = argv[0]
        sys.argv, origin = list(argv), os.path.abspath(script)
        first = os.path.dirname(os.path.realpath(script))
        if not os.path.isfile(script):  # the interpreter's own words and code
            print(f"{sys.executable}: can't open file {origin!r}: [Errno 2] No such file or "
                  "directory", file=sys.stderr, flush=True)
            raise SystemExit(2)
    sys.path[:] = [first, *entries, *base_path]
    sys.modules["__main__"] = main
    try:
        if argv[0] == "-c":
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        elif argv[0] == "-m":
            runpy._run_module_as_main(argv[1])  # type: ignore[attr-defined]
        else:
            with open(script, "rb") as f:
                source = f.read()
            main.__dict__.update(
                __file__=origin, __cached__=None, __spec__=None,
                __loader__=importlib.machinery.SourceFileLoader("__main__", origin))
            exec(compile(source, origin, "exec"), main.__dict__)
    except SystemExit:
        raise
    except BaseException as error:  # as the interpreter reports it: from the run's own frames
        tb = error.__traceback__
        while tb is not None and origin not in tb.tb_frame.f_code.co_filename:
            tb = tb.tb_next
        traceback.print_exception(type(error), error, tb or error.__traceback__)
        sys.stderr.flush()
        if isinstance(error, KeyboardInterrupt):
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        raise SystemExit(1) from None
    raise SystemExit(0)
