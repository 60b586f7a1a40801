"""Preloaded last in the forkserver: imports the test modules and the script that runs as
`__main__` there, and arranges the forkserver's clean exit.

See harness/process/forkserver.py for why; importing this module anywhere else does nothing
(MAIN_PATH_ENV, MODULES_ENV and RUNNER_ENV are set only while the forkserver starts).
"""

from harness.process.forkserver import clean_up_when_orphaned, load_test_code_in_forkserver

clean_up_when_orphaned()
load_test_code_in_forkserver()
