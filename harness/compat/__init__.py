"""The only modules that touch other packages' private symbols, one module each, so an
upgrade that moves one is fixed in one place: torch's, one module per concept; pytest's
(pytest_internals.py), unittest's (unittest_internals.py) and xmlrunner's
(xmlrunner_internals.py). multiprocessing's live with the forkserver
(harness/process/mp_forkserver.py)."""
