"""The single-process test case and what it owns: `TestCase` (testcase.py), what its
assertEqual calls equal (comparison.py), parametrization (parametrize.py), grids of subtests
(subtests.py), device-type test generation (device_type.py) and pytest's marks read without
pytest (pytest_marks.py). The multi-rank bases build on it; nothing here imports them."""
