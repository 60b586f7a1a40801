"""Upstream-side differential runs only: upstream's rank processes start from a forkserver
that has imported torch and upstream's testing modules, instead of `spawn`.

Upstream's MultiProcessTestCase spawns a fresh interpreter for every rank of every test, and
each imports torch and torch.testing._internal (about 5 s of CPU a rank on the 2-core CI
machine): that was most of the time the harness's own tests took. A rank forked from the
server starts as a spawned one does: with the modules a spawned rank imports already
imported and nothing a test or class fixture did, and with the test process's current
environment, working directory, sys.path and argv (multiprocessing sends those with every
start). Upstream's code still asks for "spawn" and sees "spawn".

The server is forked from the test process when unittest is about to run the tests (the test
module and upstream's testing modules imported, no test or class fixture run yet), instead
of being started as an interpreter that imports them all again (torch.testing._internal
costs about 5 CPU-s to import); when other threads run then, a fork could inherit a lock
held by one of them, and the server starts as an interpreter that imports PRELOAD instead.

tests/differential.py (`upstream_env`) puts this folder on PYTHONPATH and sets
HARNESS_TESTS_UPSTREAM_FORKSERVER=1 for the upstream side of a run; anywhere else this file
is never imported, and without the variable it does nothing.
"""

import os

if os.environ.get("HARNESS_TESTS_UPSTREAM_FORKSERVER") == "1":
    import multiprocessing
    import threading
    import unittest
    from multiprocessing import context, forkserver, spawn

    from harness.process import mp_forkserver

    PRELOAD = [
        "__main__", "torch", "torch.distributed",
        "torch.testing._internal.common_utils", "torch.testing._internal.common_distributed",
    ]
    preparation_data, prepare = spawn.get_preparation_data, spawn.prepare

    def get_preparation_data_with_environ(name: str) -> dict:
        """What a started process is sent, and the environment a spawned one would inherit
        (a forkserver child inherits the server's)."""
        return dict(preparation_data(name), environ=dict(os.environ))

    def prepare_with_environ(data: dict) -> None:
        if "environ" in data:
            os.environ.clear()
            os.environ.update(data["environ"])
        prepare(data)

    class SpawnFromForkServer(context.ForkServerContext):
        _name = "spawn"

    def serve(listener_fd: int, alive_r: int) -> None:
        forkserver.main(listener_fd, alive_r, [])

    run_tests = unittest.TestProgram.runTests

    def run_tests_from_forked_server(self: unittest.TestProgram) -> None:
        if threading.active_count() == 1 and mp_forkserver.can_fork():
            # with other threads: could inherit a held lock. Upstream's ranks ask for
            # multiprocessing's own server, so that is the one forked.
            mp_forkserver.fork_server(serve, mp_forkserver.PROCESS_WIDE)
        run_tests(self)

    spawn.get_preparation_data = get_preparation_data_with_environ
    spawn.prepare = prepare_with_environ
    multiprocessing.set_forkserver_preload(PRELOAD)
    context._concrete_contexts["spawn"] = SpawnFromForkServer()
    unittest.TestProgram.runTests = run_tests_from_forked_server  # type: ignore[method-assign]
