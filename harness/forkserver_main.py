"""Preloaded last in the forkserver: loads the script that runs as `__main__` there.

See harness/forkserver.py for why; importing this module anywhere else does nothing
(MAIN_PATH_ENV is set only while the forkserver starts).
"""

from harness.forkserver import load_main_script_in_forkserver

load_main_script_in_forkserver()
