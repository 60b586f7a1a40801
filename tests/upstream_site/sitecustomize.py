"""Upstream-side differential runs only: upstream's rank processes start from a forkserver
that has imported torch and upstream's testing modules, instead of `spawn`.

Upstream's MultiProcessTestCase spawns a fresh interpreter for every rank of every test, and
each imports torch and torch.testing._internal (about 5 s of CPU a rank on the 2-core CI
machine): that was most of the time the harness's own tests took. A rank forked from the
preloaded server starts as a spawned one does: from a fresh interpreter that only imported
modules (nothing of the test process's memory), with the test process's current
environment, working directory, sys.path and argv (multiprocessing sends those with every
start). Upstream's code still asks for "spawn" and sees "spawn".

tests/differential.py (`upstream_env`) puts this folder on PYTHONPATH and sets
HARNESS_TESTS_UPSTREAM_FORKSERVER=1 for the upstream side of a run; anywhere else this file
is never imported, and without the variable it does nothing.
"""

import os

if os.environ.get("HARNESS_TESTS_UPSTREAM_FORKSERVER") == "1":
    import multiprocessing
    from multiprocessing import context, spawn

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

    spawn.get_preparation_data = get_preparation_data_with_environ
    spawn.prepare = prepare_with_environ
    multiprocessing.set_forkserver_preload(PRELOAD)
    context._concrete_contexts["spawn"] = SpawnFromForkServer()
