"""Imported by the forkserver only: loads the script that runs as `__main__` into it.

The forkserver is meant to preload `__main__` when asked to, but up to at least Python 3.12
the script's path never reaches it, so every rank would import the script again (for a
suite run as `python test_x.py`: the suite and all it imports, per rank, per test).
harness/multiprocess.py names the script in MAIN_PATH_ENV while it starts the forkserver;
importing this module there loads the script the way multiprocessing loads it in a
child, so forked ranks find it already imported.
"""

import os
from multiprocessing import spawn

MAIN_PATH_ENV = "HARNESS_FORKSERVER_MAIN"

_path = os.environ.get(MAIN_PATH_ENV)
if _path:
    try:
        spawn.import_main_path(_path)
    except Exception:  # noqa: BLE001 - each rank imports the script again and reports the error
        pass
