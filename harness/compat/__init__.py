"""The only modules that touch torch's private symbols, one per concept, so a torch upgrade
that moves one is fixed in one place; and pytest's (pytest_internals.py). multiprocessing's
live with the forkserver (harness/process/mp_forkserver.py)."""
