"""Benchmarks of the harness: scripts run as `python benchmarks/NAME.py`; runs.py holds what
the pytest-session ones share (imported as `from benchmarks import runs`)."""
